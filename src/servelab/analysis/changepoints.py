"""Change points of one metric at one point over a history of releases.

A series holds, release by release in release order, the valid repeats of one metric at one
point. `step_fit` finds where its level changed; `change_points` says whose change each one
is, by the host-speed gate of analysis.hostspeed. The series is never rescaled by the canary.

The method is a penalised step fit, as asv (airspeed velocity) fits the history of a benchmark:
a piecewise-constant level through the releases' means, on the logarithms of the repeats (a
level is a geometric mean, a step a ratio, as every comparison of servelab reads a change).

The variance of a release's mean has two parts. Within: the repeats' variance s^2, pooled over
the series' releases (three repeats give too unsteady a variance for a weight of its own), over
the release's n_i repeats. Between: tau^2, how far a release's level strays from the level of
its segment though the code did not change (two quiet runs of the same code differ by more
than their repeats say). Each release weighs w_i = 1 / (s^2 / n_i + tau^2). tau^2 is estimated
by the method of moments of DerSimonian and Laird, around a segment fit: with the weights
v_i = n_i / s^2, Q = sum of v_i (mean_i - level_i)^2 about each segment's v-weighted level,
df = releases - segments, and C = sum over segments of (sum v - sum v^2 / sum v),
tau^2 = max(0, (Q - df) / C).

The fit: for each number of steps j from 0 to releases - 2 (a segment fit keeps a degree of
freedom for tau^2), the best j-step segmentation (least weighted squares, by dynamic
programming), tau^2_j around it, and the segmentation refitted once with those weights; then the
j of the least

    sum over releases of ln(s^2 / n_i + tau^2_j) + sum of w_i (mean_i - level_i)^2 + PENALTY j

(minus twice the log-likelihood of the releases' means, plus PENALTY = 16 per step; ties go to
fewer steps). With tau^2 = 0 a step must stand 4 standard errors clear of none, as before; where
the releases scatter beyond their repeats, tau^2 widens every standard error and a step must
stand clear of that scatter too. A kept step must also reach the analysis's practical threshold
(`threshold_pct`); smaller ones are merged away, the smallest first, and tau^2 and the levels
refitted.

An excursion: a segment of one release whose steps either side go opposite ways and whose
neighbours' levels differ by less than the practical threshold (a step up and back down at the
next release) is one change point of kind "excursion" at that release, not two level changes.

Whose change (`change_points`): each change point's step, in speed terms, with its 95% interval
(the level ratio +- 1.96 standard errors, tau^2 included), is judged by analysis.hostspeed.judge
against the host ratio between the two releases either side (for an excursion, the release
before it and the release itself): beyond the host, as the host's speed, or UNKNOWN with the
rerun command naming those two releases; "host speed not recorded" where either records no
canary.

Rates, from seeded simulations (tests/test_changepoints.py, benchmarks/bench_crossrun.py;
docs/analysis.md, "Change points over a history").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from servelab.analysis.equivalence import DEFAULT_MARGIN_PCT
from servelab.analysis.hostspeed import (
    HOST_NOT_RECORDED,
    SCALES_WITH_SPEED,
    Z95,
    Gate,
    HostSpeed,
    host_ratio,
    judge,
    rerun_command,
)

NO_CHANGE = "no change point"
CHANGED = "changed"
TOO_FEW = "too few releases"
TOO_FEW_REPEATS = "too few repeats"  # no release with two repeats: no spread to weigh by
NOT_POSITIVE = "not tested (a value is not positive)"  # the fit works on logarithms
ANSWERS = (CHANGED, NO_CHANGE, TOO_FEW, TOO_FEW_REPEATS, NOT_POSITIVE)
STEP, EXCURSION = "step", "excursion"
MIN_RELEASES = 3
PENALTY = 16.0  # per step, in squared standard errors: a step must stand 4 of them clear
# the smallest within-release spread (sd of the logs) a weight assumes: repeats that agree to
# 0.1% make a step of that size no more certain than 0.1% of noise would
SD_FLOOR = 1e-3
METHOD = "step fit, between-release variance by DerSimonian-Laird"


@dataclass(frozen=True)
class Step:
    """A step of the fit before release `at` (the first release of the new level): `ratio` the
    level after over the level before, `z` the step in standard errors of the difference
    (between-release variance included), `se` that standard error (on logs)."""

    at: int
    ratio: float
    z: float
    se: float = 0.0


@dataclass(frozen=True)
class StepFit:
    """A series' fit: `answer` (one of ANSWERS), its steps in order, each segment's level (the
    weighted geometric mean of its releases), and the between-release variance (logs)."""

    answer: str
    steps: tuple[Step, ...]
    levels: tuple[float, ...]
    tau2: float = 0.0


class _Logs:
    """A series on the log scale: each release's mean and count, the pooled within-release
    variance, and, for a between-release variance `tau2`, each release's weight with prefix
    sums for a segment's level and misfit in O(1)."""

    def __init__(self, values: Sequence[Sequence[float]], tau2: float = 0.0) -> None:
        logs = [[math.log(x) for x in v] for v in values]
        self.n = [len(v) for v in logs]
        self.mean = [sum(v) / len(v) for v in logs]
        ss = sum(sum((x - m) ** 2 for x in v) for v, m in zip(logs, self.mean, strict=True))
        self.df = sum(n - 1 for n in self.n)
        self.var = max(ss / self.df if self.df else 0.0, SD_FLOOR**2)
        self.reweigh(tau2)

    def reweigh(self, tau2: float) -> None:
        self.tau2 = tau2
        self.v = [self.var / n + tau2 for n in self.n]  # each release mean's variance
        self.w, self.wy, self.wyy = [0.0], [0.0], [0.0]
        for v, m in zip(self.v, self.mean, strict=True):
            self.w.append(self.w[-1] + 1.0 / v)
            self.wy.append(self.wy[-1] + m / v)
            self.wyy.append(self.wyy[-1] + m * m / v)

    def level(self, a: int, b: int) -> float:
        """The log level of releases a..b-1 (their weighted mean)."""
        return (self.wy[b] - self.wy[a]) / (self.w[b] - self.w[a])

    def misfit(self, a: int, b: int) -> float:
        """Releases a..b-1 about their level, in squared standard errors."""
        w, wy = self.w[b] - self.w[a], self.wy[b] - self.wy[a]
        return max(0.0, (self.wyy[b] - self.wyy[a]) - wy * wy / w)

    def se(self, a: int, at: int, b: int) -> float:
        """The standard error of the step at `at` between segments a..at-1 and at..b-1."""
        return math.sqrt(1.0 / (self.w[at] - self.w[a]) + 1.0 / (self.w[b] - self.w[at]))

    def criterion(self, cuts: list[int], penalty: float) -> float:
        """-2 log-likelihood of the releases' means under `cuts`, plus the penalty per step."""
        bounds = [0, *cuts, len(self.n)]
        misfit = sum(self.misfit(a, b) for a, b in zip(bounds, bounds[1:], strict=False))
        return sum(math.log(v) for v in self.v) + misfit + penalty * len(cuts)


def _tau2(values: Sequence[Sequence[float]], cuts: list[int]) -> float:
    """The DerSimonian-Laird between-release variance about the segments of `cuts` (module
    docstring); 0 without a degree of freedom left."""
    within = _Logs(values)
    bounds = [0, *cuts, len(within.n)]
    df = len(within.n) - (len(cuts) + 1)
    q = sum(within.misfit(a, b) for a, b in zip(bounds, bounds[1:], strict=False))
    c = 0.0
    for a, b in zip(bounds, bounds[1:], strict=False):
        ws = [1.0 / v for v in within.v[a:b]]
        c += sum(ws) - sum(x * x for x in ws) / sum(ws)
    return max(0.0, (q - df) / c) if df > 0 and c > 0 else 0.0


def _best(logs: _Logs, steps: int) -> list[int]:
    """The least-misfit segmentation with exactly `steps` steps (dynamic programming over
    every segmentation; ties go to the earlier cut)."""
    k = len(logs.n)
    best = [[math.inf] * (k + 1) for _ in range(steps + 1)]
    start = [[0] * (k + 1) for _ in range(steps + 1)]
    for b in range(1, k + 1):
        best[0][b] = logs.misfit(0, b)
    for j in range(1, steps + 1):
        for b in range(j + 1, k + 1):
            for a in range(j, b):
                cost = best[j - 1][a] + logs.misfit(a, b)
                if cost < best[j][b] - 1e-12:
                    best[j][b], start[j][b] = cost, a
    cuts, b = [], k
    for j in range(steps, 0, -1):
        b = start[j][b]
        cuts.append(b)
    return sorted(cuts)


def _with_steps(values: Sequence[Sequence[float]], steps: int) -> tuple[list[int], float]:
    """The `steps`-step segmentation and its tau^2: fitted at tau^2 = 0, tau^2 estimated around
    it, refitted once with those weights and tau^2 estimated again."""
    cuts = _best(_Logs(values), steps)
    tau2 = _tau2(values, cuts)
    cuts = _best(_Logs(values, tau2), steps)
    return cuts, _tau2(values, cuts)


def _select(values: Sequence[Sequence[float]], penalty: float) -> tuple[list[int], float]:
    """The number of steps (0 to releases - 2) of the least criterion, its cuts and tau^2."""
    found: tuple[float, list[int], float] | None = None
    for steps in range(len(values) - 1):
        cuts, tau2 = _with_steps(values, steps)
        score = _Logs(values, tau2).criterion(cuts, penalty)
        if found is None or score < found[0] - 1e-9:
            found = (score, cuts, tau2)
    assert found is not None
    return found[1], found[2]


def _merge_small(
    values: Sequence[Sequence[float]], cuts: list[int], threshold_pct: float
) -> tuple[list[int], _Logs]:
    """`cuts` without the steps below the practical threshold, the smallest merged first (tau^2
    and the levels either side of a merge refitted), with the final weights."""
    cuts = list(cuts)
    limit = math.log1p(threshold_pct / 100.0)
    while True:
        logs = _Logs(values, _tau2(values, cuts))
        if not cuts:
            return cuts, logs
        bounds = [0, *cuts, len(logs.n)]
        sizes = [
            abs(logs.level(bounds[j + 1], bounds[j + 2]) - logs.level(bounds[j], bounds[j + 1]))
            for j in range(len(cuts))
        ]
        j = min(range(len(cuts)), key=lambda i: (sizes[i], i))
        if sizes[j] >= limit:
            return cuts, logs
        del cuts[j]


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
    if _Logs(values).df == 0:
        return StepFit(TOO_FEW_REPEATS, (), ())
    cuts, logs = _merge_small(values, _select(values, penalty)[0], threshold_pct)
    bounds = [0, *cuts, len(values)]
    levels = tuple(math.exp(logs.level(a, b)) for a, b in zip(bounds, bounds[1:], strict=False))
    steps = []
    for j, at in enumerate(cuts):
        se = logs.se(bounds[j], at, bounds[j + 2])
        ratio = levels[j + 1] / levels[j]
        steps.append(Step(at, ratio, math.log(ratio) / se, se))
    return StepFit(CHANGED if steps else NO_CHANGE, tuple(steps), levels, logs.tau2)


@dataclass(frozen=True)
class ChangePoint:
    """A change point at release `at`: its `kind` (a "step" to a new level starting at `at`, or
    an "excursion" of release `at` alone, up and back or down and back), its change of the
    level in % as measured (an excursion's: its level over the level before it), whose it is
    (`answer`: analysis.hostspeed's), `direction` ("better" or "worse", by the metric) beyond
    the host, `vs_host_pct` the change over the host ratio's in % (None without one), and for
    UNKNOWN `why` with the rerun command."""

    at: int
    change_pct: float
    answer: str
    direction: str | None = None
    vs_host_pct: float | None = None
    kind: str = STEP
    why: str | None = None


@dataclass(frozen=True)
class ChangePoints:
    """A series' change points: `answer` (one of ANSWERS), the points in order, and the
    between-release spread the fit found (sd of the logs)."""

    answer: str
    points: tuple[ChangePoint, ...]
    between_sd: float = 0.0


def _excursions(fit: StepFit, threshold_pct: float) -> list[tuple[Step, str]]:
    """Each step with its kind: a one-release segment whose steps go opposite ways and whose
    neighbours' levels are within the practical threshold is one excursion (its second step
    folded in)."""
    limit = math.log1p(threshold_pct / 100.0)
    out: list[tuple[Step, str]] = []
    skip = False
    for j, s in enumerate(fit.steps):
        if skip:
            skip = False
            continue
        nxt = fit.steps[j + 1] if j + 1 < len(fit.steps) else None
        back = nxt is not None and nxt.at == s.at + 1 and (s.ratio > 1.0) != (nxt.ratio > 1.0)
        if back and abs(math.log(fit.levels[j + 2] / fit.levels[j])) < limit:
            out.append((s, EXCURSION))
            skip = True
        else:
            out.append((s, STEP))
    return out


@dataclass(frozen=True)
class Releases:
    """The releases of a series, in its order: each one's host speed (None where it records
    none) and the path a rerun command names it by; the equivalence margin of the gate."""

    hosts: Sequence[HostSpeed | None]
    paths: Sequence[str] | None = None
    margin_pct: float = DEFAULT_MARGIN_PCT

    def gate(self, at: int) -> Gate:
        names = self.paths or [f"RELEASE_{i + 1}" for i in range(len(self.hosts))]
        rerun = rerun_command(names[at - 1], names[at])
        return Gate(self.margin_pct, 0.0, rerun, (names[at - 1], names[at]))


def _whose(metric: str, step: Step, kind: str, releases: Releases) -> ChangePoint:
    """A change point judged against the host ratio between the releases either side."""
    pct = 100.0 * (step.ratio - 1.0)
    host = host_ratio(releases.hosts[step.at - 1], releases.hosts[step.at])
    if host is None:
        return ChangePoint(step.at, pct, HOST_NOT_RECORDED, kind=kind)
    up = metric in SCALES_WITH_SPEED
    s = step.ratio if up else 1.0 / step.ratio
    half = Z95 * step.se
    got = judge(s, (s * math.exp(-half), s * math.exp(half)), host, releases.gate(step.at))
    vs = None if got.vs_host is None else 100.0 * (got.vs_host - 1.0)
    return ChangePoint(step.at, pct, got.answer, got.direction, vs, kind, got.why)


def change_points(
    metric: str,
    values: Sequence[Sequence[float]],
    releases: Releases | Sequence[HostSpeed | None],
    threshold_pct: float,
) -> ChangePoints:
    """The change points of `metric`'s series `values` (each release's repeats, in release
    order, none empty) with its `releases` (or just their host speeds): each the code's, the
    host's, UNKNOWN, or a change with the host speed not recorded."""
    rels = releases if isinstance(releases, Releases) else Releases(list(releases))
    fit = step_fit(values, threshold_pct)
    if fit.answer not in (CHANGED, NO_CHANGE):
        return ChangePoints(fit.answer, ())
    points = tuple(_whose(metric, s, k, rels) for s, k in _excursions(fit, threshold_pct))
    return ChangePoints(CHANGED if points else NO_CHANGE, points, math.sqrt(fit.tau2))
