"""The validity checks on workloads beyond one exact length: each request judged against the
lengths it asked for, shared prefixes the prefix cache is meant to serve, and chat turns whose
slots sit idle while the user thinks."""

from __future__ import annotations

from typing import Any

import pytest

from servelab.analysis.validity import (
    FAILED,
    NOT_CHECKED,
    NOTED,
    PASSED,
    Flag,
    PointFacts,
    RequestFacts,
    check_point,
    evaluate,
    facts_from_records,
)
from servelab.client import RequestRecord
from servelab.config import default_section
from servelab.experiment import ValiditySection

T = default_section(ValiditySection, "analysis", "validity")
T0 = 1_800_000_000_000_000_000
CACHING = {"enable-prefix-caching": True}


def req(
    prompt: int = 128, out: int = 8, asked_in: int | None = None, asked_out: int | None = None
) -> RequestFacts:
    return RequestFacts(
        completed=True,
        output_tokens=out,
        reads=out,
        error=None,
        prompt_tokens=prompt,
        chunks=out,
        chunk_tokens=(1,) * out,
        empty_chunks=(),
        queued_us=100,
        e2el_us=500_000,
        asked_input_tokens=asked_in,
        asked_output_tokens=asked_out,
    )


def facts(reqs: list[RequestFacts], **kw: Any) -> PointFacts:
    base: dict[str, Any] = {
        "concurrency": 4,
        "input_tokens": None,  # a distribution in point.json: no one length for the point
        "output_tokens": None,
        "ignore_eos": True,
        "achieved_concurrency": 3.98,
        "client_cpu_s": 0.1,
        "window_s": 2.0,
    }
    base.update(kw)
    tel = base.pop("telemetry", None)
    return PointFacts(tuple(reqs), 2.0, tel, **base)


def run(f: PointFacts) -> dict[str, Flag]:
    return {flag.check: flag for flag in evaluate(f, T)}


def hits(queries: float, hit: float) -> dict[str, Any]:
    return {"server": {"samples": 4, "prefix_cache_queries": queries, "prefix_cache_hits": hit}}


# prompt and output lengths, request by request


def test_every_request_is_judged_against_its_own_prompt_length() -> None:
    ok = [req(101, asked_in=100), req(20, asked_in=20), req(51, asked_in=50)]
    f = run(facts(ok))["prompt_length"]
    assert f.status == PASSED and f.value == pytest.approx(2.0)
    assert f.reason == (
        "3 requests: prompts of 20-101 tokens, each within 5% of its requested length "
        "(the worst 51 tokens for 50 requested)"
    )
    # 60 tokens are 20% off 50 asked, though within the range the others asked
    off = [req(101, asked_in=100), req(20, asked_in=20), req(60, asked_in=50)]
    g = run(facts(off))["prompt_length"]
    assert g.status == FAILED and g.value == pytest.approx(20.0)
    assert g.reason == (
        "1 of 3 requests: prompts off their requested length by more than 5% "
        "(the worst 60 tokens for 50 requested)"
    )
    exact = run(facts([req(20, asked_in=20), req(40, asked_in=40)]))["prompt_length"]
    assert exact.status == PASSED and exact.value == 0.0
    assert exact.reason == "2 requests: prompts of 20-40 tokens, each as long as requested"


def test_a_request_without_its_own_length_takes_the_points_or_is_left_out() -> None:
    mixed = [req(64, asked_in=64), req(129), req(131)]
    f = run(facts(mixed, input_tokens=128))["prompt_length"]
    assert f.status == PASSED and f.value == pytest.approx(100 * 3 / 128)
    assert f.reason.startswith("3 requests: prompts of 64-131 tokens, each within 5%")
    g = run(facts(mixed))["prompt_length"]  # no point-wide length: the other two left out
    assert g.status == PASSED and g.value == 0.0
    assert g.reason == (
        "1 request: prompts of 64 tokens, each as long as requested; left out: 2 without a "
        "requested length"
    )


def test_prompt_length_not_checked_without_any_requested_length_nor_for_chat() -> None:
    f = run(facts([req(128), req(130)]))["prompt_length"]
    assert f.status == NOT_CHECKED and f.reason == "requested length not recorded"
    chat = run(facts([req(300)], input_tokens=64, chat_turns=3, think_time_s=0.0))
    assert chat["prompt_length"].status == NOT_CHECKED
    assert chat["prompt_length"].reason.startswith("chat turns: a turn's prompt holds")


def test_every_request_is_judged_against_its_own_max_tokens() -> None:
    reqs = [req(out=16, asked_out=16), req(out=30, asked_out=32), req(out=4, asked_out=4)]
    f = run(facts(reqs))["output_length"]
    assert f.status == FAILED and f.value == pytest.approx(100 * 2 / 32)
    assert f.reason == (
        "1 of 3 requests: outputs off their requested length by more than 0% "
        "(the worst 30 tokens for 32 requested)"
    )
    good = [req(out=16, asked_out=16), req(out=32, asked_out=32)]
    assert run(facts(good))["output_length"].status == PASSED
    # the ignore_eos rule stands: a reply may stop early, its length is not fixed
    free = run(facts(reqs, ignore_eos=False))["output_length"]
    assert free.status == NOT_CHECKED and "ignore_eos false" in free.reason
    unknown = run(facts(reqs, ignore_eos=None))["output_length"]
    assert unknown.status == NOT_CHECKED and "not recorded" in unknown.reason
    bare = run(facts([req(out=16)]))["output_length"]
    assert bare.status == NOT_CHECKED and "not recorded" in bare.reason


def test_one_length_for_every_request_reads_as_it_always_has() -> None:
    same = [req(128, asked_in=128), req(143, asked_in=128)]
    f = run(facts(same))["prompt_length"]
    assert f.reason == "1 of 2 requests: prompts of 128-143 tokens for 128 requested (limit 5%)"
    g = run(facts([req(128), req(143)], input_tokens=128))["prompt_length"]
    assert (g.status, g.value, g.reason) == (f.status, f.value, f.reason)


# the point.json fields and the request records reach the facts


def record(i: int, prompt: int, out: int, **kw: Any) -> RequestRecord:
    return RequestRecord(
        request_id=f"r{i}",
        sent_epoch_ns=T0 + i * 1000,
        chunk_offsets_us=[1000 * (k + 1) for k in range(out)],
        done_offset_us=1000 * (out + 1),
        prompt_tokens=prompt,
        output_tokens=out,
        ok=True,
        http_status=200,
        **kw,
    )


def point(**kw: Any) -> dict[str, Any]:
    return {
        "format_version": 1,
        "concurrency": 2,
        "launch": 1,
        "input_tokens": {"min": 16, "max": 64},
        "output_tokens": {"values": [4, 8]},
        "ignore_eos": True,
        **kw,
    }


def test_facts_read_the_asked_lengths_the_prefix_block_and_the_chat_block() -> None:
    recs = [
        record(0, 40, 4, input_tokens=40, max_tokens=4, prefix=0),
        record(1, 30, 8, input_tokens=24, max_tokens=8, prefix=1),
    ]
    shared = {"prefix_tokens": 16, "prefixes": 2, "reuse_ratio": 0.25}
    f = facts_from_records(
        recs, point(shared_prefix=shared, chat={"turns": 3, "think_time_s": 1.5})
    )
    assert f.input_tokens is None and f.output_tokens is None  # distributions, not one length
    assert [(r.asked_input_tokens, r.asked_output_tokens) for r in f.requests] == [(40, 4), (24, 8)]
    assert f.shared_prefix == shared
    assert (f.chat_turns, f.think_time_s) == (3, 1.5)
    plain = facts_from_records([record(0, 128, 4)], point(input_tokens=128, output_tokens=4))
    assert (plain.input_tokens, plain.output_tokens) == (128, 4)
    assert plain.requests[0].asked_input_tokens is None
    assert (plain.shared_prefix, plain.chat_turns, plain.think_time_s) == (None, None, None)
    by = {flag.check: flag for flag in check_point(recs, point(), T)}
    assert by["prompt_length"].status == FAILED  # 30 tokens for 24 asked: 25% off
    assert by["prompt_length"].reason.startswith("1 of 2 requests: prompts off their requested")
    assert by["output_length"].status == PASSED


# shared prefixes and the prefix cache


def test_shared_prefix_hits_are_noted_beside_the_intended_share() -> None:
    shared = {"prefix_tokens": 100, "prefixes": 2, "reuse_ratio": 0.66}
    on = run(facts([req()], telemetry=hits(1000, 610), shared_prefix=shared, server_args=CACHING))
    f = on["prefix_cache"]
    assert f.status == NOTED and f.value == pytest.approx(0.61)
    assert f.reason == (
        "610 of 1000 prompt tokens came from the prefix cache (0.61); the workload shares "
        "prefixes: 0.66 intended (caching enabled by the configuration)"
    )
    chat = dict(shared, reuse_ratio=None)
    g = run(facts([req()], telemetry=hits(1000, 800), shared_prefix=chat, server_args=CACHING))
    assert g["prefix_cache"].status == NOTED
    assert "the share it intends is not known" in g["prefix_cache"].reason


def test_shared_prefix_with_caching_off_fails_on_hits_and_passes_without() -> None:
    shared = {"prefix_tokens": 100, "prefixes": 2, "reuse_ratio": 0.66}
    hot = run(facts([req()], telemetry=hits(1000, 610), shared_prefix=shared))["prefix_cache"]
    assert hot.status == FAILED and "did not ask for caching" in hot.reason
    cold = run(facts([req()], telemetry=hits(1000, 0), shared_prefix=shared))["prefix_cache"]
    assert cold.status == PASSED and cold.value == 0.0
    assert cold.reason == (
        "0 of 1000 prompt tokens came from the prefix cache; the workload shares prefixes but "
        "the configuration did not enable caching"
    )


def test_without_a_shared_prefix_the_prefix_cache_check_is_as_before() -> None:
    on = run(facts([req()], telemetry=hits(1000, 610), server_args=CACHING))["prefix_cache"]
    assert on.status == NOTED
    assert on.reason == (
        "610 of 1000 prompt tokens came from the prefix cache (caching enabled by the "
        "configuration)"
    )
    assert run(facts([req()], telemetry=hits(1000, 610)))["prefix_cache"].status == FAILED


# chat: think time leaves slots idle


def test_think_time_leaves_achieved_concurrency_not_checked() -> None:
    idle = facts([req()], achieved_concurrency=1.2, chat_turns=4, think_time_s=2.0)
    f = run(idle)["achieved_concurrency"]
    assert f.status == NOT_CHECKED
    assert f.reason == (
        "chat: a conversation waits 2 s between a reply and its next turn, its slot idle by design"
    )
    busy = facts([req()], achieved_concurrency=1.2, chat_turns=4, think_time_s=0.0)
    assert run(busy)["achieved_concurrency"].status == FAILED  # no think time: judged as ever
