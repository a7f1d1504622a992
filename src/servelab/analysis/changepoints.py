"""Change points of one metric at one point over a history of releases.

A series holds, release by release in release order, the valid repeats of one metric at one
point. `step_fit` finds where its level changed; `change_points` does so in the host's speed
terms as well (each release's canary, analysis.hostspeed) and says whose change each one is.

The method is a penalised step fit, as asv (airspeed velocity) fits the history of a benchmark:
a piecewise-constant level through the releases' means, chosen to minimise the weighted squared
misfit plus a fixed penalty per step, solved exactly by dynamic programming over every
segmentation (a history has tens of releases, so the O(k^2) search is instant). It works on the
logarithms of the repeats, so a level is a geometric mean and a step a ratio, as every other
comparison of servelab reads a change (stats.two_sample). Each release's mean weighs by its
repeats over the within-release variance, pooled over the series' releases (three repeats give
too unsteady a variance for a weight of its own, and one release with three near-equal repeats
would otherwise pin the fit). The misfit is then in units of squared standard errors: a single
step reduces it by the squared two-sample t of the segments either side, so a penalty of
`PENALTY` = 16 keeps a step only when it stands 4 standard errors clear of no step. A kept step
must also reach the analysis's practical threshold (`threshold_pct`), as every change does;
steps below it are merged away, the smallest first.

Why a step fit and not E-Divisive means: the same data give the same answer without a seed or a
permutation count, the answer is the exact optimum rather than a greedy bisection, and E-Divisive's
permutation test has too few distinct permutations to reach a small p-value on a history of 3 to
6 releases. The rates, from seeded simulations (tests/test_changepoints.py; docs/analysis.md,
"Change points over a history"): on flat histories of 3 to 12 releases of 3 repeats, 0.3 to 1.6%
of series show a change point; a 30% step is found at its release in 99% of histories at a 5%
spread of the repeats.

The canary (`change_points`): where every release of the series records its host speed (with
the same canary work), each release's values are first put in host-speed-normalised terms,
against the first release's host (analysis.hostspeed.host_ratio): a throughput divided by the
host ratio, a latency multiplied by it. A change point of the normalised series is the code's
(or the setup's): "changed beyond what the host explains"; one of the raw series that is gone
once normalised is the host's: "changed as much as the host's speed did (not attributed to the
code)". Where a release records no canary, every change point is a change with "host speed not
recorded", never a verdict on the code. The answers are analysis.hostspeed's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from servelab.analysis.hostspeed import (
    AS_HOST,
    BEYOND_HOST,
    HOST_NOT_RECORDED,
    SCALES_WITH_SPEED,
    HostSpeed,
    host_ratio,
)

NO_CHANGE = "no change point"
CHANGED = "changed"
TOO_FEW = "too few releases"
TOO_FEW_REPEATS = "too few repeats"  # no release with two repeats: no spread to weigh by
NOT_POSITIVE = "not tested (a value is not positive)"  # the fit works on logarithms
ANSWERS = (CHANGED, NO_CHANGE, TOO_FEW, TOO_FEW_REPEATS, NOT_POSITIVE)
MIN_RELEASES = 3
PENALTY = 16.0  # per step, in squared standard errors: a step must stand 4 of them clear
# the smallest within-release spread (sd of the logs) a weight assumes: repeats that agree to
# 0.1% make a step of that size no more certain than 0.1% of noise would
SD_FLOOR = 1e-3
METHOD = "step fit"


@dataclass(frozen=True)
class Step:
    """A step of the fit before release `at` (the first release of the new level): `ratio` the
    level after over the level before (geometric means of the segments' repeats), `z` the step
    in standard errors of the difference."""

    at: int
    ratio: float
    z: float


@dataclass(frozen=True)
class StepFit:
    """A series' fit: `answer` (one of ANSWERS), its steps in order, and each segment's level
    (the geometric mean of its repeats)."""

    answer: str
    steps: tuple[Step, ...]
    levels: tuple[float, ...]


class _Logs:
    """A series on the log scale: each release's repeats, mean and count, prefix sums of the
    weighted means for a segment's misfit in O(1), and the pooled within-release variance."""

    def __init__(self, values: Sequence[Sequence[float]]) -> None:
        logs = [[math.log(x) for x in v] for v in values]
        self.n = [len(v) for v in logs]
        self.mean = [sum(v) / len(v) for v in logs]
        ss = sum(sum((x - m) ** 2 for x in v) for v, m in zip(logs, self.mean, strict=True))
        self.df = sum(n - 1 for n in self.n)
        self.var = max(ss / self.df if self.df else 0.0, SD_FLOOR**2)
        self.w, self.wy, self.wyy = [0.0], [0.0], [0.0]
        for n, m in zip(self.n, self.mean, strict=True):
            self.w.append(self.w[-1] + n)
            self.wy.append(self.wy[-1] + n * m)
            self.wyy.append(self.wyy[-1] + n * m * m)

    def level(self, a: int, b: int) -> float:
        """The log level of releases a..b-1 (their repeats' mean)."""
        return (self.wy[b] - self.wy[a]) / (self.w[b] - self.w[a])

    def misfit(self, a: int, b: int) -> float:
        """Releases a..b-1 about their level, in squared standard errors."""
        w, wy = self.w[b] - self.w[a], self.wy[b] - self.wy[a]
        return max(0.0, (self.wyy[b] - self.wyy[a]) - wy * wy / w) / self.var

    def z(self, a: int, at: int, b: int) -> float:
        """The step at `at` between segments a..at-1 and at..b-1, in standard errors."""
        n1, n2 = self.w[at] - self.w[a], self.w[b] - self.w[at]
        se = math.sqrt(self.var * (1.0 / n1 + 1.0 / n2))
        return (self.level(at, b) - self.level(a, at)) / se


def _best(logs: _Logs, penalty: float) -> list[int]:
    """The exact optimum of misfit + penalty x steps over every segmentation: the releases
    where a new level starts (dynamic programming; ties go to the earlier, fewer steps)."""
    k = len(logs.n)
    best = [0.0] + [math.inf] * k
    start = [0] * (k + 1)
    for b in range(1, k + 1):
        for a in range(b):
            cost = best[a] + logs.misfit(a, b) + (penalty if a else 0.0)
            if cost < best[b] - 1e-9:
                best[b], start[b] = cost, a
    cuts, b = [], k
    while b > 0:
        b = start[b]
        if b:
            cuts.append(b)
    return sorted(cuts)


def _merge_small(logs: _Logs, cuts: list[int], threshold_pct: float) -> list[int]:
    """`cuts` without the steps below the practical threshold, the smallest merged first (the
    levels either side of a merge are refitted)."""
    cuts = list(cuts)
    limit = math.log1p(threshold_pct / 100.0)
    while cuts:
        bounds = [0, *cuts, len(logs.n)]
        sizes = [
            abs(logs.level(bounds[j + 1], bounds[j + 2]) - logs.level(bounds[j], bounds[j + 1]))
            for j in range(len(cuts))
        ]
        j = min(range(len(cuts)), key=lambda i: (sizes[i], i))
        if sizes[j] >= limit:
            break
        del cuts[j]
    return cuts


def step_fit(
    values: Sequence[Sequence[float]], threshold_pct: float, penalty: float = PENALTY
) -> StepFit:
    """The step fit of a series (each release's repeats, in release order; a release without
    one is left out): its change points, or why there is none (`answer`)."""
    values = [v for v in values if v]
    if len(values) < MIN_RELEASES:
        return StepFit(TOO_FEW, (), ())
    if any(not x > 0 for v in values for x in v):
        return StepFit(NOT_POSITIVE, (), ())
    logs = _Logs(values)
    if logs.df == 0:
        return StepFit(TOO_FEW_REPEATS, (), ())
    cuts = _merge_small(logs, _best(logs, penalty), threshold_pct)
    bounds = [0, *cuts, len(values)]
    levels = tuple(math.exp(logs.level(a, b)) for a, b in zip(bounds, bounds[1:], strict=False))
    steps = tuple(
        Step(at, levels[j + 1] / levels[j], logs.z(bounds[j], at, bounds[j + 2]))
        for j, at in enumerate(cuts)
    )
    return StepFit(CHANGED if steps else NO_CHANGE, steps, levels)


@dataclass(frozen=True)
class ChangePoint:
    """A change point before release `at`: its change of the level in % (as measured), the
    same in the host's speed terms (None when not normalised), whose it is (`answer`, one of
    analysis.hostspeed's answers but unchanged), and for a change beyond the host's speed,
    `direction` ("better" or "worse", by the metric)."""

    at: int
    change_pct: float
    normalised_pct: float | None
    answer: str
    direction: str | None = None


@dataclass(frozen=True)
class ChangePoints:
    """A series' change points: `answer` (one of ANSWERS), the points in order, and whether
    the series was put in the host's speed terms (`normalised`)."""

    answer: str
    points: tuple[ChangePoint, ...]
    normalised: bool


def host_factors(hosts: Sequence[HostSpeed | None]) -> list[float] | None:
    """Each release's host speed over the first release's (analysis.hostspeed.host_ratio);
    None unless every release records a canary of the same work."""
    if not hosts or hosts[0] is None:
        return None
    ratios = [host_ratio(hosts[0], h) for h in hosts]
    if any(r is None for r in ratios):
        return None
    return [r.ratio for r in ratios if r is not None]


def normalise(metric: str, values: Sequence[float], factor: float) -> list[float]:
    """One release's values in the host's speed terms of the reference release, its host
    `factor` times as fast: a throughput divided by it, a latency multiplied by it."""
    if metric in SCALES_WITH_SPEED:
        return [x / factor for x in values]
    return [x * factor for x in values]


def _pct(logs: _Logs, at: int, cuts: list[int]) -> float:
    """The change of `logs`' level at `at` between the segments of `cuts` either side, in %."""
    bounds = [0, *cuts, len(logs.n)]
    j = bounds.index(at)
    before, after = logs.level(bounds[j - 1], at), logs.level(at, bounds[j + 1])
    return 100.0 * math.expm1(after - before)


def change_points(
    metric: str,
    values: Sequence[Sequence[float]],
    hosts: Sequence[HostSpeed | None],
    threshold_pct: float,
) -> ChangePoints:
    """The change points of `metric`'s series `values` (each release's repeats, in release
    order, none empty), with each release's host speed `hosts` (None where it records none):
    each change the code's, the host's, or a change with the host speed not recorded."""
    raw = step_fit(values, threshold_pct)
    if raw.answer not in (CHANGED, NO_CHANGE):
        return ChangePoints(raw.answer, (), False)
    factors = host_factors(hosts)
    if factors is None:
        points = tuple(
            ChangePoint(s.at, 100.0 * (s.ratio - 1.0), None, HOST_NOT_RECORDED) for s in raw.steps
        )
        return ChangePoints(CHANGED if points else NO_CHANGE, points, False)
    scaled = [normalise(metric, v, f) for v, f in zip(values, factors, strict=True)]
    fit = step_fit(scaled, threshold_pct)
    raw_logs, scaled_logs = _Logs(values), _Logs(scaled)
    cuts = [s.at for s in fit.steps]
    found = {
        s.at: ChangePoint(
            s.at,
            _pct(raw_logs, s.at, cuts),
            100.0 * (s.ratio - 1.0),
            BEYOND_HOST,
            _direction(metric, s.ratio),
        )
        for s in fit.steps
    }
    raw_cuts = [s.at for s in raw.steps]
    for s in raw.steps:
        if s.at not in found:
            host = _pct(scaled_logs, s.at, raw_cuts)
            found[s.at] = ChangePoint(s.at, 100.0 * (s.ratio - 1.0), host, AS_HOST)
    points = tuple(found[at] for at in sorted(found))
    return ChangePoints(CHANGED if points else NO_CHANGE, points, True)


def _direction(metric: str, ratio: float) -> str:
    """Which way a change of `metric` by `ratio` (after / before) goes for the reader."""
    up = ratio > 1.0
    return "better" if up == (metric in SCALES_WITH_SPEED) else "worse"
