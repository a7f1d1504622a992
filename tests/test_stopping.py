"""The stopping rule of sequential rounds (servelab.design.stopping): the test at one look,
the one loop over the looks, and the simulation of the rule running that loop."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from analysis_fixtures import servelab_point
from scipy import stats as sps

from servelab.analysis.dataset import load_dataset
from servelab.analysis.groups import Groups
from servelab.analysis.rounds import looks
from servelab.config import validate
from servelab.design.stopping import (
    OPEN,
    StoppingRule,
    claim_verdict,
    is_open,
    run_looks,
    sequential_test,
)
from servelab.errors import ServelabError

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_sequential as bench  # noqa: E402

Cell = bench.Cell


def test_sequential_test_by_hand() -> None:
    # log ratios .1 .2 .3: mean .2, sd .1, se .1 / sqrt(3), t = 2 sqrt(3) on 2 degrees of
    # freedom; with 2 df the two-sided p is 1 - t / sqrt(2 + t^2) = 1 - sqrt(12 / 14)
    b = [100.0, 100.0, 100.0]
    a = [100.0 * math.exp(x) for x in (0.1, 0.2, 0.3)]
    t = sequential_test(a, b, 0.08)
    assert t.n == 3 and t.df == 2
    assert t.mean_log_ratio == pytest.approx(0.2)
    assert t.se == pytest.approx(0.1 / math.sqrt(3))
    assert t.t == pytest.approx(2.0 * math.sqrt(3))
    assert t.p_value == pytest.approx(1.0 - math.sqrt(12.0 / 14.0))  # 0.0742
    assert t.verdict == "a > b"
    assert sequential_test(a, b, 0.05).verdict == OPEN
    assert sequential_test(b, a, 0.08).verdict == "a < b"


def test_one_round_is_never_decided() -> None:
    t = sequential_test([200.0], [100.0], 0.05)
    assert t.verdict == OPEN
    assert t.n == 1 and t.df is None and t.p_value is None
    assert sequential_test([], [], 0.05).verdict == OPEN
    # unequal lengths or a non-positive value: no test either
    assert sequential_test([2.0, 2.0], [1.0], 0.05).verdict == OPEN
    assert sequential_test([2.0, 0.0], [1.0, 1.0], 0.05).verdict == OPEN


def test_identical_ratios_decide_by_their_sign() -> None:
    # the same values every round: the same ratio, no spread, only its sign
    t = sequential_test([200.0, 200.0], [100.0, 100.0], 0.01)
    assert (t.verdict, t.p_value, t.t, t.se) == ("a > b", 0.0, math.inf, 0.0)
    t = sequential_test([50.0, 50.0, 50.0], [100.0, 100.0, 100.0], 0.01)
    assert (t.verdict, t.t, t.df) == ("a < b", -math.inf, 2)
    t = sequential_test([100.0, 100.0], [100.0, 100.0], 0.01)
    assert (t.verdict, t.p_value) == (OPEN, 1.0)
    # no look (alpha 0) decides nothing, however clear
    assert sequential_test([200.0, 200.0], [100.0, 100.0], 0.0).verdict == OPEN


def test_sequential_test_stays_open_on_noise() -> None:
    t = sequential_test([100.0, 103.0, 97.0, 101.0], [101.0, 99.0, 100.0, 98.0], 0.05)
    assert t.verdict == OPEN
    t = sequential_test([110.0, 111.0, 109.0, 110.0], [100.0, 101.0, 99.0, 100.0], 0.01)
    assert t.verdict == "a > b" and t.df == 3


def test_look_alpha_spends_alpha_over_the_looks() -> None:
    rule = StoppingRule(2, 6, 0.05)
    assert rule.looks == 5
    assert [rule.look_alpha(k) for k in range(1, 8)] == pytest.approx(
        [0.0, 0.01, 0.01, 0.01, 0.01, 0.01, 0.0]
    )
    assert StoppingRule(3, 3, 0.05).look_alpha(3) == pytest.approx(0.05)
    assert StoppingRule.from_json(rule.to_json()) == rule
    with_budget = StoppingRule(3, 10, 0.05, budget_s=3600.0)
    assert StoppingRule.from_json(with_budget.to_json()) == with_budget


def test_a_rule_this_servelab_does_not_implement_is_an_error() -> None:
    pooled = StoppingRule(2, 6, 0.05).to_json() | {
        "method": "group-sequential paired t-test, pooled block variance, Bonferroni alpha spending"
    }
    with pytest.raises(ServelabError, match="pooled block variance"):
        StoppingRule.from_json(pooled)
    with pytest.raises(ServelabError, match="None"):
        StoppingRule.from_json({"min_rounds": 2, "max_rounds": 6, "alpha": 0.05})


def _tables(rows: dict[Cell, list[float]]) -> dict[str, dict[Cell, dict[int, float]]]:
    return {"m": {c: {r + 1: v for r, v in enumerate(vals)} for c, vals in rows.items()}}


def test_run_looks_keeps_a_decided_comparison_and_judges_the_rest_again() -> None:
    seq = {"sequential": {"round": 0}}
    answers: dict[int, list[dict[str, Any]]] = {
        2: [
            {"claim": "q1", "verdict": "inconclusive", "evidence": seq},
            {"claim": "q2", "verdict": "holds", "evidence": {"sequential": {"round": 2}}},
            {"claim": "shape", "verdict": "fails", "evidence": []},
        ],
        3: [
            {"claim": "q1", "verdict": "fails", "evidence": {"sequential": {"round": 3}}},
            {"claim": "q2", "verdict": "fails", "evidence": {"sequential": {"round": 3}}},
            {"claim": "shape", "verdict": "holds", "evidence": []},
        ],
    }
    asked: list[int] = []

    def look(k: int) -> list[dict[str, Any]]:
        asked.append(k)
        return answers.get(k, answers[3])

    rows = run_looks(StoppingRule(2, 5, 0.05), 3, look)
    assert asked == [2, 3]  # up to the rounds measured
    assert [is_open(e) for e in rows[0]] == [True, False, False]
    # q2, decided at round 2, keeps that look's entry; q1 is decided at round 3; the shape
    # claim (no test: never open, never kept) is judged again
    assert rows[1] == [answers[3][0], answers[2][1], answers[3][2]]
    assert len(run_looks(StoppingRule(2, 3, 0.05), 9, look)) == 2  # at most the plan's max
    assert run_looks(StoppingRule(4, 6, 0.05), 3, look) == []  # before the first look


def test_claim_verdict_maps_a_test_to_a_verdict() -> None:
    assert claim_verdict(">", "a > b") == "holds" and claim_verdict("<", "a < b") == "holds"
    assert claim_verdict(">", "a < b") == "fails" and claim_verdict("<", "a > b") == "fails"
    for undecided in (OPEN, "not significant", "not testable: n < 2"):
        assert claim_verdict(">", undecided) == "inconclusive"


def test_the_looks_keep_the_first_verdict() -> None:
    # a = 2 b in rounds 1-2, a = b / 2 in rounds 3-4: decided at round 2 (the same ratio
    # twice), and the later looks, which alone would not say "holds", keep that verdict
    tables = _tables(
        {
            ("x", 1): [200.0, 200.0, 50.0, 50.5],
            ("x", 2): [100.0, 100.0, 100.0, 100.0],
            ("x", 4): [100.0, 101.0, 100.0, 101.0],
        }
    )
    q = bench.Question("a > b", "m", ("x", 1), ("x", 2), ">")
    rule = StoppingRule(2, 4, 0.05)
    looks = bench.study_looks([q], tables, rule, 4)
    assert [bench.decision(row[0]) for row in looks] == [("holds", 2)] * 3
    assert looks[2][0] == looks[0][0]
    assert bench.comparison_at(q, tables, rule, 4)["verdict"] != "holds"
    # the looks stop at max rounds
    assert len(bench.study_looks([q], tables, StoppingRule(2, 3, 0.05), 4)) == 2


def test_a_look_reads_only_the_rounds_both_points_have() -> None:
    # round 2 of b is missing (a flagged repeat): the look after round 3 tests rounds 1 and 3
    tables = {
        "m": {("x", 1): {1: 110.0, 2: 50.0, 3: 110.0}, ("x", 2): {1: 100.0, 3: 100.0}},
    }
    q = bench.Question("a > b", "m", ("x", 1), ("x", 2), ">")
    entry = bench.comparison_at(q, tables, StoppingRule(2, 3, 0.05), 3)
    seq = entry["evidence"]["sequential"]
    assert seq["n"] == 2 and seq["test_verdict"] == "a > b"  # 1.1 twice: decided by its sign


def test_threshold_blocks_a_small_real_difference() -> None:
    a, b = [101.0, 101.1, 100.9, 101.0], [100.0, 100.1, 99.9, 100.0]
    assert sequential_test(a, b, 0.05).verdict == "a > b"
    assert sequential_test(a, b, 0.05, threshold_pct=2.0).verdict == OPEN
    tables = _tables({("x", 1): a, ("x", 2): b, ("x", 4): [50.0, 50.1, 49.9, 50.0]})
    rule = StoppingRule(2, 4, 0.05)
    small = bench.Question("1% > 0", "m", ("x", 1), ("x", 2), ">", threshold_pct=2.0)
    looks = bench.study_looks([small], tables, rule, 4)
    assert [bench.decision(row[0]) for row in looks] == [(OPEN, None)] * 3
    plain = bench.Question("1% > 0", "m", ("x", 1), ("x", 2), ">")
    assert bench.decision(bench.study_looks([plain], tables, rule, 4)[-1][0]) == ("holds", 2)


SIMULATED = {  # (config, c) -> (throughput, mean TTFT ms)
    ("a", 1): (100.0, 100.0),
    ("a", 4): (100.0, 104.0),
    ("b", 1): (50.0, 100.0),
    ("b", 4): (52.0, 110.0),
}
QUESTIONS = [
    "throughput[config=a,c=4] > 1.5 * throughput[config=b,c=4]",  # clear
    "throughput[config=a,c=1] > throughput[config=a,c=4]",  # none
    "throughput[config=b,c=4] > throughput[config=b,c=1]",  # 4%, the threshold 2%
    "mean_ttft_ms[config=a,c=1] < mean_ttft_ms[config=a,c=4]",  # 4%, close to the noise
    "mean_ttft_ms[config=b,c=1] < 1.05 * mean_ttft_ms[config=b,c=4]",  # a factor
    "throughput[config=b,c=1] > throughput[config=a,c=1]",  # fails
]


def test_the_simulation_runs_the_products_looks(tmp_path: Path) -> None:
    """benchmarks/bench_sequential.py simulates the rule with the loop the sweep and the
    analysis run (stopping.run_looks), and its comparisons are the analysis's: on studies
    written as raw data, the analysis's looks (analysis.rounds.looks) and the simulation's
    looks on the same values give the same verdicts, decided rounds and test evidence."""
    assert vars(bench)["run_looks"] is run_looks  # the product's loop, not a copy
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg.update(results_dir=str(tmp_path), experiment="sim")
    cfg["server"]["configs"] = [{"name": "a", "args": {}}, {"name": "b", "args": {}}]
    cfg["sweep"] = {"concurrency": [1, 4], "repeats": {"min": 2, "max": 6}}
    cfg["analysis"] = {"claims": QUESTIONS}
    analysis = validate(cfg).analysis
    rule = StoppingRule(2, 6, analysis.alpha)
    questions = [bench.question(c, analysis.threshold_pct) for c in QUESTIONS]
    decided_at: set[int | None] = set()
    verdicts: set[str] = set()
    for study in range(6):
        rng = np.random.default_rng([7, study])
        root = tmp_path / f"study{study}"
        for r in range(1, 7):
            for (sc, c), (tput, ttft) in SIMULATED.items():
                noise = float(np.exp(0.03 * rng.standard_normal()))
                servelab_point(root, sc, r, c, tput * noise, ttft / noise)
        ds = load_dataset(root, validity=analysis.validity)
        product = looks(ds, analysis, rule)
        g = Groups(ds)
        tables = {
            m: {cell: g.values(*cell, m) for cell in SIMULATED}
            for m in ("output_throughput", "mean_ttft_ms")
        }
        simulated = bench.study_looks([q for q in questions if q], tables, rule, 6)
        assert len(product) == len(simulated) == 5
        for got, want in zip(simulated, product, strict=True):
            assert [(e["claim"], e["verdict"]) for e in got] == [
                (e["claim"], e["verdict"]) for e in want
            ]
            assert [e["evidence"]["sequential"] for e in got] == [
                e["evidence"]["sequential"] for e in want
            ]
        decided_at |= {bench.decision(e)[1] for e in simulated[-1]}
        verdicts |= {e["verdict"] for e in simulated[-1]}
    # the case covers the loop: open questions, and comparisons decided at several looks
    assert None in decided_at and len(decided_at) >= 3
    assert verdicts == {"holds", "fails", "inconclusive"}


def _p(d: np.ndarray, var: np.ndarray, df: int) -> np.ndarray:
    """Two-sided p of the mean log ratio per study (row of d) at that per-point variance."""
    k = d.shape[1]
    p: np.ndarray = 2.0 * sps.t.sf(np.abs(d.mean(axis=1)) / np.sqrt(2.0 * var / k), df)
    return p


def test_the_rule_holds_alpha_where_one_point_is_noisier() -> None:
    """No true effect: 10 points with equal medians, 9 at a 4% CV and one at 12%, the question
    on the noisy point and a quiet one, looks after rounds 2..6. The rule's share of studies
    with a wrong verdict stays under alpha (its test sees only the pair's own ratios: 0.037
    for any noise); the rejected rule, whose variance pooled over the points is mostly the
    quiet ones', and the naive rule (the pair's own test at the full alpha at every look)
    exceed it. At this seed: 0.042, 0.165, 0.164; at seeds 1-8: 0.035-0.040, 0.139-0.163,
    0.141-0.166 (3000 studies: Monte Carlo se 0.0034 at 0.037)."""
    rng = np.random.default_rng(20240601)
    studies, cells, rounds, alpha = 3000, 10, 6, 0.05
    rule = StoppingRule(2, rounds, alpha)
    keys = [("c", i) for i in range(cells)]
    q = bench.Question("c0 > c1", "m", keys[0], keys[1], ">")
    cv = np.full(cells, 0.04)
    cv[0] = 0.12
    sigma = np.sqrt(np.log1p(cv**2))[None, :, None]
    logs = sigma * rng.standard_normal((studies, cells, rounds))
    values = np.exp(logs)
    wrong_rule = 0
    for s in range(studies):
        tables = _tables({k: list(map(float, values[s, i])) for i, k in enumerate(keys)})
        wrong_rule += bench.decision(bench.study_looks([q], tables, rule, rounds)[-1][0])[0] != OPEN
    d = logs[:, 0] - logs[:, 1]
    pooled = np.zeros(studies, dtype=bool)
    naive = np.zeros(studies, dtype=bool)
    for k in range(2, rounds + 1):
        own = d[:, :k].var(axis=1, ddof=1) / 2.0
        naive |= _p(d[:, :k], own, k - 1) < alpha
        # the rejected rule: the residual mean square of the log points x rounds table,
        # (points - 1)(k - 1) degrees of freedom, or the pair's own variance where larger
        y = logs[:, :, :k]
        resid = y - y.mean(axis=2, keepdims=True) - y.mean(axis=1, keepdims=True)
        resid += y.mean(axis=(1, 2))[:, None, None]
        df = (cells - 1) * (k - 1)
        var = np.maximum((resid**2).sum(axis=(1, 2)) / df, own)
        pooled |= _p(d[:, :k], var, df) < rule.look_alpha(k)
    assert wrong_rule / studies <= alpha
    assert pooled.mean() > alpha
    assert naive.mean() > alpha
