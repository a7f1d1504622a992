"""Re-measured points and the paired test's false positives, simulated.

A point a host check finds disturbed is measured again after its launch's last scheduled point
(servelab.measure.remeasure), out of its balanced position, and the analysis uses that attempt
(servelab.analysis.validity.use_attempt). This simulates the default experiment's design (five
levels, three repeats, latin order: servelab.design.schedule.plan) on one launch with no true
difference between levels, and runs the paired test of every adjacent pair of levels
(servelab.analysis.stats.paired, as paired.csv does) three ways:

  quiet        no point disturbed: the design as planned
  re-measured  each point disturbed with probability p; a disturbed one is measured again at
               the end of the launch (in run order; disturbed again with probability p, then
               left out), and the test reads the re-measure
  left out     the disturbed points left out, none measured again (the pair has n - 1 repeats)

Each point's log throughput is `drift` x its run index within the launch plus noise of SD
`noise`. `drift` and `noise` default to what the
eight runs of evidence/quickstart-cpu measured (`measured_drift`): within each (configuration,
level), log throughput against run index. A disturbed attempt is never read (the contention
check leaves it out), so how much slower it ran does not matter. A false positive is a verdict
`a > b` or `a < b` (the practical threshold set to 0, so the test's own size is what is
counted); `judged` is the share of comparisons none of whose points stays flagged (a flagged
point makes a claim `invalid`).

    python benchmarks/bench_remeasure.py [--studies 20000] [--seed 1]
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
WAYS = ("quiet", "re-measured", "left out")


@dataclass(frozen=True)
class Case:
    p: float  # share of points disturbed
    drift: float  # log throughput per point of run index within the launch
    noise: float  # SD of a point's log throughput
    order: str = "latin"


@dataclass(frozen=True)
class Rates:
    tests: int
    false_positives: dict[str, int]  # way -> count
    judged: dict[str, int]  # way -> comparisons with no flagged point

    def rate(self, way: str) -> float:
        return self.false_positives[way] / self.tests

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


def study(rng: np.random.Generator, case: Case, slots: Sequence[Slot]) -> dict[str, np.ndarray]:
    """One simulated launch: way -> log throughput per (repeat, level), NaN where left out."""
    n = len(slots)
    shape = (REPEATS, len(LEVELS))
    run_index = np.zeros(shape, dtype=int)
    where = {}
    for s in slots:
        li = LEVELS.index(int(s.level.value))
        where[s.run_index] = (s.repeat - 1, li)
        run_index[s.repeat - 1, li] = s.run_index
    base = case.drift * run_index + rng.normal(0.0, case.noise, shape)
    hit = rng.random(shape) < case.p
    remeasured = base.copy()
    at = n  # the re-measures run after the last scheduled point, in run order
    for k in range(n):
        r, li = where[k]
        if hit[r, li]:
            again = case.drift * at + rng.normal(0.0, case.noise)
            remeasured[r, li] = again if rng.random() >= case.p else np.nan
            at += 1
    return {
        "quiet": base,
        "re-measured": remeasured,
        "left out": np.where(hit, np.nan, base),
    }


def simulate(rng: np.random.Generator, case: Case, studies: int) -> Rates:
    slots = plan(list(LEVELS), REPEATS, case.order)
    fp = dict.fromkeys(WAYS, 0)
    judged = dict.fromkeys(WAYS, 0)
    tests = 0
    for _ in range(studies):
        ways = study(rng, case, slots)
        for li in range(len(LEVELS) - 1):
            tests += 1
            for way, y in ways.items():
                a, b = y[:, li], y[:, li + 1]
                keep = ~(np.isnan(a) | np.isnan(b))
                judged[way] += bool(keep.all())
                test = paired(list(np.exp(a[keep])), list(np.exp(b[keep])), 0.0, ALPHA)
                fp[way] += test.verdict in ("a > b", "a < b")
    return Rates(tests, fp, judged)


def band(rate: float, n: int, z: float = 3.0) -> tuple[float, float]:
    """The binomial band of `rate` over n trials: rate +- z standard errors."""
    half = z * math.sqrt(rate * (1.0 - rate) / n)
    return rate - half, rate + half


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--studies", type=int, default=20000, help="simulated launches per case")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    pooled, largest, sd = measured_drift()
    print(
        f"evidence/quickstart-cpu: drift {100 * pooled:+.3f}%/point pooled, "
        f"{100 * largest:+.3f}%/point in the run with the most, residual SD {100 * sd:.2f}%"
    )
    lo, hi = band(ALPHA, args.studies * (len(LEVELS) - 1))
    tests = args.studies * (len(LEVELS) - 1)
    print(f"nominal {ALPHA}: 3-SE binomial band {lo:.4f}-{hi:.4f} over {tests} tests")
    head = f"{'p':>5} {'drift/pt':>9} " + " ".join(f"{w:>12}" for w in WAYS)
    print(head + "   judged: re-measured, left out")
    for p in (0.05, 0.2):
        for drift in (0.0, pooled, largest):
            case = Case(p, drift, sd)
            r = simulate(np.random.default_rng([args.seed, int(100 * p)]), case, args.studies)
            judged = " ".join(f"{r.judged_share(w):.3f}" for w in ("re-measured", "left out"))
            print(
                f"{p:5.2f} {100 * drift:+8.3f}% "
                + " ".join(f"{r.rate(w):12.4f}" for w in WAYS)
                + f"   {judged}"
            )


if __name__ == "__main__":
    main()
