"""Three words for a change measured on one host (servelab.analysis.equivalence) and the pairs
of `analysis.compare` answered with them (servelab.analysis.samehost), on hand-built raw data:
an interleaved sequential run of two configurations whose speeds are known."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
from analysis_fixtures import servelab_point

from servelab.analysis.dataset import load_dataset
from servelab.analysis.equivalence import (
    DIFFERENT,
    SAME,
    UNKNOWN,
    decide,
    family_alpha,
    word_for,
)
from servelab.analysis.pipeline import analyze
from servelab.analysis.samehost import NOT_INTERLEAVED, Plan, open_rows, same_host
from servelab.config import default_section
from servelab.design.stopping import StoppingRule
from servelab.errors import ServelabError
from servelab.experiment import AnalysisSection, ComparePair
from servelab.store.jsonio import load_schema, read_json, write_json


def test_the_word_follows_where_the_interval_lies_against_the_margin() -> None:
    assert word_for(0.95, 1.08, 10) == (SAME, None)
    assert word_for(0.70, 0.88, 10) == (DIFFERENT, "slower")
    assert word_for(1.12, 1.30, 10) == (DIFFERENT, "faster")
    assert word_for(0.85, 1.02, 10) == (UNKNOWN, None)  # overlaps the margin's edge
    assert word_for(0.5, 2.0, 10) == (UNKNOWN, None)  # wider than the margin
    with pytest.raises(ValueError, match="margin_pct = 0"):
        word_for(0.9, 1.1, 0)


def test_a_latency_reads_in_speed_terms() -> None:
    # B's TTFT a quarter higher in every round: B is slower, at a speed of 0.8
    a = [100.0, 110.0, 90.0, 105.0]
    d = decide([x * 1.25 for x in a], a, higher_is_faster=False, margin_pct=10, alpha=0.05)
    assert d.word == DIFFERENT and d.direction == "slower"
    assert d.speed == pytest.approx(0.8) and d.low == d.high == pytest.approx(0.8)


def test_unknown_says_how_many_rounds_the_spread_would_need() -> None:
    rng = random.Random(3)
    a = [100.0 * (1 + 0.05 * rng.gauss(0, 1)) for _ in range(3)]
    b = [x * (1 + 0.15 * rng.gauss(0, 1)) for x in a]
    d = decide(b, a, True, 10, 0.05)
    assert d.word == UNKNOWN and d.n == 3
    assert d.rounds_needed is not None and d.rounds_needed > 3
    # at that many rounds, with the same mean and spread, the interval decides
    logs = np.log(np.asarray(b) / np.asarray(a))
    mean, sd = float(logs.mean()), float(logs.std(ddof=1))
    from scipy import stats

    # a 90% interval: two one-sided tests at 5%
    half = stats.t.ppf(0.95, d.rounds_needed - 1) * sd / math.sqrt(d.rounds_needed)
    assert word_for(math.exp(mean - half), math.exp(mean + half), 10)[0] != UNKNOWN
    one = decide([1.0], [1.0], True)
    assert one.word == UNKNOWN and one.why is not None and "needs 2" in one.why


def test_the_family_alpha_is_split_over_decisions_and_looks() -> None:
    assert family_alpha(0.05, 9, 4) == pytest.approx(0.05 / 36)
    assert family_alpha(0.05, 0) == 0.05
    with pytest.raises(ValueError, match="alpha = 1"):
        family_alpha(1.0, 3)


def test_identical_sides_rarely_read_different_and_a_fifth_slower_does() -> None:
    """Seeded: 2,000 studies of 3 levels x 3 metrics at 5 rounds, 5% round-to-round spread;
    the chance of any DIFFERENT where nothing differs stays under the family's alpha, and a
    20% slower B reads DIFFERENT (slower) at the throughput of most studies."""
    rng = np.random.default_rng(0)
    each = family_alpha(0.05, 9, 1)
    wrong, found = 0, 0
    for _ in range(2000):
        any_wrong = False
        for _ in range(9):
            a = 100 * np.exp(rng.normal(0, 0.05, 5))
            b = a * np.exp(rng.normal(0, 0.05, 5))
            any_wrong |= decide(list(b), list(a), True, 10, each).word == DIFFERENT
        wrong += any_wrong
        a = 100 * np.exp(rng.normal(0, 0.05, 5))
        b = 0.8 * a * np.exp(rng.normal(0, 0.03, 5))
        found += decide(list(b), list(a), True, 10, each).label == "DIFFERENT (slower)"
    assert wrong / 2000 <= 0.05
    assert found / 2000 >= 0.6


RULE = StoppingRule(3, 6, 0.05)


def two_sides(exp: Path, rounds: int, ratio: float, launches: bool = True) -> Path:
    """Configurations `ref` and `cur` at c=1 and c=4, `rounds` rounds, `cur` `ratio` times
    `ref`'s throughput with 2% noise, each round on a launch of its own when `launches`."""
    rng = random.Random(7)
    for r in range(1, rounds + 1):
        for c in (1, 4):
            base = 100.0 * c * (1 + 0.02 * rng.gauss(0, 1))
            servelab_point(exp, "ref", r, c, base, 50.0)
            servelab_point(exp, "cur", r, c, base * ratio * (1 + 0.02 * rng.gauss(0, 1)), 50.0)
            for sc in ("ref", "cur"):  # each round on a launch of its own, or all on one
                point = exp / "raw" / sc / f"rep{r:02d}" / f"c{c:04d}" / "point.json"
                write_json(point, {**read_json(point), "launch": r if launches else 1})
    plan = [
        {"round": r, "server_config": sc, "launch": r, "ready_s": 1.0, "lock_waited_s": 0.0}
        for r in range(1, rounds + 1)
        for sc in ("ref", "cur")
    ]
    for sc in ("ref", "cur"):
        write_json(
            exp / "raw" / sc / "run.json",
            {
                "format_version": 1,
                "server_config": sc,
                "status": "complete",
                "points": 2 * rounds,
                "launches": rounds if launches else 1,
                "plan": [],
                "sequential": {
                    "rule": RULE.to_json(),
                    "rounds": rounds,
                    "stopped": "decided",
                    "round_s": [1.0],
                    "looks": [],
                    "launches": plan if launches else [],
                },
            },
        )
    return exp


METRICS = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms")
PAIRS = [ComparePair("ref", "cur", METRICS)]


def test_a_slower_current_side_reads_different_and_an_equal_one_same(tmp_path: Path) -> None:
    slow = same_host(load_dataset(two_sides(tmp_path / "slow", 4, 0.7)), PAIRS, 10, 0.05)
    assert slow is not None and slow["interleaved"] and slow["looks"] == 4
    assert slow["decisions"] == 2 * 3 and slow["interval_alpha"] == pytest.approx(0.05 / 24)
    thr = {r["level"]: r for r in slow["pairs"][0]["rows"] if r["metric"] == "output_throughput"}
    assert {c: (r["word"], r["direction"]) for c, r in thr.items()} == {
        1: (DIFFERENT, "slower"),
        4: (DIFFERENT, "slower"),
    }
    assert thr[4]["speed"] == pytest.approx(0.7, rel=0.05)
    same = same_host(load_dataset(two_sides(tmp_path / "same", 6, 1.0)), PAIRS, 10, 0.05)
    assert same is not None
    assert {r["word"] for r in same["pairs"][0]["rows"]} == {SAME}
    assert open_rows(same) == []


def test_rounds_that_shared_a_launch_are_not_paired(tmp_path: Path) -> None:
    ds = load_dataset(two_sides(tmp_path / "x", 4, 0.7, launches=False))
    doc = same_host(ds, PAIRS, 10, 0.05)
    assert doc is not None and not doc["interleaved"]
    assert {(r["word"], r["why"]) for r in doc["pairs"][0]["rows"]} == {(UNKNOWN, NOT_INTERLEAVED)}
    assert open_rows(doc)[0] == "ref -> cur c=1 output_throughput"
    # while the sweep measures, its own plan says what its record will
    during = same_host(ds, PAIRS, 10, 0.05, Plan(looks=4, interleaved=True))
    assert during is not None and during["interleaved"]


def test_a_pair_names_configurations_the_run_measured(tmp_path: Path) -> None:
    ds = load_dataset(two_sides(tmp_path / "x", 3, 1.0))
    with pytest.raises(ServelabError, match=r"analysis.compare\[0\].b: 'new' is not a server"):
        same_host(ds, [ComparePair("ref", "new", METRICS)], 10, 0.05)


def test_the_analysis_writes_same_host_json_and_its_report_section(tmp_path: Path) -> None:
    exp = two_sides(tmp_path / "x", 4, 0.7)
    opts = default_section(AnalysisSection, "analysis")
    from dataclasses import replace

    opts = replace(opts, compare=(ComparePair("ref", "cur", METRICS),))
    analyze(exp, tmp_path / "out", opts, figures=False)
    doc = read_json(tmp_path / "out" / "same_host.json")
    import jsonschema

    jsonschema.validate(doc, load_schema("same_host"))
    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Compared on this host" in report and "### cur against ref" in report
    assert "| c=4 | output_throughput | 4 | 0.7" in report and "DIFFERENT (slower)" in report
    # without pairs, no table (and an earlier one is removed)
    analyze(exp, tmp_path / "out", replace(opts, compare=()), figures=False)
    assert not (tmp_path / "out" / "same_host.json").exists()
