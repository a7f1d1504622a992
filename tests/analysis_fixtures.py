"""Hand-built raw trees with known answers, in both layouts servelab reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servelab.store.jsonio import write_json, write_jsonl_gz

T0 = 1_800_000_000_000_000_000  # an epoch in ns


def servelab_point(
    exp: Path,
    sc: str,
    rep: int,
    conc: int,
    tput: float,
    ttft_ms: float,
    n: int | None = None,
    out_tokens: int = 100,
    failed: int = 0,
    position: int = 0,
    status: str = "complete",
    burst: int = 0,
    telemetry: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """n requests all sent at once, each with the given TTFT, all ending at the same instant, so
    duration = n * out_tokens / tput exactly, and TPOT = (duration - TTFT) / (out_tokens - 1).
    The last `burst` successful requests receive every token in one read at the end instead
    (TTFT = E2EL, TPOT 0), as a starved API server delivers them. `telemetry`: point.json's
    telemetry block."""
    n = n if n is not None else conc * 2
    good = n - failed
    duration_s = good * out_tokens / tput if good else 1.0
    done_us = int(round(duration_s * 1e6))
    ttft_us = int(round(ttft_ms * 1000))
    step = (done_us - ttft_us) / (out_tokens - 1)
    offsets = [ttft_us + int(round(i * step)) for i in range(out_tokens)]
    start = T0 + rep * 10**12 + conc * 10**9
    reqs = []
    for i in range(n):
        ok = i >= failed
        chunks = [done_us] * out_tokens if i >= n - burst else offsets
        reqs.append(
            {
                "request_id": f"{sc}-r{rep:02d}-c{conc:04d}-{i:05d}",
                "sent_epoch_ns": start,
                "chunk_offsets_us": chunks if ok else [],
                "done_offset_us": done_us if ok else 5,
                "prompt_tokens": 10 if ok else None,
                "output_tokens": out_tokens if ok else None,
                "ok": ok,
                "error": None if ok else "HTTP 500: boom",
                "http_status": 200 if ok else 500,
            }
        )
    d = exp / "raw" / sc / f"rep{rep:02d}" / f"c{conc:04d}"
    write_jsonl_gz(d / "requests.jsonl.gz", reqs)
    point = {
        "format_version": 1,
        "status": status,
        "server_config": sc,
        "repeat": rep,
        "concurrency": conc,
        "position": position,
        "kind": "measured",
        "num_prompts": n,
        "client_cpu_s": 0.5,
        "started_epoch_ns": start,
        "finished_epoch_ns": start + done_us * 1000,
        "completed": good,
        "failed": failed,
        "duration": duration_s,
    }
    if telemetry is not None:
        point["telemetry"] = telemetry
    write_json(d / "point.json", point)
    return point


def servelab_tree(
    exp: Path,
    spec: dict[str, dict[int, list[tuple[float, float]]]],
    capacity: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """spec: {server_config: {concurrency: [(throughput, ttft_ms) per repeat]}}."""
    for sc, levels in spec.items():
        for conc, reps in levels.items():
            for r, (tput, ttft) in enumerate(reps, 1):
                servelab_point(exp, sc, r, conc, tput, ttft)
    for sc, cap in (capacity or {}).items():
        write_json(exp / "server" / sc / "capacity.json", cap)
    return exp


def vllm_bench_tree(
    root: Path,
    spec: dict[int, list[tuple[float, float]]],
    with_latencies: bool = True,
    out_tokens: int = 50,
    server_log: str | None = None,
) -> Path:
    """rep_<NN>/concurrency_<CCC>/benchmark.json, as `vllm bench serve --save-detailed` writes."""
    for conc, reps in spec.items():
        for r, (tput, ttft_ms) in enumerate(reps, 1):
            n = conc * 2
            duration = n * out_tokens / tput
            ttft = ttft_ms / 1000
            gap = (duration - ttft) / (out_tokens - 1)
            bench: dict[str, Any] = {
                "duration": duration,
                "completed": n,
                "failed": 0,
                "num_prompts": n,
                "max_concurrency": conc,
                "input_lens": [10] * n,
                "output_lens": [out_tokens] * n,
                "ttfts": [ttft] * n,
                "itls": [[gap] * (out_tokens - 1) for _ in range(n)],
                "start_times": [0.0] * n,
                "errors": [""] * n,
            }
            if with_latencies:
                bench["latencies"] = [duration] * n
            d = root / f"rep_{r:02d}" / f"concurrency_{conc:03d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / "benchmark.json").write_text(json.dumps(bench))
    if server_log is not None:
        (root / "server.log").write_text(server_log)
    return root


BENCH_T0 = 5000.0  # vllm bench's perf_counter at the start of a run (s)


def vllm_bench_rate_point(
    rate: float,
    ttft_ms: float,
    e2el_ms: float,
    n: int = 40,
    out_tokens: int = 8,
    lag_ms: float = 0.0,
    cap: int | None = None,
) -> dict[str, Any]:
    """One benchmark.json of `vllm bench serve --request-rate R --save-detailed`, as a recent
    vLLM writes it: request i of n released at (i + 1) / R s after the start (vLLM's schedule,
    scaled so the last is due at n / R; here constant gaps), each `lag_ms` later than the one
    before (a client falling behind); with a `cap` (--max-concurrency) a request waits for a
    free slot (queue_times) before its send (start_times). Every request: `ttft_ms`, then
    `out_tokens` evenly to `e2el_ms`. Known answers: TTFT and E2EL as given, output throughput
    n * out_tokens / duration, duration from the start to the last end."""
    e2el, ttft = e2el_ms / 1000, ttft_ms / 1000
    gap = (e2el - ttft) / (out_tokens - 1)
    sends, queued, ends = [], [], []
    for i in range(n):
        release = BENCH_T0 + (i + 1) / rate + i * lag_ms / 1000
        busy = sorted(e for e in ends if e > release)
        send = release if cap is None or len(busy) < cap else busy[len(busy) - cap]
        sends.append(send)
        queued.append(send - release)
        ends.append(send + e2el)
    return {
        "date": "20260901-120000",
        "backend": "openai",
        "model_id": "Qwen/Qwen2.5-0.5B-Instruct",
        "num_prompts": n,
        "request_rate": rate,
        "burstiness": 1.0,
        "max_concurrency": cap,
        "duration": max(ends) - BENCH_T0,
        "completed": n,
        "failed": 0,
        "input_lens": [10] * n,
        "output_lens": [out_tokens] * n,
        "ttfts": [ttft] * n,
        "itls": [[gap] * (out_tokens - 1) for _ in range(n)],
        "latencies": [e2el] * n,
        "start_times": sends,
        "queue_times": queued,
        "errors": [""] * n,
    }


def vllm_bench_rate_tree(
    root: Path,
    spec: dict[float, list[tuple[float, float]]],
    folder: str = "rate_{rate:g}",
    **point: Any,
) -> Path:
    """rep_<NN>/rate_<R>/benchmark.json, runs of `vllm bench serve --request-rate R
    --save-result --save-detailed`. spec: {rate: [(ttft_ms, e2el_ms) per repeat]}; `point`:
    vllm_bench_rate_point's other arguments."""
    for rate, reps in spec.items():
        for r, (ttft_ms, e2el_ms) in enumerate(reps, 1):
            bench = vllm_bench_rate_point(rate, ttft_ms, e2el_ms, **point)
            d = root / f"rep_{r:02d}" / folder.format(rate=rate)
            d.mkdir(parents=True, exist_ok=True)
            (d / "benchmark.json").write_text(json.dumps(bench))
    return root


# The published A100 study: C128 beats C256 by ~4.7% in 3 of 3 repeats, CVs under 0.4%,
# and C256 is worse on TTFT too.
KNEE_SPEC = {
    64: [(4240.0, 300.0), (4255.0, 310.0), (4272.0, 305.0)],
    128: [(4990.0, 420.0), (5005.0, 418.0), (4994.0, 421.0)],
    256: [(4772.0, 746.0), (4780.0, 750.0), (4769.0, 744.0)],
}


# The published V100 study (seed 000): one measurement per concurrency. Under --max-num-seqs 1
# throughput is 45.5 tok/s at every level; under 12, concurrency 2 gives 1.66x, concurrency 3
# falls back to 47.8 (a batch outside the fork's CUDA graphs, captured for batch sizes 1 and 2
# only), and the curve passes concurrency 2 again by 6. Values: (tok/s, TTFT ms).
V100_MNS1 = {c: [(45.5, 700.0 * c)] for c in (1, 2, 4, 8)}
V100_MNS12 = {
    1: [(45.5, 600.0)],
    2: [(45.5 * 1.66, 900.0)],
    3: [(47.8, 1800.0)],
    4: [(66.0, 2000.0)],
    6: [(98.0, 2600.0)],
    8: [(124.0, 3000.0)],
    12: [(156.1, 3500.0)],
}


def v100_server_log(max_num_seqs: int, capture_sizes: list[int]) -> str:
    """A startup log in vLLM's own format (tests/fixtures/vllm-capture-sizes/ has the recorded
    lines it follows): the non-default arguments, the engine's configuration with its
    compilation config, and the KV cache lines of the published V100 run."""
    pre = "(EngineCore pid=212) INFO 05-21 21:03:20"
    return (
        "(APIServer pid=1) INFO 05-21 21:03:01 [utils.py:253] non-default args: "
        "{'model': 'Qwen/Qwen3.6-27B-AWQ', 'max_model_len': 32768, "
        f"'tensor_parallel_size': 2, 'max_num_seqs': {max_num_seqs}}}\n"
        f"{pre} [core.py:109] Initializing a V1 LLM engine (v0.10.1) with config: "
        "model='Qwen/Qwen3.6-27B-AWQ', quantization=awq, enforce_eager=False, "
        "device_config=cuda, compilation_config={'mode': <CompilationMode.VLLM_COMPILE: 3>, "
        "'compile_sizes': [], 'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, "
        f"'cudagraph_num_of_warmups': 1, 'cudagraph_capture_sizes': {capture_sizes!r}, "
        f"'cudagraph_copy_inputs': False, 'max_cudagraph_capture_size': {max(capture_sizes)}}}, "
        "kernel_config=KernelConfig(moe_backend='auto')\n"
        f"{pre} [kv_cache_utils.py:1708] GPU KV cache size: 422,707 tokens\n"
        f"{pre} [kv_cache_utils.py:1709] Maximum concurrency for 32,768 tokens per request: "
        "12.90x\n"
    )
