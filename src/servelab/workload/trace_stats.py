"""The statistics of a request trace over time (servelab.workload.trace's rows): its windows,
the busiest one, the request rate minute by minute, length percentiles, and a figure of them.
servelab.workload.trace takes the busiest window from here (workload.trace.busiest), so this
module reads rows only through what they have (`Timed`, `Request`), never that module;
servelab.workload.trace_summary adds the prefix reuse and the fit to a server for
`servelab trace stats`.

A window is the requests with `start <= timestamp < start + duration` (servelab.workload.trace's
window, before any max-model-len filter); the whole trace runs from 0 to its last request, that
one included. The busiest window of S seconds (`busiest_start_ms`) starts at a request's
timestamp. Length percentiles are nearest-rank: the p-th is the smallest length that at least
p% of the requests have or stay under, a length some request has. A failed request (a trace's
record of a request that got no response, output_length 0) is an arrival: it counts in the
rate and the busiest window, and nowhere else (lengths, reuse and fits are over the requests a
replay sends).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol, TypeVar

from servelab.errors import ServelabError

QUANTILES = (50, 90, 99)
MINUTE_MS = 60_000


class Timed(Protocol):
    """A request of a trace as the window sees it: its timestamp, ms after the trace's first
    request (servelab.workload.trace.TraceRow is one)."""

    @property
    def timestamp(self) -> int | float: ...


class Request(Timed, Protocol):
    """A request of a trace with its lengths in tokens, and whether the trace records it as
    failed (never replayed)."""

    @property
    def input_length(self) -> int: ...

    @property
    def output_length(self) -> int: ...

    @property
    def failed(self) -> bool: ...


T = TypeVar("T", bound=Timed)


# --- the window ------------------------------------------------------------------------


def busiest_start_ms(rows: Sequence[Timed], seconds: float) -> int | float:
    """The start of the `seconds`-long window [start, start + seconds) that holds the most of
    `rows` (in timestamp order, as read_trace gives them), a request's timestamp; of windows
    that hold as many, the earliest. Every row counts, failed ones too. Exact (the timestamps
    as fractions) and linear: two pointers over the rows."""
    if not rows:
        raise ServelabError("the busiest window: the trace holds no request")
    if not (seconds > 0 and math.isfinite(seconds)):
        raise ServelabError(f"the busiest window: {seconds:g} s; give a length above 0 seconds")
    width = Fraction(seconds) * 1000
    ts = [Fraction(r.timestamp) for r in rows]
    best, most, end = 0, 0, 0
    for i, t in enumerate(ts):
        end = max(end, i)
        while end < len(ts) and ts[end] - t < width:
            end += 1
        if end - i > most:
            best, most = i, end - i
    return rows[best].timestamp


@dataclass(frozen=True)
class Span:
    """A window of the trace: from `start_ms`, `duration_ms` long; `label` says how it was
    chosen; `closed`: the request at its end counts in it (the whole trace's last one)."""

    start_ms: Fraction
    duration_ms: Fraction
    label: str
    closed: bool = False

    def holds(self, timestamp: int | float) -> bool:
        t = Fraction(timestamp) - self.start_ms
        return t >= 0 and (t < self.duration_ms or (self.closed and t == self.duration_ms))


def parse_window(text: str) -> tuple[float, float | None]:
    """START:DURATION in seconds (`600:60`; `600:` runs to the trace's end) as (start,
    duration); anything else a one-line error."""
    start, sep, duration = text.partition(":")
    try:
        s = float(start)
        d = float(duration) if duration.strip() else None
    except ValueError:
        s, d = math.nan, None
    if not sep or not math.isfinite(s) or s < 0 or (d is not None and not (0 < d < math.inf)):
        raise ServelabError(
            f"--window {text}: give START:DURATION in seconds (e.g. 600:60; 600: to the end)"
        )
    return s, d


def choose_window(
    rows: Sequence[T], window: str | None, busiest: float | None
) -> tuple[list[T], Span]:
    """The requests of the window `--window START:DURATION` or `--busiest SECONDS` names
    (neither: the whole trace) and the window itself; a window without a request is a one-line
    error that gives the trace's span."""
    if not rows:
        raise ServelabError("the trace holds no request")
    first, last = Fraction(rows[0].timestamp), Fraction(rows[-1].timestamp)
    if busiest is not None:
        start = Fraction(busiest_start_ms(rows, busiest))
        span = Span(start, Fraction(busiest) * 1000, f"the busiest {busiest:g} s")
    elif window is not None:
        s, d = parse_window(window)
        start = Fraction(s) * 1000
        if d is None:
            span = Span(start, max(last - start, Fraction(0)), f"--window {window}", closed=True)
        else:
            span = Span(start, Fraction(d) * 1000, f"--window {window}")
    else:
        span = Span(Fraction(0), last, "the whole trace", closed=True)
    inside = [r for r in rows if span.holds(r.timestamp)]
    if not inside:
        raise ServelabError(
            f"{span.label}: no request in it (the trace spans "
            f"{seconds_text(first)}-{seconds_text(last)} s); "
            "choose a window inside it"
        )
    return inside, span


def seconds_text(ms: Fraction | float) -> str:
    """Milliseconds as seconds, for people: `2,472.5` (up to 3 decimals, no trailing zeros)."""
    return f"{float(ms) / 1000:,.3f}".rstrip("0").rstrip(".")


# --- rate and lengths --------------------------------------------------------------------


def nearest_rank(values: Sequence[int], p: float) -> int:
    """The p-th percentile of sorted `values`, nearest-rank: the value at rank ceil(p/100 x n)
    (at least 1)."""
    return values[max(1, math.ceil(Fraction(p) / 100 * len(values))) - 1]


@dataclass(frozen=True)
class Lengths:
    """A length's nearest-rank percentiles (QUANTILES), largest and mean, in tokens."""

    quantiles: dict[int, int]
    max: int
    mean: float

    @staticmethod
    def of(values: Sequence[int]) -> Lengths | None:
        """The lengths' summary; None without any."""
        if not values:
            return None
        v = sorted(values)
        return Lengths({p: nearest_rank(v, p) for p in QUANTILES}, v[-1], sum(v) / len(v))


@dataclass(frozen=True)
class RateBin:
    """The requests of one minute of the window, from `minute` x 60 s after its start, over
    `seconds` of it (the last minute may be shorter)."""

    minute: int
    requests: int
    seconds: Fraction

    @property
    def rate(self) -> float | None:
        """Requests per second (None for a minute of no length)."""
        return float(self.requests / self.seconds) if self.seconds else None


def rate_bins(rows: Sequence[Timed], span: Span) -> list[RateBin]:
    """The window's requests per minute, every minute of it (the empty ones too)."""
    n = max(1, math.ceil(span.duration_ms / MINUTE_MS))
    counts = [0] * n
    for r in rows:
        counts[min(n - 1, math.floor((Fraction(r.timestamp) - span.start_ms) / MINUTE_MS))] += 1
    return [
        RateBin(i, c, min(Fraction(MINUTE_MS), span.duration_ms - i * MINUTE_MS) / 1000)
        for i, c in enumerate(counts)
    ]


# --- the figure ------------------------------------------------------------------------


def stats_png(rows: Sequence[Request], span: Span, title: str) -> bytes:
    """Two panels over the window's minutes: the request rate per minute, and each request's
    input and output length at its arrival (log scale), as PNG bytes in servelab's figure
    style (servelab.render: same rows, same bytes)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from servelab.render import figure_bytes, figure_style

    bins = rate_bins(rows, span)
    sent = [r for r in rows if not r.failed]
    x = [float((Fraction(r.timestamp) - span.start_ms) / MINUTE_MS) for r in sent]
    with figure_style():
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(8.0, 6.0), sharex=True)
        top.bar(
            [b.minute + 0.5 for b in bins],
            [b.rate or 0.0 for b in bins],
            width=1.0,
            color="C0",
            edgecolor="white",
        )
        top.set_ylabel("requests / s (per minute)")
        top.set_title(title)
        bottom.scatter(x, [r.input_length for r in sent], s=3, color="C0", label="input")
        bottom.scatter(x, [r.output_length for r in sent], s=3, color="C1", label="output")
        bottom.set_yscale("log")
        bottom.set_ylabel("length (tokens)")
        bottom.set_xlabel(f"minutes after {seconds_text(span.start_ms)} s")
        bottom.legend(loc="upper right", markerscale=3)
        fig.tight_layout()
        return figure_bytes(fig, "png")
