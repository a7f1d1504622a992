from __future__ import annotations

import pytest

from servelab.client import RequestRecord
from servelab.metrics import point_metrics, request_latencies


def rec(
    i: int, sent_ms: float, offsets_ms: list[float], done_ms: float, out: int, ok: bool = True
) -> RequestRecord:
    return RequestRecord(
        request_id=f"r{i}",
        sent_epoch_ns=int(sent_ms * 1e6),
        chunk_offsets_us=[int(o * 1000) for o in offsets_ms],
        done_offset_us=int(done_ms * 1000),
        prompt_tokens=10,
        output_tokens=out,
        ok=ok,
        error=None if ok else "boom",
        http_status=200 if ok else 500,
    )


def test_known_answers() -> None:
    a = rec(0, 0, [100, 110, 130], 130, 3)
    b = rec(1, 50, [200, 220, 260], 270, 3)
    m = point_metrics([a, b])
    assert m["completed"] == 2 and m["failed"] == 0 and m["num_prompts"] == 2
    assert m["duration"] == pytest.approx(0.320)  # first send 0 ms -> last completion 50 + 270 ms
    assert m["total_output_tokens"] == 6 and m["total_input_tokens"] == 20
    assert m["output_throughput"] == pytest.approx(6 / 0.32)
    assert m["request_throughput"] == pytest.approx(2 / 0.32)
    assert m["total_token_throughput"] == pytest.approx(26 / 0.32)
    assert m["mean_ttft_ms"] == pytest.approx(150)
    assert m["median_ttft_ms"] == pytest.approx(150)
    # TPOT: (130-100)/2 = 15, (270-200)/2 = 35
    assert m["mean_tpot_ms"] == pytest.approx(25)
    # ITL pooled: 10, 20, 20, 40
    assert m["mean_itl_ms"] == pytest.approx(22.5)
    assert m["p99_itl_ms"] == pytest.approx(40 - 0.03 * 20, rel=1e-6)
    assert m["mean_e2el_ms"] == pytest.approx(200)


def test_failures_are_counted_not_averaged() -> None:
    good = rec(0, 0, [100, 200], 200, 2)
    bad = rec(1, 0, [5], 6, 1, ok=False)
    m = point_metrics([good, bad])
    assert (m["completed"], m["failed"]) == (1, 1)
    assert m["mean_ttft_ms"] == pytest.approx(100)
    assert m["total_output_tokens"] == 2


def test_point_with_no_success_has_no_latency() -> None:
    m = point_metrics([rec(0, 0, [], 6, 0, ok=False)])
    assert m["completed"] == 0 and m["failed"] == 1
    assert m["mean_ttft_ms"] is None and m["output_throughput"] is None


def test_single_token_has_no_tpot() -> None:
    lat = request_latencies(rec(0, 0, [40], 41, 1))
    assert lat["tpot"] is None and lat["itl"] == [] and lat["ttft"] == 40
