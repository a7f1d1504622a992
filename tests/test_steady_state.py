"""The `steady_state` check (servelab.analysis.validity.steady): Mann-Kendall's trend test and
Sen's slope against hand-computed values and scipy's, and the check on constructed points: a
flat or falling point passes, a queue growing over the point fails, a short one is not
checked, ties and send order are handled."""

from __future__ import annotations

import math
import random
import re
from dataclasses import replace

import numpy as np
import pytest

from servelab.analysis.validity import (
    BY_NAME,
    CHECKS,
    FAILED,
    NOT_CHECKED,
    PASSED,
    TTFT_E2EL,
    PointFacts,
    RequestFacts,
    check_point,
    facts_from_bench,
    facts_from_records,
    thresholds_json,
)
from servelab.analysis.validity.steady import check_steady_state, trend
from servelab.client import RequestRecord
from servelab.config import default_section
from servelab.experiment import ValiditySection
from servelab.metrics import request_latencies

T = default_section(ValiditySection, "analysis", "validity")
T0 = 1_800_000_000_000_000_000


def point(ttfts: list[float], e2els: list[float] | None = None, gap_ns: int = 10**8) -> PointFacts:
    """A point of completed requests sent `gap_ns` apart, with these TTFTs and E2ELs (ms)."""
    e2els = e2els if e2els is not None else [t + 400.0 for t in ttfts]
    reqs = tuple(
        RequestFacts(
            completed=True,
            output_tokens=8,
            reads=8,
            error=None,
            ttft_ms=t,
            e2el_ms=e,
            sent_ns=T0 + i * gap_ns,
        )
        for i, (t, e) in enumerate(zip(ttfts, e2els, strict=True))
    )
    return PointFacts(reqs, 10.0, None)


def noisy(n: int, level: float, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [level * (1 + 0.2 * rng.uniform(-1, 1)) for _ in range(n)]


def test_mann_kendall_and_sens_slope_of_a_hand_computed_series() -> None:
    # pairs of [1, 3, 2, 5, 4]: 8 rising, 2 falling, so S = 6; no ties, var = 5*4*15/18;
    # z = (6 - 1) / sqrt(var) with the continuity correction; the ten pair slopes sorted are
    # -1, -1, 1/3, 1/2, 3/4, 1, 1, 4/3, 2, 3: their median (3/4 + 1) / 2
    tr = trend([1, 3, 2, 5, 4])
    assert tr.s == 6 and tr.var_s == pytest.approx(300 / 18)
    assert tr.z == pytest.approx(5 / math.sqrt(300 / 18))
    assert tr.p == pytest.approx(math.erfc(5 / math.sqrt(300 / 18) / math.sqrt(2)))
    assert tr.p == pytest.approx(0.2207, abs=1e-4)
    assert tr.slope == pytest.approx(0.875) and tr.median == 3.0
    assert tr.relative == pytest.approx(0.875 * 4 / 3)
    # reversed: the same test, the other sign
    down = trend([4, 5, 2, 3, 1])
    assert down.s == -6 and down.p == pytest.approx(tr.p) and down.slope == -0.875


def test_ties_reduce_the_variance() -> None:
    # [1, 2, 2, 3, 3, 3]: 11 rising pairs, 4 tied, none falling; ties of 2 and of 3 take
    # 2*1*9 + 3*2*11 = 84 from n(n-1)(2n+5) = 510
    tr = trend([1, 2, 2, 3, 3, 3])
    assert tr.s == 11 and tr.var_s == pytest.approx((510 - 84) / 18)
    assert tr.z == pytest.approx(10 / math.sqrt(426 / 18))
    # every value equal: no trend, no variance, p 1
    flat = trend([5.0] * 12)
    assert flat.s == 0 and flat.var_s == 0 and flat.p == 1.0 and flat.slope == 0.0


def test_against_scipy_on_series_with_ties() -> None:
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(7)
    for n in (12, 40, 150):
        x = np.round(rng.normal(0, 1, n) + np.linspace(0, 0.8, n), 1)  # rounding makes ties
        tr = trend(x)
        tau = stats.kendalltau(np.arange(n), x, method="asymptotic")
        # tau-b with no ties in the send order: S / sqrt(n0 (n0 - ties in x))
        n0 = n * (n - 1) / 2
        _, counts = np.unique(x, return_counts=True)
        ties = float(np.sum(counts * (counts - 1) / 2))
        assert tr.s == pytest.approx(tau.statistic * math.sqrt(n0 * (n0 - ties)))
        # scipy's p has no continuity correction: the same variance, S itself
        assert math.erfc(abs(tr.s) / math.sqrt(tr.var_s) / math.sqrt(2)) == pytest.approx(
            tau.pvalue
        )
        assert tr.p > tau.pvalue  # the correction moves z toward 0
        assert tr.slope == pytest.approx(stats.theilslopes(x).slope)


def test_a_flat_noisy_point_passes() -> None:
    f = check_steady_state(point(noisy(200, 100.0)), T)
    assert f.status == PASSED and f.threshold == 1.0
    assert f.value is not None and abs(f.value) < 0.1
    assert "TTFT" in f.reason and "E2EL" in f.reason and "p " in f.reason


def test_a_queue_growing_over_the_point_fails() -> None:
    # an open loop past capacity: each request waits longer than the one before, TTFT from
    # 100 ms to 1000 ms (10x) across the point, E2EL with it
    n = 60
    ttft = [100.0 * (1 + 9 * k / (n - 1)) for k in range(n)]
    ttft = [t * (1 + 0.05 * math.sin(k)) for k, t in enumerate(ttft)]  # not a straight line
    f = check_steady_state(point(ttft), T)
    assert f.status == FAILED, f
    # fitted change 900 ms over a median near 550 ms
    assert f.value == pytest.approx(900 / 550, rel=0.1)
    # E2EL, 400 ms more throughout, grows by less than its median
    assert ": TTFT grew over the point" in f.reason and "limit 100% at p < 0.01" in f.reason
    said = re.search(r"TTFT \+(\d+)% \(Mann-Kendall p ([0-9.e-]+)\)", f.reason)
    assert said is not None and int(said[1]) == round(100 * (f.value or 0))
    assert float(said[2]) < 1e-20
    # a queue growing linearly from empty fits twice its median, whatever its slope
    empty = check_steady_state(point([10.0 * k + 1 for k in range(100)]), T)
    assert empty.status == FAILED and empty.value == pytest.approx(2.0, rel=0.05)


def test_growth_below_the_threshold_or_not_significant_passes() -> None:
    n = 60
    ttft = [100.0 * (1 + 0.5 * k / (n - 1)) for k in range(n)]  # +50%: significant, small
    f = check_steady_state(point(ttft), T)
    assert f.status == PASSED and 0.3 < (f.value or 0) < 0.6
    # large but, at a stricter level than its p, not significant
    big = [100.0 * (1 + 9 * k / (n - 1)) for k in range(n)]
    strict = replace(T, latency_trend_alpha=1e-300)
    assert check_steady_state(point(big), strict).status == PASSED
    # a lower threshold fails the +50%
    assert check_steady_state(point(ttft), replace(T, max_latency_trend=0.3)).status == FAILED


def test_e2el_alone_growing_fails() -> None:
    n = 40
    ttft = noisy(n, 50.0)
    e2el = [400.0 * (1 + 4 * k / (n - 1)) for k in range(n)]
    f = check_steady_state(point(ttft, e2el), T)
    assert f.status == FAILED and ": E2EL grew" in f.reason


def test_a_falling_trend_passes() -> None:
    n = 60
    ttft = [1000.0 * (1 - 0.9 * k / (n - 1)) for k in range(n)]  # a queue draining
    f = check_steady_state(point(ttft), T)
    # the value is the larger change: E2EL's, which falls less (its 400 ms stay)
    assert f.status == PASSED and f.value is not None and -1.0 < f.value < -0.5
    assert "TTFT -164%" in f.reason


def test_a_short_point_is_not_checked() -> None:
    f = check_steady_state(point([10.0 * k for k in range(1, 10)]), T)
    assert f.status == NOT_CHECKED and f.value is None
    assert f.reason == "9 successful requests: the trend test needs at least 10"
    # failed requests do not count
    grown = point([10.0 * k for k in range(1, 13)])
    reqs = tuple(
        replace(r, completed=False, ttft_ms=None, e2el_ms=None) if i % 4 == 0 else r
        for i, r in enumerate(grown.requests)
    )
    assert check_steady_state(replace(grown, requests=reqs), T).status == NOT_CHECKED
    assert check_steady_state(grown, T).status == FAILED


def test_requests_are_read_in_send_order() -> None:
    # recorded out of order (e.g. as they ended), sent in the order their TTFT grows
    f = point([10.0 * k + 5 for k in range(40)])
    shuffled = list(f.requests)
    random.Random(3).shuffle(shuffled)
    assert check_steady_state(replace(f, requests=tuple(shuffled)), T).status == FAILED
    # the same latencies sent in the shuffled order: no trend
    resent = tuple(replace(r, sent_ns=T0 + i) for i, r in enumerate(shuffled))
    assert check_steady_state(replace(f, requests=resent), T).status == PASSED


def test_a_chat_reads_its_first_turns_only() -> None:
    # 12 conversations of 3 turns: later turns' TTFT grows with the history, by design
    reqs = []
    for c in range(12):
        for turn in (1, 2, 3):
            reqs.append(
                RequestFacts(
                    completed=True,
                    output_tokens=8,
                    reads=8,
                    error=None,
                    ttft_ms=50.0 * turn**3 + c % 3,
                    e2el_ms=400.0 + 50.0 * turn**3,
                    sent_ns=T0 + (3 * c + turn) * 10**9,
                    turn=turn,
                )
            )
    f = PointFacts(tuple(reqs), 10.0, None, chat_turns=3)
    assert check_steady_state(f, T).status == PASSED
    assert "12 requests" in check_steady_state(f, T).reason
    few = replace(f, requests=tuple(r for r in reqs if (r.sent_ns or 0) < T0 + 27 * 10**9))
    flag = check_steady_state(few, T)
    assert flag.status == NOT_CHECKED and flag.reason == (
        "9 successful first turns: the trend test needs at least 10"
    )


def test_a_failure_removes_ttft_and_e2el_only() -> None:
    check = BY_NAME["steady_state"]
    assert check.affects == TTFT_E2EL and check.threshold_key == "max_latency_trend"
    for metric in ("mean_ttft_ms", "p99_ttft_ms", "median_e2el_ms", "p99_e2el_ms"):
        assert check.removes(metric), metric
    for metric in ("mean_tpot_ms", "p99_itl_ms", "output_throughput", "request_throughput"):
        assert not check.removes(metric), metric
    assert check.threshold(T) == 1.0
    assert CHECKS[-1] is check


def test_thresholds_default_and_are_recorded() -> None:
    assert T.latency_trend_alpha == 0.01 and T.max_latency_trend == 1.0
    for axis in ("concurrency", "rate"):
        th = thresholds_json(T, axis)
        assert th["latency_trend_alpha"] == 0.01 and th["max_latency_trend"] == 1.0


def record(i: int, ttft_us: int, e2el_us: int) -> RequestRecord:
    return RequestRecord(
        request_id=f"r{i}",
        sent_epoch_ns=T0 + i * 10**8,
        chunk_offsets_us=[ttft_us, (ttft_us + e2el_us) // 2, e2el_us - 10],
        done_offset_us=e2el_us,
        prompt_tokens=32,
        output_tokens=3,
        ok=True,
        chunk_tokens=[1, 1, 1],
        empty_chunks=[],
    )


def test_servelab_records_give_the_metrics_latencies() -> None:
    recs = [record(i, 1000 * (10 + 20 * i), 1000 * (200 + 20 * i)) for i in range(30)]
    recs.reverse()  # as they ended, not as they were sent
    f = facts_from_records(recs, {"concurrency": 4})
    for r, fr in zip(recs, f.requests, strict=True):
        lat = request_latencies(r)
        assert (fr.ttft_ms, fr.e2el_ms, fr.sent_ns) == (lat["ttft"], lat["e2el"], r.sent_epoch_ns)
    flags = {fl.check: fl for fl in check_point(recs, {"concurrency": 4}, T)}
    assert flags["steady_state"].status == FAILED
    assert [fl.check for fl in check_point(recs, {"concurrency": 4}, T)] == [c.name for c in CHECKS]


def test_a_vllm_bench_tree_is_read_in_its_send_order() -> None:
    n = 30
    bench = {
        "ttfts": [0.01 * (1 + k) for k in range(n)],
        "itls": [[0.01, 0.01] for _ in range(n)],
        "latencies": [0.2 + 0.01 * k for k in range(n)],
        "output_lens": [3] * n,
        "input_lens": [32] * n,
        "errors": [""] * n,
        "duration": 5.0,
    }
    f = facts_from_bench(bench)  # type: ignore[arg-type]
    assert [r.ttft_ms for r in f.requests][:2] == pytest.approx([10.0, 20.0])
    assert all(r.sent_ns is None for r in f.requests)
    assert check_steady_state(f, T).status == FAILED
    # without `latencies`: TTFT plus the gaps, as the bench's metrics count E2EL
    del bench["latencies"]
    g = facts_from_bench(bench)  # type: ignore[arg-type]
    assert g.requests[0].e2el_ms == pytest.approx(30.0)


def test_a_trace_whose_replies_lengthen_is_read_per_output_token() -> None:
    # 200 requests whose output lengths double over the point (as in a production trace's
    # window), each at 10 ms per output token: E2EL doubles with them, with no queue at all
    rng = random.Random(3)
    outs = [20 + i // 2 + rng.randint(0, 10) for i in range(200)]
    e2el = [10.0 * o * (1 + 0.1 * rng.uniform(-1, 1)) for o in outs]

    def facts(per_token: list[float], wait: float = 0.0) -> PointFacts:
        reqs = tuple(
            RequestFacts(completed=True, output_tokens=o, reads=o, error=None,
                         ttft_ms=50.0 + rng.uniform(-5, 5) + wait * i, e2el_ms=e + wait * i,
                         sent_ns=T0 + i * 10**8)
            for i, (o, e) in enumerate(zip(outs, per_token, strict=True))
        )  # fmt: skip
        return PointFacts(reqs, 10.0, None)

    assert trend(e2el).relative is not None and trend(e2el).relative > 1.0  # E2EL alone trends
    flag = check_steady_state(facts(e2el), T)
    assert flag.status == PASSED, flag.reason
    assert "E2EL per output token" in flag.reason
    # a queue growing over the same point: each request waits 40 ms more than the one before
    flag = check_steady_state(facts(e2el, wait=40.0), T)
    assert flag.status == FAILED, flag.reason
    # the wait is whole in TTFT, diluted per output token in E2EL: TTFT tells the queue
    assert "TTFT grew over the point" in flag.reason, flag.reason
    assert "E2EL per output token +" in flag.reason
