"""Per-point metrics with the names and meaning of `vllm bench serve` (see docs/analysis.md).

Only successful requests count toward latencies (except `client_wait`, the client's own wait
before each send, over every request); failures are counted in `failed`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypedDict

import numpy as np

from servelab.client import RequestRecord

PERCENTILES = (50, 90, 95, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2el", "ttfb", "client_wait")
MIN_WINDOW_NS = 1_000_000  # achieved_concurrency needs a send window at least this long


def latency_stats(name: str, values_ms: Sequence[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    arr = np.asarray(values_ms, dtype=np.float64)
    have = arr.size > 0
    out[f"mean_{name}_ms"] = float(arr.mean()) if have else None
    out[f"median_{name}_ms"] = float(np.median(arr)) if have else None
    out[f"std_{name}_ms"] = float(arr.std()) if have else None
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms"] = float(np.percentile(arr, p)) if have else None
    return out


def first_output_chunk(
    n_chunks: int, empty_chunks: Sequence[int] | None, chunk_tokens: Sequence[int] | None
) -> int | None:
    """Index of the first content chunk that carries generated output: text, or, where the
    server reported tokens per chunk, at least one token (a token whose text is held back or
    is a special token still arrived). None when no chunk does: no text and no token counts."""
    if not empty_chunks:
        return 0 if n_chunks else None
    skip = set(empty_chunks)
    known = chunk_tokens is not None and len(chunk_tokens) == n_chunks
    for i in range(n_chunks):
        if i not in skip or (known and chunk_tokens[i] > 0):  # type: ignore[index]
            return i
    return None


def ttft_chunk(rec: RequestRecord) -> int:
    """The chunk TTFT is measured at: the first that carries output (`first_output_chunk`);
    the first chunk when none does (raw data older than `empty_chunks` reads that way too)."""
    i = first_output_chunk(len(rec.chunk_offsets_us), rec.empty_chunks, rec.chunk_tokens)
    return 0 if i is None else i


class RequestLatencies(TypedDict):
    """One successful request's latencies (ms): TTFT, E2EL, TPOT (None for a single output
    token) and the inter-token latencies."""

    ttft: float
    e2el: float
    tpot: float | None
    itl: list[float]


# a point's metrics by name (point.json `metrics`): counts, rates and latency statistics, each
# a number or None where it has none
PointMetrics = dict[str, float | None]


def request_latencies(rec: RequestRecord) -> RequestLatencies:
    """TTFT, E2EL, TPOT and ITLs (ms) of one successful request."""
    offs = rec.chunk_offsets_us
    ttft = offs[ttft_chunk(rec)] / 1000.0
    e2el = (rec.done_offset_us if rec.done_offset_us is not None else offs[-1]) / 1000.0
    n = rec.output_tokens or 0
    tpot = (e2el - ttft) / (n - 1) if n > 1 else None
    itl = [(b - a) / 1000.0 for a, b in zip(offs, offs[1:], strict=False)]
    return {"ttft": ttft, "e2el": e2el, "tpot": tpot, "itl": itl}


def request_end_ns(rec: RequestRecord) -> int:
    """When a request stopped being in flight (wall clock, ns): the end of its stream, else
    (a failed request) its last known arrival: the last chunk, else the first byte, else its
    send."""
    if rec.done_offset_us is not None:
        off = rec.done_offset_us
    elif rec.chunk_offsets_us:
        off = rec.chunk_offsets_us[-1]
    else:
        off = rec.first_byte_offset_us or 0
    return rec.sent_epoch_ns + off * 1000


def in_flight(recs: Sequence[RequestRecord]) -> tuple[float | None, float | None]:
    """(achieved_concurrency, mean_in_flight): the time-weighted mean number of requests in
    flight (each from its send to `request_end_ns`, failed ones included) from the first
    send to the last send (None when that is under 1 ms), and from the first send to the
    last end (None when that is not positive)."""
    if not recs:
        return None, None
    spans = [(r.sent_epoch_ns, max(r.sent_epoch_ns, request_end_ns(r))) for r in recs]
    first = min(s for s, _ in spans)
    last_send = max(s for s, _ in spans)
    last_end = max(e for _, e in spans)
    achieved = None
    if last_send - first >= MIN_WINDOW_NS:
        busy = sum(max(0, min(e, last_send) - s) for s, e in spans)
        achieved = busy / (last_send - first)
    mean = sum(e - s for s, e in spans) / (last_end - first) if last_end > first else None
    return achieved, mean


def point_metrics(records: Iterable[RequestRecord]) -> PointMetrics:
    recs = list(records)
    good = [r for r in recs if r.ok and r.chunk_offsets_us]
    ttft, tpot, e2el, itl = [], [], [], []
    for r in good:
        lat = request_latencies(r)
        ttft.append(lat["ttft"])
        e2el.append(lat["e2el"])
        itl.extend(lat["itl"])
        if lat["tpot"] is not None:
            tpot.append(lat["tpot"])
    ttfb = [r.first_byte_offset_us / 1000.0 for r in good if r.first_byte_offset_us is not None]
    wait = [r.queued_us / 1000.0 for r in recs if r.queued_us is not None]
    duration = 0.0
    if recs:
        start = min(r.sent_epoch_ns for r in recs)
        ends = [r.sent_epoch_ns + (r.done_offset_us or 0) * 1000 for r in good] or [start]
        duration = (max(ends) - start) / 1e9
    achieved, mean_in_flight = in_flight(recs)
    out = assemble(
        num_prompts=len(recs),
        completed=len(good),
        duration=duration,
        total_input_tokens=sum(r.prompt_tokens or 0 for r in good),
        total_output_tokens=sum(r.output_tokens or 0 for r in good),
        latencies_ms={
            "ttft": ttft,
            "tpot": tpot,
            "itl": itl,
            "e2el": e2el,
            "ttfb": ttfb,
            "client_wait": wait,
        },
    )
    out.update(achieved_concurrency=achieved, mean_in_flight=mean_in_flight)
    return out


def assemble(
    num_prompts: int,
    completed: int,
    duration: float,
    total_input_tokens: int,
    total_output_tokens: int,
    latencies_ms: dict[str, list[float]],
) -> PointMetrics:
    """The metric keys of a point from its counts, duration (s) and latency lists (ms; a family
    left out is null); its mean numbers of requests in flight null, for the caller that knows
    them to fill in (`in_flight`)."""
    dur = duration
    out: PointMetrics = {
        "num_prompts": num_prompts,
        "completed": completed,
        "failed": num_prompts - completed,
        "duration": dur,
        "total_input_tokens": total_input_tokens,
        "total_output_tokens": total_output_tokens,
        "request_throughput": completed / dur if dur > 0 else None,
        "output_throughput": total_output_tokens / dur if dur > 0 else None,
        "total_token_throughput": (total_input_tokens + total_output_tokens) / dur
        if dur > 0
        else None,
    }
    for name in LATENCIES:
        out.update(latency_stats(name, latencies_ms.get(name, [])))
    out["achieved_concurrency"] = None
    out["mean_in_flight"] = None
    return out
