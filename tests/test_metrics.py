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
    # two values bound no percentile: none is reported, n and the maximum stand beside it
    assert m["median_ttft_ms"] is None and m["p50_ttft_ms"] is None
    assert (m["n_ttft"], m["max_ttft_ms"]) == (2, 200)
    # TPOT: (130-100)/2 = 15, (270-200)/2 = 35
    assert m["mean_tpot_ms"] == pytest.approx(25)
    # ITL pooled: 10, 20, 20, 40
    assert m["mean_itl_ms"] == pytest.approx(22.5)
    assert m["p99_itl_ms"] is None and (m["n_itl"], m["max_itl_ms"]) == (4, 40)
    assert m["p99_itl_ms_low"] == pytest.approx(20) and m["p99_itl_ms_high"] is None
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


def test_ttft_is_the_first_chunk_with_text() -> None:
    r = rec(0, 0, [100, 110, 130], 130, 3)
    r.empty_chunks = [0]  # the first token's text was held back
    lat = request_latencies(r)
    assert lat["ttft"] == 110
    assert lat["tpot"] == pytest.approx((130 - 110) / 2)
    assert lat["itl"] == [10, 20]  # ITL still counts every chunk
    r.empty_chunks = [0, 1, 2]  # no chunk carried text: the first chunk
    assert request_latencies(r)["ttft"] == 100
    r.empty_chunks = [1]
    assert request_latencies(r)["ttft"] == 100
    assert point_metrics([rec(1, 0, [100, 110], 110, 2)])["mean_ttft_ms"] == 100


def test_old_raw_data_gives_the_same_numbers() -> None:
    """Raw data from before empty_chunks & co. (the keys absent) reads as it always did."""
    recs = [rec(0, 0, [100, 110, 130], 130, 3), rec(1, 50, [200, 220, 260], 270, 3)]
    old = [RequestRecord.from_json({k: r.to_json()[k] for k in OLD}) for r in recs]
    assert all(r.empty_chunks is None and r.queued_us is None for r in old)
    m = point_metrics(old)
    assert list(m)[: len(OLD_KEYS)] == OLD_KEYS
    assert m["mean_ttft_ms"] == 150 and m["p99_ttft_ms"] is None
    for fam in ("ttfb", "client_wait"):
        assert m[f"mean_{fam}_ms"] is None and m[f"p99_{fam}_ms"] is None
    for r in recs:  # new data where every chunk carried text: the same numbers
        r.empty_chunks = []
    new = point_metrics(recs)
    assert {k: new[k] for k in OLD_KEYS} == {k: m[k] for k in OLD_KEYS}


OLD = ("request_id", "sent_epoch_ns", "chunk_offsets_us", "done_offset_us", "prompt_tokens")
OLD += ("output_tokens", "ok", "error", "http_status")
OLD_KEYS = ["num_prompts", "completed", "failed", "duration", "total_input_tokens"]
OLD_KEYS += ["total_output_tokens", "request_throughput", "output_throughput"]
OLD_KEYS += ["total_token_throughput"]
OLD_KEYS += [
    f"{s}_{n}_ms"
    for n in ("ttft", "tpot", "itl", "e2el")
    for s in ("mean", "median", "std", "p50", "p90", "p95", "p99")
]


def test_ttfb_and_client_wait() -> None:
    a, b = rec(0, 0, [100, 110], 110, 2), rec(1, 0, [5], 6, 1, ok=False)
    a.first_byte_offset_us, a.queued_us = 40_000, 300
    b.first_byte_offset_us, b.queued_us = 2_000, 1_300
    m = point_metrics([a, b])
    assert m["mean_ttfb_ms"] == 40  # latencies: successful requests only
    assert m["mean_client_wait_ms"] == pytest.approx(0.8)  # the client's wait: every request
    assert m["p99_client_wait_ms"] is None and m["max_client_wait_ms"] == pytest.approx(1.3)
    keys = list(m)
    assert (
        keys.index("p99_e2el_ms") < keys.index("mean_ttfb_ms") < keys.index("mean_client_wait_ms")
    )
    assert keys[-2:] == ["achieved_concurrency", "mean_in_flight"]


def closed_loop(c: int, waves: int, service_ms: float, gap_ms: float) -> list[RequestRecord]:
    """c slots, each sending its next request gap_ms after its previous one ended."""
    out = []
    for s in range(c):
        t = 0.0
        for w in range(waves):
            out.append(rec(s * waves + w, t, [service_ms / 2, service_ms], service_ms, 2))
            t += service_ms + gap_ms
    return out


def test_achieved_concurrency_of_a_closed_loop() -> None:
    m = point_metrics(closed_loop(4, 3, 100, 0))
    assert m["achieved_concurrency"] == pytest.approx(4)
    assert m["mean_in_flight"] == pytest.approx(4)
    # sends lag 20 ms behind each end: busy 200 of the 240 ms to the last send
    m = point_metrics(closed_loop(4, 3, 100, 20))
    assert m["achieved_concurrency"] == pytest.approx(4 * 200 / 240)
    assert m["mean_in_flight"] == pytest.approx(4 * 300 / 340)


def test_in_flight_counts_failures_and_the_drain() -> None:
    # one slot, two sends 100 ms apart; then a straggler that runs long (the drain)
    recs = [rec(0, 0, [50, 100], 100, 2), rec(1, 100, [200, 400], 400, 2)]
    m = point_metrics(recs)
    assert m["achieved_concurrency"] == pytest.approx(1)
    assert m["mean_in_flight"] == pytest.approx(1)
    # a failed request with neither end nor chunks is in flight until its first byte
    bad = rec(2, 0, [], 0, 0, ok=False)
    bad.done_offset_us, bad.first_byte_offset_us = None, 50_000
    m = point_metrics([*recs, bad])
    assert m["achieved_concurrency"] == pytest.approx(1.5)
    assert m["mean_in_flight"] == pytest.approx((100 + 400 + 50) / 500)
    # ... or its last chunk, when it had one
    bad.chunk_offsets_us = [80_000]
    assert point_metrics([*recs, bad])["achieved_concurrency"] == pytest.approx(1.8)


def test_no_achieved_concurrency_for_a_send_window_under_1_ms() -> None:
    m = point_metrics([rec(0, 0, [10], 20, 1), rec(1, 0.5, [10], 20, 1)])
    assert m["achieved_concurrency"] is None
    assert m["mean_in_flight"] == pytest.approx(40 / 20.5)
    assert point_metrics([])["achieved_concurrency"] is None
