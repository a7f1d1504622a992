"""The check that a point measured a steady state (`steady_state`): do its latencies trend
upward over the point?

A point's latency percentiles describe the server at its load only when that load settled
over the point. An open loop driven past the server's capacity builds a queue that grows with
every request, so each request waits longer than the one sent before it; a warm-up too short,
or a cache that fills during the point, do the same on a smaller scale. Such a point measured
a transient: its percentiles depend on how long it lasted, and describe nothing stable.

The test reads a point's successful requests in send order (`sent_epoch_ns`; an open loop's
scheduled send), their TTFT and, separately, their E2EL as the metrics count them
(servelab.metrics.request_latencies), per output token where the requests' output lengths
differ (`e2el_series`: a trace's own lengths may trend, and a queue lengthens E2EL per token
as much as E2EL):

- Mann-Kendall's trend test: S, the number of later requests slower than an earlier one minus
  those faster, over every pair; its variance under no trend with the correction for ties,
  n(n-1)(2n+5)/18 less t(t-1)(2t+5)/18 for each group of t equal latencies; the normal
  approximation with a continuity correction, z = (S - 1)/sd for S > 0, (S + 1)/sd for S < 0;
  and its two-sided p-value;
- the size of the trend: Sen's slope (the median over every pair of requests of their latency
  difference over their distance in send order) x (n - 1), the fitted change from the first
  request to the last, as a share of the latencies' median.

The point fails when TTFT or E2EL grows significantly (p below
`analysis.validity.latency_trend_alpha`) by more than `analysis.validity.max_latency_trend` of
its median; a falling trend (a queue draining) never fails. The
test counts pairs, O(n^2) in time and memory: a few thousand requests take well under a
second.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from servelab.analysis.validity.facts import PointFacts, RequestFacts
from servelab.analysis.validity.flags import FAILED, NOT_CHECKED, PASSED, Flag, number_text
from servelab.experiment import ValiditySection

# fewer successful requests than this leave the point not checked: the normal approximation
# of Mann-Kendall's S is poor below it
MIN_REQUESTS = 10


@dataclass(frozen=True)
class Trend:
    """A series' monotonic trend: Mann-Kendall's S, its tie-corrected variance and two-sided
    p-value (normal approximation, continuity corrected), and Sen's slope (change per step of
    the series) beside the series' median."""

    n: int
    s: int
    var_s: float
    p: float
    slope: float
    median: float

    @property
    def z(self) -> float:
        """The standard normal score of S, continuity corrected; 0 for S = 0 or no variance."""
        return _z(self.s, self.var_s)

    @property
    def change(self) -> float:
        """The fitted change from the first value to the last: Sen's slope x (n - 1)."""
        return self.slope * (self.n - 1)

    @property
    def relative(self) -> float | None:
        """The fitted change as a share of the median (1.0: it grew by its median across the
        series); None when the median is not above 0."""
        return self.change / self.median if self.median > 0 else None


def _z(s: int, var_s: float) -> float:
    if s == 0 or var_s <= 0:
        return 0.0
    return (s - 1 if s > 0 else s + 1) / math.sqrt(var_s)


def _pair_slopes(x: np.ndarray) -> np.ndarray:
    """(x[j] - x[i]) / (j - i) for every pair i < j, row by row (n(n - 1)/2 values)."""
    n = len(x)
    out = np.empty(n * (n - 1) // 2, dtype=np.float64)
    at = 0
    steps = np.arange(1, n, dtype=np.float64)
    for i in range(n - 1):
        k = n - 1 - i
        np.divide(x[i + 1 :] - x[i], steps[:k], out=out[at : at + k])
        at += k
    return out


def tie_sum(x: np.ndarray) -> float:
    """The ties' share of S's variance (x 18): t(t - 1)(2t + 5) over each group of t equal
    values."""
    _, counts = np.unique(x, return_counts=True)
    t = counts[counts > 1].astype(np.float64)
    return float(np.sum(t * (t - 1) * (2 * t + 5)))


def trend(values: Sequence[float] | np.ndarray) -> Trend:
    """Mann-Kendall's test and Sen's slope of `values`, in their order; at least two values."""
    x = np.asarray(values, dtype=np.float64)
    n = len(x)
    if n < 2:
        raise ValueError(f"a trend needs at least 2 values, got {n}")
    slopes = _pair_slopes(x)
    s = int(np.count_nonzero(slopes > 0)) - int(np.count_nonzero(slopes < 0))
    var_s = (n * (n - 1) * (2 * n + 5) - tie_sum(x)) / 18.0
    p = math.erfc(abs(_z(s, var_s)) / math.sqrt(2.0))
    slope = float(np.median(slopes, overwrite_input=True))
    return Trend(n, s, var_s, min(1.0, p), slope, float(np.median(x)))


def send_order(requests: Sequence[RequestFacts]) -> list[RequestFacts]:
    """The requests the check reads, in send order: the completed ones with a TTFT and an E2EL,
    a chat's first turns only (a later turn's prompt holds the conversation so far, and grows
    by design), sorted by send time when every one has it, else as recorded."""
    done = [
        r
        for r in requests
        if r.ttft_ms is not None and r.e2el_ms is not None and (r.turn is None or r.turn == 1)
    ]
    if all(r.sent_ns is not None for r in done):
        return sorted(done, key=lambda r: int(r.sent_ns or 0))  # stable: ties as recorded
    return done


def e2el_series(reqs: Sequence[RequestFacts]) -> dict[str, list[float]]:
    """The E2EL series the check reads: each request's E2EL where every request generated as
    many tokens; where their output lengths differ (a trace, a dataset, drawn lengths), E2EL
    per output token, so that a workload whose own lengths trend (a trace whose later replies
    are longer) is not taken for a growing queue, which lengthens it per token alike."""
    outs = {r.output_tokens for r in reqs}
    if len(outs) <= 1:
        return {"E2EL": [float(r.e2el_ms or 0.0) for r in reqs]}
    return {
        "E2EL per output token": [
            float(r.e2el_ms or 0.0) / max(1, r.output_tokens or 0) for r in reqs
        ]
    }


def _pct(share: float | None) -> str:
    if share is None:
        return "n/a (median 0)"
    v = 100.0 * share
    return f"{v:+.0f}%" if abs(v) >= 10 else f"{v:+.2g}%"


def check_steady_state(f: PointFacts, t: ValiditySection) -> Flag:
    limit = float(t.max_latency_trend)
    alpha = float(t.latency_trend_alpha)
    reqs = send_order(f.requests)
    n = len(reqs)
    if n < MIN_REQUESTS:
        what = "first turns" if f.chat_turns and f.chat_turns > 1 else "requests"
        why = f"{n} successful {what}: the trend test needs at least {MIN_REQUESTS}"
        return Flag("steady_state", NOT_CHECKED, None, limit, why)
    series = {"TTFT": [float(r.ttft_ms or 0.0) for r in reqs], **e2el_series(reqs)}
    trends = {name: trend(values) for name, values in series.items()}
    grew = [
        name
        for name, tr in trends.items()
        if tr.p < alpha and tr.relative is not None and tr.relative > limit
    ]
    sizes = [tr.relative for name, tr in trends.items() if tr.relative is not None]
    grown = [r for name in grew if (r := trends[name].relative) is not None]
    value = max(grown) if grown else (max(sizes) if sizes else None)
    (first_name, first), (second_name, second) = trends.items()
    said = (
        f"fitted change across {n} requests in send order, as a share of the median: "
        f"{first_name} {_pct(first.relative)} (Mann-Kendall p {first.p:.2g}), "
        f"{second_name} {_pct(second.relative)} (p {second.p:.2g})"
    )
    if grew:
        why = (
            f"{said}: {' and '.join(grew)} grew over the point, not a steady state "
            f"(limit {number_text(100 * limit)}% at p < {number_text(alpha)})"
        )
        return Flag("steady_state", FAILED, value, limit, why)
    return Flag("steady_state", PASSED, value, limit, said)
