"""The measurement pitfalls of serving benchmarks (docs/pitfalls.md): each check trips on
constructed requests that make the mistake and passes on ones that do not."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from analysis_fixtures import servelab_point

from servelab.analysis.dataset import load_dataset
from servelab.analysis.pipeline import analyze
from servelab.analysis.validity import (
    CHECKS,
    FAILED,
    NOT_CHECKED,
    NOTED,
    PASSED,
    Flag,
    PointFacts,
    RequestFacts,
    check_point,
    evaluate,
    tokens_per_chunk_allowed,
)
from servelab.client import RequestRecord
from servelab.config import default_section
from servelab.experiment import AnalysisSection, ValiditySection
from servelab.metrics import point_metrics, request_latencies
from servelab.store.jsonio import read_jsonl_gz, write_json, write_jsonl_gz

T = default_section(ValiditySection, "analysis", "validity")
T0 = 1_800_000_000_000_000_000


def by_check(flags: tuple[Flag, ...]) -> dict[str, Flag]:
    return {f.check: f for f in flags}


def req(
    tokens: int = 8,
    chunk_tokens: tuple[int, ...] | None = None,
    empty: tuple[int, ...] | None = (),
    prompt: int | None = 128,
    queued_us: int | None = 100,
    cached: int | None = None,
    chunks: int | None = None,
) -> RequestFacts:
    n = chunks if chunks is not None else (len(chunk_tokens) if chunk_tokens else tokens)
    return RequestFacts(
        completed=True,
        output_tokens=tokens,
        reads=n,
        error=None,
        prompt_tokens=prompt,
        chunks=n,
        chunk_tokens=chunk_tokens if chunk_tokens is not None else (1,) * n,
        empty_chunks=empty,
        queued_us=queued_us,
        cached_tokens=cached,
        e2el_us=500_000,
    )


def server_telemetry(**server: Any) -> dict[str, Any]:
    return {
        "format_version": 1,
        "gpu": {"absent": "no GPU"},
        "cpu": {"absent": "not sampled here"},
        "server": {"samples": 4, "preemptions": 0.0, **server},
    }


def facts(reqs: list[RequestFacts], **kw: Any) -> PointFacts:
    base: dict[str, Any] = {
        "concurrency": 4,
        "input_tokens": 128,
        "output_tokens": 8,
        "ignore_eos": True,
        "achieved_concurrency": 3.98,
        "client_cpu_s": 0.1,
        "window_s": 2.0,
    }
    base.update(kw)
    tel = base.pop("telemetry", None)
    return PointFacts(tuple(reqs), 2.0, tel, **base)


def run(f: PointFacts, t: ValiditySection = T) -> dict[str, Flag]:
    return by_check(evaluate(f, t))


def test_every_pitfall_check_passes_on_a_clean_point() -> None:
    tel = server_telemetry(
        generation_tokens=32.0,
        prompt_tokens=512.0,
        prefix_cache_queries=512.0,
        prefix_cache_hits=0.0,
        requests_finished=4.0,
    )
    f = run(facts([req() for _ in range(4)], telemetry=tel))
    for name in (
        "chunk_tokens",
        "first_token",
        "prefix_cache",
        "prompt_length",
        "output_length",
        "achieved_concurrency",
        "client_cpu",
        "client_wait",
        "leftover_requests",
        "server_counts",
        "failed_requests",
    ):
        assert f[name].status == PASSED, f[name]
    assert f["chunk_tokens"].reason == "0 of 32 chunks carried more than 1 token"
    assert f["server_counts"].value == 0.0


# 1. chunks are not tokens


def test_merged_chunks_trip_chunk_tokens_and_remove_only_itl() -> None:
    merged = req(tokens=8, chunk_tokens=(1, 3, 1, 3))  # 2 of 4 chunks carried 3 tokens
    f = run(facts([merged] + [req() for _ in range(3)]))
    c = f["chunk_tokens"]
    assert c.status == FAILED and c.value == pytest.approx(2 / 28)
    assert c.reason == "2 of 28 chunks carried more than 1 token (limit 5%)"
    check = next(k for k in CHECKS if k.name == "chunk_tokens")
    assert check.removes("p99_itl_ms") and not check.removes("mean_ttft_ms")
    assert not check.removes("mean_tpot_ms") and not check.removes("output_throughput")


def test_speculative_decoding_allows_several_tokens_per_chunk() -> None:
    args = {"speculative-config": json.dumps({"method": "ngram", "num_speculative_tokens": 3})}
    assert tokens_per_chunk_allowed(args) == 4
    assert tokens_per_chunk_allowed({"num-speculative-tokens": 2}) == 3
    assert tokens_per_chunk_allowed({"max-num-seqs": 8}) == 1
    spec = req(tokens=8, chunk_tokens=(4, 1, 3))
    assert run(facts([spec], server_args=args))["chunk_tokens"].status == PASSED
    assert run(facts([spec]))["chunk_tokens"].status == FAILED


def test_chunk_counts_that_do_not_add_up_fail() -> None:
    bad = req(tokens=8, chunk_tokens=(1,) * 7, chunks=7)  # 7 tokens in chunks, usage says 8
    c = run(facts([bad]))["chunk_tokens"]
    assert c.status == FAILED and "do not add up to their usage" in c.reason


def test_without_per_chunk_usage_the_totals_decide() -> None:
    old = RequestFacts(True, 64, 60, None, prompt_tokens=128, chunks=60)  # 64 tokens, 60 chunks
    c = run(facts([old]))["chunk_tokens"]
    assert c.status == FAILED and c.value == pytest.approx(4 / 60)
    assert "judged from usage totals" in c.reason
    fine = RequestFacts(True, 64, 64, None, prompt_tokens=128, chunks=64)
    assert run(facts([fine]))["chunk_tokens"].status == PASSED


# 2. what counts as the first token


def test_first_token_notes_a_role_only_first_chunk_and_fails_an_outputless_request() -> None:
    role_only = req(tokens=8, chunk_tokens=(0,) + (1,) * 8, empty=(0,))  # no text, no token
    f = run(facts([role_only, req()]))["first_token"]
    assert f.status == NOTED and f.value == 1.0
    assert "their TTFT is the first chunk that did" in f.reason
    # a first chunk without text that still carried a token (text held back, a special
    # token) is the token's arrival: nothing to note
    held_back = req(tokens=8, empty=(0,))
    assert run(facts([held_back]))["first_token"].status == PASSED
    # no text anywhere and no per-chunk token counts: TTFT is undefined
    blank = RequestFacts(True, 2, 2, None, prompt_tokens=128, chunks=2, empty_chunks=(0, 1))
    g = run(facts([blank, req()]))["first_token"]
    assert g.status == FAILED and "TTFT undefined" in g.reason
    check = next(k for k in CHECKS if k.name == "first_token")
    assert check.removes("mean_ttft_ms") and not check.removes("mean_itl_ms")
    unknown = req(empty=None)
    assert run(facts([unknown]))["first_token"].status == NOT_CHECKED


def test_ttft_skips_a_chunk_without_output_not_one_without_text() -> None:
    base: dict[str, Any] = {
        "request_id": "x",
        "sent_epoch_ns": T0,
        "chunk_offsets_us": [1000, 2000, 3000],
        "done_offset_us": 3100,
        "prompt_tokens": 128,
        "output_tokens": 2,
        "ok": True,
    }
    role_only = RequestRecord(**base, chunk_tokens=[0, 1, 1], empty_chunks=[0])
    assert request_latencies(role_only)["ttft"] == 2.0
    held_back = RequestRecord(
        **{**base, "output_tokens": 3}, chunk_tokens=[1, 1, 1], empty_chunks=[0]
    )
    assert request_latencies(held_back)["ttft"] == 1.0
    no_counts = RequestRecord(**base, empty_chunks=[0])
    assert request_latencies(no_counts)["ttft"] == 2.0


# 3. prefix-cache contamination


def test_prefix_cache_hits_fail_unless_caching_was_asked_for() -> None:
    hot = server_telemetry(prefix_cache_queries=512.0, prefix_cache_hits=256.0)
    f = run(facts([req()], telemetry=hot))["prefix_cache"]
    assert f.status == FAILED and f.value == 0.5
    assert "did not ask for caching" in f.reason
    asked = run(facts([req()], telemetry=hot, server_args={"enable-prefix-caching": True}))
    assert asked["prefix_cache"].status == NOTED
    cold = server_telemetry(prefix_cache_queries=512.0, prefix_cache_hits=0.0)
    assert run(facts([req()], telemetry=cold))["prefix_cache"].status == PASSED


def test_prefix_cache_from_per_request_cached_tokens() -> None:
    f = run(facts([req(cached=128), req(cached=0)]))["prefix_cache"]
    assert f.status == FAILED and f.value == 0.5 and "per-request cached tokens" in f.reason
    assert run(facts([req()]))["prefix_cache"].status == NOT_CHECKED


# 4 and 5. prompt- and output-length drift


def test_prompt_length_drift() -> None:
    drifted = [req(prompt=128), req(prompt=143)]
    f = run(facts(drifted))["prompt_length"]
    assert f.status == FAILED and f.value == pytest.approx(100 * 15 / 128)
    assert f.reason == "1 of 2 requests: prompts of 128-143 tokens for 128 requested (limit 5%)"
    bos = [req(prompt=129), req(prompt=129)]  # a BOS token the server adds
    assert run(facts(bos))["prompt_length"].status == PASSED
    assert run(facts(bos, input_tokens=None))["prompt_length"].status == NOT_CHECKED


def test_output_length_drift_only_when_the_workload_fixes_it() -> None:
    short = [req(tokens=8), req(tokens=5)]
    f = run(facts(short))["output_length"]
    assert f.status == FAILED and f.reason.startswith("1 of 2 requests: outputs of 5-8 tokens")
    assert run(facts(short, ignore_eos=False))["output_length"].status == NOT_CHECKED
    assert run(facts([req(tokens=8)]))["output_length"].status == PASSED


# 6 and 7. client bottleneck and queueing in the client


def test_achieved_concurrency_short_of_the_requested() -> None:
    f = run(facts([req()], concurrency=8, achieved_concurrency=5.1))["achieved_concurrency"]
    assert f.status == FAILED and f.value == pytest.approx(5.1 / 8)
    assert f.reason.startswith("5.10 requests in flight on average while sending, for 8")
    ok = run(facts([req()], concurrency=8, achieved_concurrency=7.95))
    assert ok["achieved_concurrency"].status == PASSED
    once = run(facts([req()], achieved_concurrency=None))
    assert once["achieved_concurrency"].status == NOT_CHECKED


def test_cpu_bound_client() -> None:
    busy = {"cpu": {"client_cpu_pct": {"mean": 97.0, "p95": 99.0, "max": 100.0}}}
    f = run(facts([req()], telemetry=busy))["client_cpu"]
    assert f.status == FAILED and f.value == pytest.approx(0.97)
    assert run(facts([req()], client_cpu_s=1.9, window_s=2.0))["client_cpu"].status == FAILED
    assert run(facts([req()], client_cpu_s=0.2, window_s=2.0))["client_cpu"].status == PASSED


def test_client_wait_relative_to_the_latency() -> None:
    # requests of 100 ms that waited 12.5 ms in the client on average: 12.5%
    slow = [
        replace(req(queued_us=12_000), e2el_us=100_000),
        replace(req(queued_us=13_000), e2el_us=100_000),
    ]
    f = run(facts(slow))["client_wait"]
    assert f.status == FAILED and f.value == pytest.approx(12.5)
    assert f.reason.startswith("requests waited 12.5 ms on average (longest 13 ms)")
    # the same wait on requests of 2 s is 0.6% of what a user saw: passes
    long = [replace(r, e2el_us=2_000_000) for r in slow]
    assert run(facts(long))["client_wait"].status == PASSED
    assert run(facts([req(queued_us=None)]))["client_wait"].status == NOT_CHECKED


# 8. warm-up leaking into the measurement; 10. client and server disagree


def test_requests_from_before_the_point_finishing_inside_it() -> None:
    leak = server_telemetry(requests_finished=7.0)
    f = run(facts([req() for _ in range(4)], telemetry=leak))["leftover_requests"]
    assert f.status == FAILED and f.value == 3.0
    assert f.reason.endswith("3 from before the point (warm-up or an earlier point)")
    late_warmup = run(facts([req()], warmup_overlap_ns=2_500_000))["leftover_requests"]
    assert late_warmup.status == FAILED and "2.5 ms after the point began" in late_warmup.reason
    assert run(facts([req()]))["leftover_requests"].status == NOT_CHECKED
    missing = server_telemetry(requests_finished=3.0)
    m = run(facts([req() for _ in range(4)], telemetry=missing))["leftover_requests"]
    assert m.status == FAILED and m.reason.endswith("the server's counter misses 1")


def test_server_and_client_token_counts() -> None:
    tel = server_telemetry(generation_tokens=16.0, prompt_tokens=512.0)
    f = run(facts([req() for _ in range(4)], telemetry=tel))["server_counts"]
    assert f.status == FAILED and f.value == pytest.approx(50.0)
    assert f.reason.startswith("output tokens: server 16, client 32; prompt tokens: server 512")


# 9. failed or empty requests in the statistics


def test_an_empty_request_is_a_failure_never_a_zero_in_the_statistics() -> None:
    """A request that ended with [DONE] and usage but no content chunk (as a server that sends
    nothing can) would read TTFT 0 if averaged in."""
    good = [record(i, T0 + i * 10**6, 10_000) for i in range(3)]
    empty = record(3, T0 + 3 * 10**6, 10_000, chunk_offsets_us=[], output_tokens=0, ok=True)
    m = point_metrics([*good, empty])
    assert m["completed"] == 3 and m["failed"] == 1
    assert m["mean_ttft_ms"] == 1.0 and m["n_ttft"] == 3  # 3 values: too few for a median
    f = by_check(check_point([*good, empty], meta(1, good), T))["failed_requests"]
    assert f.status == FAILED
    assert f.reason == "1 of 4 requests failed (limit 0; first: no content received)"
    clean = by_check(check_point(good, meta(1, good), T))["failed_requests"]
    assert clean.status == PASSED


# the recorded layout: records, point.json, launch args and the warm-up


def record(i: int, sent_ns: int, done_us: int, **kw: Any) -> RequestRecord:
    offs = [1000 + k * 1000 for k in range(8)]
    base: dict[str, Any] = {
        "request_id": f"x-{i:05d}",
        "sent_epoch_ns": sent_ns,
        "chunk_offsets_us": offs,
        "done_offset_us": done_us,
        "prompt_tokens": 128,
        "output_tokens": 8,
        "ok": True,
        "http_status": 200,
        "first_byte_offset_us": 500,
        "chunk_tokens": [1] * 8,
        "empty_chunks": [],
        "queued_us": 50,
    }
    base.update(kw)
    return RequestRecord(**base)


def closed_loop(conc: int, waves: int, gap_us: int = 50) -> list[RequestRecord]:
    """Every slot sends its next request `gap_us` after the previous one ends (10 ms each)."""
    out = []
    for slot in range(conc):
        t = T0 + slot * 1000
        for w in range(waves):
            out.append(record(slot * waves + w, t, 10_000, queued_us=gap_us))
            t += (10_000 + gap_us) * 1000
    return out


def meta(conc: int, recs: list[RequestRecord], **kw: Any) -> dict[str, Any]:
    return {
        "format_version": 1,
        "status": "complete",
        "server_config": "x",
        "repeat": 1,
        "concurrency": conc,
        "launch": 1,
        "input_tokens": 128,
        "output_tokens": 8,
        "ignore_eos": True,
        "started_epoch_ns": min(r.sent_epoch_ns for r in recs),
        "finished_epoch_ns": max(r.sent_epoch_ns for r in recs) + 10_000_000,
        "client_cpu_s": 0.01,
        **kw,
    }


def test_recorded_closed_loop_passes_and_a_lagging_client_fails() -> None:
    recs = closed_loop(4, 4)
    f = by_check(check_point(recs, meta(4, recs), T, {"max-num-seqs": 8}, None))
    for name in ("achieved_concurrency", "client_wait", "chunk_tokens", "first_token"):
        assert f[name].status == PASSED, f[name]
    assert f["achieved_concurrency"].value == pytest.approx(1.0, abs=0.01)
    lag = closed_loop(4, 4, gap_us=8_000)  # 8 ms between a slot's end and its next send
    g = by_check(check_point(lag, meta(4, lag), T))
    assert g["achieved_concurrency"].status == FAILED
    # 8 ms waits on 10 ms requests: 80% of what a user saw
    assert g["client_wait"].status == FAILED and g["client_wait"].value == pytest.approx(80.0)


def test_warmup_of_the_same_launch_must_end_before_the_point() -> None:
    recs = closed_loop(2, 2)
    first = min(r.sent_epoch_ns for r in recs)
    warm = {"kind": "warmup", "launch": 1, "finished_epoch_ns": first + 3_000_000}
    f = by_check(check_point(recs, meta(2, recs), T, None, warm))["leftover_requests"]
    assert f.status == FAILED and "3.0 ms after the point began" in f.reason
    other_launch = {**warm, "launch": 2}
    g = by_check(check_point(recs, meta(2, recs), T, None, other_launch))
    assert g["leftover_requests"].status == NOT_CHECKED  # no telemetry, no overlap to judge
    before = {**warm, "finished_epoch_ns": first - 1}
    h = by_check(check_point(recs, meta(2, recs), T, None, before))
    assert h["leftover_requests"].status == NOT_CHECKED


def test_old_raw_data_leaves_the_new_checks_not_checked(fixtures: Path) -> None:
    """Requests recorded before these fields existed: the checks that need them say so."""
    d = fixtures / "validity" / "raw" / "max-num-seqs-1" / "rep01" / "c0001"
    recs = [RequestRecord.from_json(r) for r in read_jsonl_gz(d / "requests.jsonl.gz")]
    assert recs[0].chunk_tokens is None and recs[0].queued_us is None
    point = json.loads((d / "point.json").read_text())
    f = by_check(check_point(recs, point, T))
    assert f["first_token"].status == NOT_CHECKED
    assert f["client_wait"].status == NOT_CHECKED
    assert f["output_length"].status == NOT_CHECKED  # ignore_eos not recorded then
    assert (
        f["chunk_tokens"].status == PASSED
        and "judged from usage totals" in f["chunk_tokens"].reason
    )
    assert f["prompt_length"].status == PASSED


def test_an_itl_only_flag_keeps_ttft_and_throughput_in_the_tables(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    for rep in (1, 2, 3):
        servelab_point(exp, "x", rep, 2, 10.0 + rep, 20.0, n=4, out_tokens=10)
    # rep 2: one request's tokens came two per chunk (5 chunks for 10 tokens)
    d = exp / "raw" / "x" / "rep02" / "c0002"
    rows = list(read_jsonl_gz(d / "requests.jsonl.gz"))
    rows[0]["chunk_offsets_us"] = rows[0]["chunk_offsets_us"][::2]
    rows[0]["chunk_tokens"] = [2] * 5
    write_jsonl_gz(d / "requests.jsonl.gz", rows)
    ds = load_dataset(exp)
    p2 = next(p for p in ds.points if p.repeat == 2)
    assert [f.check for f in p2.checks if f.status == FAILED] == ["chunk_tokens"]
    assert p2.left_out("mean_itl_ms") and not p2.left_out("mean_ttft_ms")
    res = analyze(
        exp, tmp_path / "out", default_section(AnalysisSection, "analysis"), figures=False
    )
    n = {r["metric"]: r["n"] for r in res.summary}
    assert n["mean_itl_ms"] == 2 and n["mean_ttft_ms"] == 3 and n["output_throughput"] == 3


def test_launch_args_reach_the_checks(tmp_path: Path) -> None:
    """launch.json's args decide whether prefix-cache hits are a failure or a note."""
    exp = tmp_path / "exp"
    hot = server_telemetry(prefix_cache_queries=40.0, prefix_cache_hits=20.0)
    for rep in (1, 2):
        servelab_point(exp, "x", rep, 1, 100.0, 20.0, n=4, telemetry=hot)
    assert all(
        next(f for f in p.checks if f.check == "prefix_cache").status == FAILED
        for p in load_dataset(exp).points
    )
    write_json(exp / "server" / "x" / "launch.json", {"args": {"enable-prefix-caching": True}})
    assert all(
        next(f for f in p.checks if f.check == "prefix_cache").status == NOTED
        for p in load_dataset(exp).points
    )
