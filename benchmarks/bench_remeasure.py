"""Re-measured points and the paired test's false positives, simulated.

A point a host check finds disturbed is measured again after its launch's last scheduled point
(servelab.measure.remeasure), and the analysis uses that attempt
(servelab.analysis.validity.use_attempts). This simulates the default experiment's design (five
levels, three repeats, latin order: servelab.design.schedule.plan) on one launch with no true
difference between levels, and runs the paired test of every adjacent pair of levels
(servelab.analysis.stats.paired, as paired.csv does) four ways:

  quiet        no point disturbed: the design as planned
  alone        each point disturbed with probability p (p_focus for the points of the middle
               level, where disturbance concentrates there); a disturbed one alone is measured
               again at the end of the launch (in run order; disturbed again with probability
               p, then left out), and the test reads the re-measure: the placement before
               servelab measured whole repeats again
  whole repeat the disturbed point's whole repeat measured again at the end of the launch, in
               its planned order (servelab.measure.remeasure today); every point of it disturbed
               again with probability p; the repeat read from one attempt, the first with no
               disturbed point, else the one with the fewest (the earliest of those), its
               disturbed points left out (servelab.analysis.validity.row_choice)
  left out     the disturbed points left out, none measured again (the pair has n - 1 repeats)

Each point's log throughput is `drift` x its run index within the launch plus noise of SD
`noise`. `drift` and `noise` default to what the
eight runs of evidence/quickstart-cpu measured (`measured_drift`): within each (configuration,
level), log throughput against run index. A disturbed attempt is never read (the contention
check leaves it out), so how much slower it ran does not matter. A false positive is a verdict
`a > b` or `a < b` (the practical threshold set to 0, so the test's own size is what is
counted); `judged` is the share of comparisons none of whose points stays flagged (a flagged
point makes a claim `invalid`); `focus` counts only the two comparisons with the focused level
(the middle one); `cost` is the re-measures per launch.

    python benchmarks/bench_remeasure.py [--studies 4000] [--seed 1]
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servelab.analysis.stats import paired
from servelab.design.schedule import Slot, plan

EVIDENCE = Path(__file__).resolve().parents[1] / "evidence" / "quickstart-cpu"
LEVELS = (1, 2, 4, 8, 16)
REPEATS = 3
ALPHA = 0.05
WAYS = ("quiet", "alone", "whole repeat", "left out")
FOCUS = 2  # the middle level (c=4): its two comparisons, c=2 against it and it against c=8


@dataclass(frozen=True)
class Case:
    p: float  # share of points disturbed
    drift: float  # log throughput per point of run index within the launch
    noise: float  # SD of a point's log throughput
    order: str = "latin"
    p_focus: float | None = None  # share of the FOCUS level's points disturbed (None: p)

    def chance(self) -> np.ndarray:
        """Each level's chance of a disturbed point."""
        out = np.full(len(LEVELS), self.p)
        if self.p_focus is not None:
            out[FOCUS] = self.p_focus
        return out


@dataclass(frozen=True)
class Rates:
    tests: int
    false_positives: dict[str, int]  # way -> count
    judged: dict[str, int]  # way -> comparisons with no flagged point
    focus_tests: int = 0
    focus_false_positives: dict[str, int] | None = None  # way -> count, FOCUS's comparisons
    remeasures: dict[str, int] | None = None  # way -> re-measures over every launch
    launches: int = 1

    def rate(self, way: str) -> float:
        return self.false_positives[way] / self.tests

    def focus_rate(self, way: str) -> float:
        assert self.focus_false_positives is not None
        return self.focus_false_positives[way] / self.focus_tests

    def cost(self, way: str) -> float:
        return (self.remeasures or {}).get(way, 0) / self.launches

    def judged_share(self, way: str) -> float:
        return self.judged[way] / self.tests


def measured_drift(root: Path = EVIDENCE) -> tuple[float, float, float]:
    """(pooled drift per point, its largest single-run value in magnitude, residual SD) of log
    output throughput against run index within each (configuration, level) of the evidence
    runs' points.csv, valid points only."""
    xs: list[float] = []
    ys: list[float] = []
    cells = 0
    largest = 0.0
    for table in sorted(root.glob("v*/tables/points.csv")):
        with open(table, encoding="utf-8") as fh:
            rows = [r for r in csv.DictReader(fh) if r.get("valid", "true") == "true"]
        levels = len({r["concurrency"] for r in rows})
        by: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)
        for r in rows:
            idx = (int(r["repeat"]) - 1) * levels + int(r["position"])
            by[r["server_config"], r["concurrency"]].append(
                (float(idx), math.log(float(r["output_throughput"])))
            )
        rx, ry = [], []
        for pts in by.values():
            i = np.array([a for a, _ in pts])
            y = np.array([b for _, b in pts])
            rx += list(i - i.mean())
            ry += list(y - y.mean())
        ax, ay = np.array(rx), np.array(ry)
        run_slope = float((ax * ay).sum() / (ax * ax).sum())
        largest = run_slope if abs(run_slope) > abs(largest) else largest
        xs += rx
        ys += ry
        cells += len(by)
    x, y = np.array(xs), np.array(ys)
    slope = float((x * y).sum() / (x * x).sum())
    resid = y - slope * x
    sd = math.sqrt(float((resid**2).sum()) / (len(y) - cells - 1))
    return slope, largest, sd


def study(
    rng: np.random.Generator, case: Case, slots: Sequence[Slot], again: np.random.Generator
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """One simulated launch: way -> log throughput per (repeat, level), NaN where left out;
    way -> re-measures. `again` draws what a whole repeat measured again adds (so the other
    ways draw what they drew before it was simulated)."""
    n = len(slots)
    shape = (REPEATS, len(LEVELS))
    run_index = np.zeros(shape, dtype=int)
    where = {}
    for s in slots:
        li = LEVELS.index(int(s.level.value))
        where[s.run_index] = (s.repeat - 1, li)
        run_index[s.repeat - 1, li] = s.run_index
    chance = np.broadcast_to(case.chance(), shape)
    # a re-measure, at the end of the launch, is disturbed as any point is there: with the
    # background chance p (a disturbance that concentrates on one level's time passes)
    later = np.full(shape, case.p)
    base = case.drift * run_index + rng.normal(0.0, case.noise, shape)
    hit = rng.random(shape) < chance
    alone = base.copy()
    at = n  # the re-measures run after the last scheduled point, in run order
    for k in range(n):
        r, li = where[k]
        if hit[r, li]:
            value = case.drift * at + rng.normal(0.0, case.noise)
            alone[r, li] = value if rng.random() >= later[r, li] else np.nan
            at += 1
    whole = base.copy()
    at = n  # the disturbed repeats, in run order, each in its planned order
    rows = [r for r in range(REPEATS) if hit[r].any()]
    for r in rows:
        index = at + run_index[r] - run_index[r].min()
        value = case.drift * index + again.normal(0.0, case.noise, len(LEVELS))
        hit2 = again.random(len(LEVELS)) < later[r]
        if hit2.sum() < hit[r].sum():  # the attempt with the fewest disturbed points
            whole[r] = np.where(hit2, np.nan, value)
        else:
            whole[r] = np.where(hit[r], np.nan, whole[r])
        at += len(LEVELS)
    ways = {
        "quiet": base,
        "alone": alone,
        "whole repeat": whole,
        "left out": np.where(hit, np.nan, base),
    }
    cost = {"alone": int(hit.sum()), "whole repeat": len(rows) * len(LEVELS)}
    return ways, cost


def simulate(
    rng: np.random.Generator, case: Case, studies: int, again: np.random.Generator | None = None
) -> Rates:
    slots = plan(list(LEVELS), REPEATS, case.order)
    again = again if again is not None else np.random.default_rng(rng.integers(2**63))
    fp = dict.fromkeys(WAYS, 0)
    focus_fp = dict.fromkeys(WAYS, 0)
    judged = dict.fromkeys(WAYS, 0)
    remeasures = dict.fromkeys(WAYS, 0)
    tests = focus_tests = 0
    for _ in range(studies):
        ways, cost = study(rng, case, slots, again)
        for way, k in cost.items():
            remeasures[way] += k
        for li in range(len(LEVELS) - 1):
            tests += 1
            focused = FOCUS in (li, li + 1)
            focus_tests += focused
            for way, y in ways.items():
                a, b = y[:, li], y[:, li + 1]
                keep = ~(np.isnan(a) | np.isnan(b))
                judged[way] += bool(keep.all())
                test = paired(list(np.exp(a[keep])), list(np.exp(b[keep])), 0.0, ALPHA)
                called = test.verdict in ("a > b", "a < b")
                fp[way] += called
                focus_fp[way] += called and focused
    return Rates(tests, fp, judged, focus_tests, focus_fp, remeasures, studies)


def band(rate: float, n: int, z: float = 3.0) -> tuple[float, float]:
    """The binomial band of `rate` over n trials: rate +- z standard errors."""
    half = z * math.sqrt(rate * (1.0 - rate) / n)
    return rate - half, rate + half


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--studies", type=int, default=4000, help="simulated launches per case")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    pooled, largest, sd = measured_drift()
    print(
        f"evidence/quickstart-cpu: drift {100 * pooled:+.3f}%/point pooled, "
        f"{100 * largest:+.3f}%/point in the run with the most, residual SD {100 * sd:.2f}%"
    )
    tests = args.studies * (len(LEVELS) - 1)
    lo, hi = band(ALPHA, tests)
    flo, fhi = band(ALPHA, 2 * args.studies)
    print(f"nominal {ALPHA}: 3-SE binomial band {lo:.4f}-{hi:.4f} over {tests} tests")
    print(f"  ({flo:.4f}-{fhi:.4f} over the {2 * args.studies} comparisons with c={LEVELS[FOCUS]})")
    print("false positives, all adjacent comparisons:")
    head = f"{'p':>5} {'c=4':>5} {'drift/pt':>9} " + " ".join(f"{w:>12}" for w in WAYS)
    print(head + "   judged: alone, whole, left out   re-measures/launch: alone, whole")
    cases: list[tuple[float, float | None, float]] = [
        (p, None, drift) for p in (0.05, 0.2) for drift in (0.0, largest)
    ]
    cases += [(0.0, pf, drift) for pf in (0.5, 1.0) for drift in (pooled, largest)]
    focus_rows: list[str] = []
    for p, pf, drift in cases:
        case = Case(p, drift, sd, p_focus=pf)
        seed = [args.seed, int(100 * p)] + ([] if pf is None else [int(100 * pf)])
        again = np.random.default_rng([*seed, 1])
        r = simulate(np.random.default_rng(seed), case, args.studies, again)
        judged = " ".join(f"{r.judged_share(w):.3f}" for w in ("alone", "whole repeat", "left out"))
        cost = f"{r.cost('alone'):.2f} {r.cost('whole repeat'):.2f}"
        c4 = "p" if pf is None else f"{pf:g}"
        print(
            f"{p:5.2f} {c4:>5} {100 * drift:+8.3f}% "
            + " ".join(f"{r.rate(w):12.4f}" for w in WAYS)
            + f"   {judged}   {cost}"
        )
        if pf is not None:
            focus_rows.append(
                f"{p:5.2f} {c4:>5} {100 * drift:+8.3f}% "
                + " ".join(f"{r.focus_rate(w):12.4f}" for w in WAYS)
            )
    print(f"false positives, the two comparisons with c={LEVELS[FOCUS]} (disturbance there):")
    print(head)
    print("\n".join(focus_rows))


if __name__ == "__main__":
    main()
