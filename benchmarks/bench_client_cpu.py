"""The client's own CPU per token, without vLLM: the response parser alone, and the whole
client against sse_fixture.py.

    python benchmarks/bench_client_cpu.py [--rounds 3] [--json]

Part 1 feeds `ResponseParser` a response of 20,000 vLLM-shaped chunks (usage in each, as the
client asks with `continuous_usage_stats`), each its own HTTP chunk, 1 and 4 chunks per read,
and reports µs per chunk (best of --rounds). It also feeds one event of 1,000 and of 4,000 data
lines whose blank line never comes, a line per read, and reports µs per line. Part 2 runs one
closed-loop point (`run_point`, concurrency 64, 48,000 tokens) against sse_fixture.py at 2 ms
steps, the fixture pinned to the last core and this process to core 0, and reports client CPU
µs per token (median of --rounds). Only servelab's public client API is used, so the same
script measures another checkout of servelab when that checkout's `src` comes first on
PYTHONPATH; benchmarks/README.md compares two checkouts that way, alternating runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from _common import start_fixture

import servelab.client
from servelab.client import RequestRecord, RequestSettings, ResponseParser, run_point
from servelab.launch.ports import free_port

CHUNKS = 20_000
HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


def vllm_chunk(i: int) -> bytes:
    """A content chunk as vLLM 0.32 streams it with continuous usage stats (about 260 B)."""
    return (
        b'data: {"id":"cmpl-0123456789abcdef","object":"text_completion","created":1764547200,'
        b'"model":"servelab-tiny","choices":[{"index":0,"text":" tok","logprobs":null,'
        b'"finish_reason":null,"stop_reason":null}],"usage":{"prompt_tokens":128,'
        b'"total_tokens":%d,"completion_tokens":%d}}\n\n' % (128 + i, i)
    )


def parser_us_per_chunk(per_read: int, rounds: int) -> float:
    framed = [b"%x\r\n%s\r\n" % (len(ev), ev) for ev in map(vllm_chunk, range(1, CHUNKS + 1))]
    reads = [b"".join(framed[i : i + per_read]) for i in range(0, CHUNKS, per_read)]
    tail = b'data: {"choices":[],"usage":{"prompt_tokens":128,"completion_tokens":%d}}\n\n' % (
        CHUNKS
    )
    tail += b"data: [DONE]\n\n"
    last = b"%x\r\n%s\r\n0\r\n\r\n" % (len(tail), tail)
    best = float("inf")
    for _ in range(rounds):
        rec = RequestRecord("r", 0)
        p = ResponseParser(rec, 0)
        p.feed(HEAD, 1)
        t = time.perf_counter()
        for n, data in enumerate(reads):
            p.feed(data, n)
        elapsed = time.perf_counter() - t
        p.feed(last, len(reads))
        if not rec.ok or len(rec.chunk_offsets_us) != CHUNKS:
            sys.exit(f"parser benchmark: the response was not read ({rec.error})")
        best = min(best, elapsed)
    return best / CHUNKS * 1e6


def unended_us_per_line(lines: int, rounds: int) -> float:
    """One event of `lines` data lines whose blank line comes last, each line its own read:
    what a server that holds an event open costs the reader, per line (best of `rounds`)."""
    line = b"data: " + b"x" * 100 + b"\n"
    read = b"%x\r\n%s\r\n" % (len(line), line)
    best = float("inf")
    for _ in range(rounds):
        p = ResponseParser(RequestRecord("r", 0), 0)
        p.feed(HEAD, 1)
        t = time.perf_counter()
        for n in range(lines):
            p.feed(read, n)
        best = min(best, time.perf_counter() - t)
    return best / lines * 1e6


def client_us_per_token(rounds: int, concurrency: int = 64, tokens: int = 48_000) -> list[float]:
    cpus = os.cpu_count() or 1
    port = free_port()
    fx = start_fixture(port, 2000, cpus - 1)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    per_request = tokens // (2 * concurrency)  # two waves
    out = []
    try:
        base = f"http://127.0.0.1:{port}"
        run_point(
            RequestSettings(base_url=base, model="fixture", max_tokens=16), ["x"] * 8, 8, "warm"
        )
        for r in range(rounds):
            w = RequestSettings(base_url=base, model="fixture", max_tokens=per_request)
            pr = run_point(w, ["x"] * (2 * concurrency), concurrency, f"b{r}")
            got = sum(len(x.chunk_offsets_us) for x in pr.records if x.ok)
            if got != per_request * 2 * concurrency:
                sys.exit(f"client benchmark: {got} tokens read, expected {tokens}")
            out.append(pr.client_cpu_s / got * 1e6)
    finally:
        fx.terminate()
        fx.wait()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="one JSON line instead of text")
    a = ap.parse_args()
    res = {
        "servelab": str(Path(servelab.client.__file__).resolve().parents[2]),
        "parser_us_per_chunk_1_per_read": parser_us_per_chunk(1, a.rounds),
        "parser_us_per_chunk_4_per_read": parser_us_per_chunk(4, a.rounds),
        "unended_us_per_line_1000": unended_us_per_line(1000, a.rounds),
        "unended_us_per_line_4000": unended_us_per_line(4000, a.rounds),
        "client_us_per_token": client_us_per_token(a.rounds),
    }
    if a.json:
        print(json.dumps(res, sort_keys=True))
        return
    print(f"servelab from {res['servelab']}")
    print(f"parser, 1 chunk per read:  {res['parser_us_per_chunk_1_per_read']:.2f} µs per chunk")
    print(f"parser, 4 chunks per read: {res['parser_us_per_chunk_4_per_read']:.2f} µs per chunk")
    print(
        f"one event held open, 1,000 / 4,000 data lines: "
        f"{res['unended_us_per_line_1000']:.2f} / {res['unended_us_per_line_4000']:.2f} µs per line"
    )
    runs = res["client_us_per_token"]
    assert isinstance(runs, list)
    print(
        f"whole client vs sse_fixture (2 ms steps, concurrency 64): median "
        f"{statistics.median(runs):.2f} µs CPU per token (runs: "
        + ", ".join(f"{x:.2f}" for x in runs)
        + ")"
    )


if __name__ == "__main__":
    main()
