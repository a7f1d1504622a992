"""Cross-run attribution against the host's speed, simulated: how often identical code is
called "beyond the host", and how often a real 20% change is.

Two places read a change across runs against the host-speed canary (docs/analysis.md):

  cross-run      two runs of one point (a reproduction, a pair of releases): Welch's test on the
                 logs of their repeats, then servelab.analysis.hostspeed.attribute with the host
                 ratio of their canaries (host_ratio);
  change points  a history of releases of one point: servelab.analysis.changepoints.
                 change_points, each change point attributed by the same gate.

Every study is on an identical host (its true speed never changes) running identical code
unless a change is asked for. What varies:

  canary noise   each canary repeat reads the host's speed off by a log-normal factor of this
                 spread (3 repeats a part, both parts, one configuration: a canary before and
                 one after each run); the drift verdict is the product's own
                 (hostfacts.canary.drift) on those timings;
  release noise  each run's (release's) level moves by a log-normal factor of this spread,
                 which no canary sees (two quiet runs of the same code differ by more than their
                 repeats say);
  repeats        3 per run (the default experiment's), log-normal spread 5% around the level.

A false "beyond" is a study with any "changed beyond what the host explains": the cross-run
point, or any change point of a flat 6-release history. Power is the share of studies that call
a 20% throughput drop "beyond the host, worse": after the first run (cross-run; a 40% drop too),
or at the 4th of 6 releases (change points, found at that release). Seeded: the same arguments
print the same table, to the byte.

    python benchmarks/bench_crossrun.py [--studies 800] [--seed 1]
"""

from __future__ import annotations

import argparse
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from servelab.analysis.changepoints import change_points
from servelab.analysis.hostspeed import (
    BEYOND_HOST,
    HostSpeed,
    attribute,
    host_ratio,
    host_speed,
)
from servelab.analysis.stats import ratio_ci, two_sample
from servelab.hostfacts.canary import CpuCanary, drift
from servelab.hostfacts.timing import summary

CANARY_NOISE = (0.05, 0.10, 0.20)
RELEASE_NOISE = (0.0, 0.05, 0.10)
REPEAT_SPREAD = 0.05
REPEATS = 3
RELEASES = 6
STEP_AT = 3  # the 4th release (index 3) starts the new level
CHANGE = 0.8  # a 20% throughput drop
LARGE = 0.6  # a 40% drop: what one run a side can call
THRESHOLD_PCT = 2.0  # the analysis's default practical threshold
ALPHA = 0.05
METRIC = "output_throughput"


@dataclass(frozen=True)
class Cell:
    """One cell of the table: the canary's and the releases' noise (log-normal spreads)."""

    canary: float
    release: float


def canary(rng: random.Random, noise: float) -> CpuCanary:
    """One canary timing on the unchanging host: 3 repeats of each part, each off by noise."""
    secs = [0.17 * math.exp(rng.gauss(0.0, noise)) for _ in range(3)]
    gbs = [8.0 * math.exp(rng.gauss(0.0, noise)) for _ in range(3)]
    return CpuCanary(summary(secs, "s"), summary(gbs, "GB/s"), 1, 600_000, 64)


def run_host(rng: random.Random, noise: float) -> HostSpeed:
    """A run's host speed, read by the product from a run.json holding its two canaries."""
    before, after = canary(rng, noise), canary(rng, noise)
    doc = {
        "canary": {
            "before": before.to_json(),
            "after": after.to_json(),
            "drift": drift(before, after).to_json(),
        }
    }
    found = host_speed({"raw/a/run.json": doc})
    assert found is not None
    return found


def repeats(rng: random.Random, level: float) -> list[float]:
    return [level * math.exp(rng.gauss(0.0, REPEAT_SPREAD)) for _ in range(REPEATS)]


def crossrun_beyond(rng: random.Random, cell: Cell, change: float) -> str | None:
    """One reproduction: the direction of a "beyond the host" answer, else None."""
    levels = [math.exp(rng.gauss(0.0, cell.release)) for _ in range(2)]
    before, after = repeats(rng, 100.0 * levels[0]), repeats(rng, 100.0 * change * levels[1])
    hosts = run_host(rng, cell.canary), run_host(rng, cell.canary)
    test = two_sample(after, before, THRESHOLD_PCT, ALPHA)
    p = test.p_value
    pct = 100.0 * (sum(after) / sum(before) - 1.0)
    changed = p is not None and p <= ALPHA and abs(pct) >= THRESHOLD_PCT
    got = attribute(METRIC, ratio_ci(after, before), changed, host_ratio(*hosts))
    return got.direction if got.answer == BEYOND_HOST else None


def history_beyond(rng: random.Random, cell: Cell, change: float) -> list[tuple[int, str | None]]:
    """One history of 6 releases (a drop by `change` at STEP_AT): its "beyond the host"
    change points, (release, direction)."""
    values, hosts = [], []
    for i in range(RELEASES):
        level = 100.0 * math.exp(rng.gauss(0.0, cell.release)) * (change if i >= STEP_AT else 1)
        values.append(repeats(rng, level))
        hosts.append(run_host(rng, cell.canary))
    got = change_points(METRIC, values, hosts, THRESHOLD_PCT)
    return [(c.at, c.direction) for c in got.points if c.answer == BEYOND_HOST]


def false_rates(cell: Cell, studies: int, seed: int) -> dict[str, float]:
    """The two false "beyond the host" rates of one cell over `studies` seeded studies each."""
    rng = random.Random(f"{seed}:{cell.canary}:{cell.release}:false")
    n = studies
    return {
        "cross_false": sum(crossrun_beyond(rng, cell, 1.0) is not None for _ in range(n)) / n,
        "cp_false": sum(bool(history_beyond(rng, cell, 1.0)) for _ in range(n)) / n,
    }


def study(cell: Cell, studies: int, seed: int) -> dict[str, float]:
    """The four rates of one cell over `studies` seeded studies each."""
    rng = random.Random(f"{seed}:{cell.canary}:{cell.release}:power")
    n = studies
    cross_power = sum(crossrun_beyond(rng, cell, CHANGE) == "worse" for _ in range(n)) / n
    cross_large = sum(crossrun_beyond(rng, cell, LARGE) == "worse" for _ in range(n)) / n
    cp_power = sum((STEP_AT, "worse") in history_beyond(rng, cell, CHANGE) for _ in range(n)) / n
    powers = {"cross_power": cross_power, "cross_large": cross_large, "cp_power": cp_power}
    return false_rates(cell, studies, seed) | powers


def cells() -> list[Cell]:
    return [Cell(c, r) for c in CANARY_NOISE for r in RELEASE_NOISE]


def table(results: Sequence[tuple[Cell, dict[str, float]]]) -> list[str]:
    lines = [
        "| canary noise | release noise | cross-run: false beyond | cross-run: power, 20% "
        "| cross-run: power, 40% | change points: false beyond | change points: power, 20% |",
        "|---|---|---|---|---|---|---|",
    ]
    for cell, r in results:
        lines.append(
            f"| {cell.canary:.0%} | {cell.release:.0%} | {r['cross_false']:.1%} | "
            f"{r['cross_power']:.1%} | {r['cross_large']:.1%} | {r['cp_false']:.1%} | "
            f"{r['cp_power']:.1%} |"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=800, help="studies per cell and rate")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    started = time.process_time()
    results = [(cell, study(cell, args.studies, args.seed)) for cell in cells()]
    print("\n".join(table(results)))
    print(f"\n{args.studies} studies per cell and rate, seed {args.seed}")
    # the time goes to stderr: stdout is the same bytes on every run
    print(f"{time.process_time() - started:.0f} CPU seconds", file=sys.stderr)
    return {"results": results}


if __name__ == "__main__":
    main()
