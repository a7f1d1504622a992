"""Cross-run attribution against the host's speed on simulated runs (benchmarks/bench_crossrun.py,
whose table benchmarks/README.md quotes with 1000 studies a cell): identical code on an
identical host is called "beyond the host" in at most 5% of studies, by the cross-run rule and
by the change points, at every canary noise (5, 10, 20%) and release-to-release noise (0, 5,
10%)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_crossrun as bc  # noqa: E402

STUDIES = 150


@pytest.mark.parametrize("cell", bc.cells(), ids=lambda c: f"canary{c.canary}-release{c.release}")
def test_identical_code_is_rarely_beyond_the_host(cell: bc.Cell) -> None:
    rates = bc.false_rates(cell, STUDIES, 7)
    assert rates["cross_false"] <= 0.05, rates
    assert rates["cp_false"] <= 0.05, rates


def test_the_simulation_is_deterministic() -> None:
    cell = bc.Cell(0.05, 0.10)
    assert bc.false_rates(cell, 10, 3) == bc.false_rates(cell, 10, 3)
    # and it can find a change: a 20% drop on a quiet host is called worse beyond it sometimes
    assert bc.study(bc.Cell(0.05, 0.0), 40, 3)["cp_power"] > 0.2
