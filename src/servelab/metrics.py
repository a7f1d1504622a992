"""Per-point metrics with the names and meaning of `vllm bench serve` (see docs/analysis.md).

Only successful requests count toward latencies (except `client_wait`, the client's own wait
before each send, over every request); failures are counted in `failed`.
"""

from __future__ import annotations

import functools
import math
import re
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
from scipy.stats import binom

from servelab.client import RequestRecord

PERCENTILES = (50, 90, 95, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2el", "ttfb", "client_wait")
MIN_WINDOW_NS = 1_000_000  # achieved_concurrency needs a send window at least this long


def latency_stats(name: str, values_ms: Sequence[float], t: Tail) -> dict[str, float | None]:
    """A latency family's statistics: mean, median, std and the PERCENTILES, the percentiles
    those of its tail `t` (`tail`; its columns, `tail_columns`, apart). A percentile (the median
    too) the sample cannot support is None: its 95% interval would need an order statistic
    above the sample's largest (`samples_needed`); n and the maximum stand beside it."""
    out: dict[str, float | None] = {}
    arr = np.asarray(values_ms, dtype=np.float64)
    have = arr.size > 0
    out[f"mean_{name}_ms"] = float(arr.mean()) if have else None
    out[f"median_{name}_ms"] = float(np.median(arr)) if supported(arr.size, 50) else None
    out[f"std_{name}_ms"] = float(arr.std()) if have else None
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms"] = t.estimates[p]
    return out


def tail_columns(name: str, t: Tail) -> dict[str, float | None]:
    """A tail as point metrics: n_<name> (how many values), max_<name>_ms, and each
    percentile's distribution-free 95% interval, p<P>_<name>_ms_low and _high (None where the
    sample cannot bound it: `percentile_interval`)."""
    out: dict[str, float | None] = {f"n_{name}": t.n, f"max_{name}_ms": t.max}
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms_low"], out[f"p{p}_{name}_ms_high"] = t.intervals[p]
    return out


CONFIDENCE = 0.95  # of a percentile's interval
_PERCENTILE = re.compile(r"^(?:p(\d+)|median)_([a-z0-9_]+?)_ms$")


def percentile_of(metric: str) -> tuple[str, float] | None:
    """(latency, percentile) of a percentile metric: p99_ttft_ms -> ("ttft", 99),
    median_tpot_ms -> ("tpot", 50); None for any other metric."""
    m = _PERCENTILE.match(metric)
    if m is None or m.group(2) not in LATENCIES:
        return None
    return m.group(2), float(m.group(1) or 50)


@dataclass(frozen=True)
class Tail:
    """A sample's tail (`tail`): its size, largest value, and per percentile its estimate
    (None where unsupported) and 95% interval (low, high; None where the sample has no order
    statistic for a bound)."""

    n: int
    max: float | None
    estimates: Mapping[int, float | None]
    intervals: Mapping[int, tuple[float | None, float | None]]

    def text(self, p: int, digits: int = 1) -> str:
        """'41.2 ms [38.0, 45.1], n = 420', or 'insufficient (n = 12: max 63.0 ms; p99 needs
        368)'; '—' with no values."""
        if self.n == 0:
            return "—"
        est = self.estimates[p]
        if est is None:
            return f"insufficient ({insufficient(p, self.n, self.max)})"
        low, high = self.intervals[p]
        lo = "—" if low is None else f"{low:.{digits}f}"
        assert high is not None  # an estimate is reported only with its upper bound
        return f"{est:.{digits}f} ms [{lo}, {high:.{digits}f}], n = {self.n}"


def tail(values_ms: Sequence[float]) -> Tail:
    """The tail of a sample of latencies (ms) at each of PERCENTILES."""
    arr = np.sort(np.asarray(values_ms, dtype=np.float64))
    return Tail(
        n=int(arr.size),
        max=float(arr[-1]) if arr.size else None,
        estimates={
            p: float(np.percentile(arr, p)) if supported(arr.size, p) else None for p in PERCENTILES
        },
        intervals={p: percentile_interval(arr, p) for p in PERCENTILES},
    )


@functools.cache
def percentile_ranks(n: int, p: float) -> tuple[int | None, int | None]:
    """The 1-based ranks (l, u) of the order statistics that bound the p-th percentile of a
    sample of n with 95% confidence, distribution-free: the number B of values at or below the
    true percentile is Binomial(n, p/100), and the interval [x_(l), x_(u)] covers it when
    l <= B < u; l is the largest rank with P(B < l) <= 2.5% and u the smallest with
    P(B >= u) <= 2.5%. None for a bound the sample has no order statistic for: l below 1 (no
    lower bound), u above n (no upper bound: the percentile is beyond what n values can
    bound, however they fall)."""
    if n < 1:
        return None, None
    q, tail = p / 100.0, (1.0 - CONFIDENCE) / 2.0
    # P(B <= k) for k = -1..n; l-1 is the largest k with P(B <= k) <= tail
    below = int(binom.ppf(tail, n, q))  # smallest k with P(B <= k) >= tail
    lo = below if binom.cdf(below, n, q) > tail else below + 1
    # u-1 is the smallest k with P(B <= k) >= 1 - tail
    hi = int(binom.ppf(1.0 - tail, n, q)) + 1
    return (lo if lo >= 1 else None), (hi if hi <= n else None)


def percentile_interval(
    sorted_values: Sequence[float] | np.ndarray, p: float
) -> tuple[float | None, float | None]:
    """The distribution-free 95% interval of the p-th percentile from a sorted sample
    (`percentile_ranks`): (low, high), either None where the sample has no order statistic for
    it."""
    lo, hi = percentile_ranks(len(sorted_values), p)
    return (
        float(sorted_values[lo - 1]) if lo is not None else None,
        float(sorted_values[hi - 1]) if hi is not None else None,
    )


@functools.cache
def samples_needed(p: float) -> int:
    """The fewest values whose largest can be the upper bound of the p-th percentile's 95%
    interval (`percentile_ranks`): n with P(all n below the percentile) = (p/100)^n <= 2.5%.
    6 for the median, 36 for p90, 72 for p95, 368 for p99."""
    tail = (1.0 - CONFIDENCE) / 2.0
    n = max(1, math.ceil(math.log(tail) / math.log(p / 100.0)))
    while percentile_ranks(n, p)[1] is None:
        n += 1
    return n


def supported(n: int, p: float) -> bool:
    """Whether n values can report the p-th percentile: its 95% interval has an upper bound
    inside the sample (`samples_needed`)."""
    return n >= samples_needed(p)


def insufficient(p: float, n: int | str, max_ms: float | None) -> str:
    """'n = 4: max 63.0 ms; p99 needs 368': why a percentile is not reported (`n` the count,
    or words for it, '4 in 3 of 3 repeats')."""
    top = f": max {max_ms:.1f} ms" if max_ms is not None else ""
    return f"n = {n}{top}; p{p:g} needs {samples_needed(p)}"


def first_output_chunk(
    n_chunks: int, empty_chunks: Sequence[int] | None, chunk_tokens: Sequence[int] | None
) -> int | None:
    """Index of the first content chunk that carries generated output: text, or, where the
    server reported tokens per chunk, at least one token (a token whose text is held back or
    is a special token still arrived). None when no chunk does: no text and no token counts."""
    if not empty_chunks:
        return 0 if n_chunks else None
    skip = set(empty_chunks)
    # the tokens per chunk, where there is a count for each chunk
    tokens = chunk_tokens if chunk_tokens is not None and len(chunk_tokens) == n_chunks else None
    for i in range(n_chunks):
        if i not in skip or (tokens is not None and tokens[i] > 0):
            return i
    return None


def text_lag(rec: RequestRecord) -> int | None:
    """How many chunks after the one its TTFT is measured at (`ttft_chunk`) a request's first
    chunk with text came: 0 when the first output chunk has text; None when no chunk has text
    (or none is known to lack it, raw data older than `empty_chunks`: 0). A client that times
    TTFT at the first chunk with text times this request that many chunks later."""
    n = len(rec.chunk_offsets_us)
    skip = set(rec.empty_chunks or ())
    first_text = next((i for i in range(n) if i not in skip), None)
    if first_text is None:
        return None
    return max(0, first_text - ttft_chunk(rec))


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


def sliced(
    recs: Sequence[RequestRecord], slices: Sequence[Sequence[int]] | None = None
) -> list[list[RequestRecord]]:
    """A point's requests by the slice they were sent in: `slices` is point.json `slices`, each
    slice's [start, end] on the client's wall clock (ns), for a point sent in parts that
    alternate with another server's (sweep.repeats.slices); a request belongs to the last
    slice that started at or before its send. A point sent whole is one part."""
    if not slices:
        return [list(recs)] if recs else []
    starts = [int(s[0]) for s in slices]
    parts: list[list[RequestRecord]] = [[] for _ in starts]
    for r in recs:
        parts[max(0, bisect_right(starts, r.sent_epoch_ns) - 1)].append(r)
    return [part for part in parts if part]


def in_flight(
    recs: Sequence[RequestRecord], slices: Sequence[Sequence[int]] | None = None
) -> tuple[float | None, float | None]:
    """(achieved_concurrency, mean_in_flight): the time-weighted mean number of requests in
    flight (each from its send to `request_end_ns`, failed ones included) from the first
    send to the last send (None when that is under 1 ms), and from the first send to the
    last end (None when that is not positive). A point sent in slices (`sliced`) is weighed
    over its slices' windows alone, the other server's time between them left out."""
    busy_sent = window_sent = busy = window = 0
    for part in sliced(recs, slices):
        spans = [(r.sent_epoch_ns, max(r.sent_epoch_ns, request_end_ns(r))) for r in part]
        first = min(s for s, _ in spans)
        last_send = max(s for s, _ in spans)
        busy_sent += sum(max(0, min(e, last_send) - s) for s, e in spans)
        window_sent += last_send - first
        busy += sum(e - s for s, e in spans)
        window += max(e for _, e in spans) - first
    if not recs:
        return None, None
    achieved = busy_sent / window_sent if window_sent >= MIN_WINDOW_NS else None
    return achieved, (busy / window if window > 0 else None)


def point_duration(
    recs: Sequence[RequestRecord], slices: Sequence[Sequence[int]] | None = None
) -> float | None:
    """Seconds from the first send to the last successful end (None: no request succeeded);
    for a point sent in slices, the sum over its slices."""
    total, any_good = 0, False
    for part in sliced(recs, slices):
        start = min(r.sent_epoch_ns for r in part)
        ends = [r.sent_epoch_ns + (r.done_offset_us or 0) * 1000 for r in part if good(r)]
        any_good = any_good or bool(ends)
        total += max(ends or [start]) - start
    return total / 1e9 if any_good else None


def good(rec: RequestRecord) -> bool:
    """A request that succeeded: it ended well and streamed content."""
    return bool(rec.ok and rec.chunk_offsets_us)


def point_metrics(
    records: Iterable[RequestRecord], slices: Sequence[Sequence[int]] | None = None
) -> PointMetrics:
    """A point's metrics from its requests; `slices` (point.json's, for a point sent in parts)
    gives the windows its duration and concurrency are measured over."""
    recs = list(records)
    good_recs = [r for r in recs if good(r)]
    ttft, tpot, e2el, itl = [], [], [], []
    for r in good_recs:
        lat = request_latencies(r)
        ttft.append(lat["ttft"])
        e2el.append(lat["e2el"])
        itl.extend(lat["itl"])
        if lat["tpot"] is not None:
            tpot.append(lat["tpot"])
    ttfb = [
        r.first_byte_offset_us / 1000.0 for r in good_recs if r.first_byte_offset_us is not None
    ]
    wait = [r.queued_us / 1000.0 for r in recs if r.queued_us is not None]
    duration = point_duration(recs, slices) or 0.0
    achieved, mean_in_flight = in_flight(recs, slices)
    out = assemble(
        num_prompts=len(recs),
        completed=len(good_recs),
        duration=duration,
        total_input_tokens=sum(r.prompt_tokens or 0 for r in good_recs),
        total_output_tokens=sum(r.output_tokens or 0 for r in good_recs),
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
    tails = {name: tail(latencies_ms.get(name, [])) for name in LATENCIES}
    for name in LATENCIES:
        out.update(latency_stats(name, latencies_ms.get(name, []), tails[name]))
    for name in LATENCIES:
        out.update(tail_columns(name, tails[name]))
    out["achieved_concurrency"] = None
    out["mean_in_flight"] = None
    return out
