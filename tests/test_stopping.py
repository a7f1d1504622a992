"""The stopping rule of sequential rounds (servelab.analysis.stopping)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from servelab.analysis.stopping import (
    OPEN,
    Cell,
    Question,
    StoppingRule,
    decide,
    pooled_at,
    pooled_variance,
    sequential_test,
)
from servelab.analysis.stopping import (
    test_at as look_test,
)


def test_pooled_variance_by_hand() -> None:
    # log values: row means .05 .15 .25, column means .1 .2, grand mean .15; residuals
    # 0 0 / .1 -.1 / -.1 .1, so SS = .04 on (3 - 1) x (2 - 1) = 2 degrees of freedom
    logs = [[0.0, 0.1], [0.2, 0.1], [0.1, 0.4]]
    got = pooled_variance([[math.exp(x) for x in row] for row in logs])
    assert got is not None
    assert got.df == 2
    assert got.variance == pytest.approx(0.02)


def test_pooled_variance_needs_two_rows_and_two_columns() -> None:
    assert pooled_variance([[1.0, 2.0]]) is None
    assert pooled_variance([[1.0], [2.0]]) is None
    assert pooled_variance([]) is None


def test_sequential_test_decides_a_clear_effect() -> None:
    t = sequential_test([110.0, 111.0, 109.0, 110.0], [100.0, 101.0, 99.0, 100.0], None, 0.01)
    assert t.verdict == "a > b"
    assert t.df == 3
    assert t.p_value is not None and t.p_value < 0.01
    t = sequential_test([90.0, 91.0, 89.0], [100.0, 101.0, 99.0], None, 0.01)
    assert t.verdict == "a < b"


def test_sequential_test_stays_open_on_noise() -> None:
    t = sequential_test([100.0, 103.0, 97.0, 101.0], [101.0, 99.0, 100.0, 98.0], None, 0.05)
    assert t.verdict == OPEN
    # no look (alpha 0) decides nothing, however clear
    t = sequential_test([200.0, 201.0, 199.0], [100.0, 100.5, 99.5], None, 0.0)
    assert t.verdict == OPEN


def test_sequential_test_uses_the_larger_of_pooled_and_own_spread() -> None:
    a, b = [105.0, 106.0, 104.0], [100.0, 100.0, 100.0]
    small = pooled_variance([[1.0, 1.0001, 1.0], [1.0, 1.0, 1.0001]])
    big = pooled_variance([[1.0, 1.5, 0.7], [1.0, 0.7, 1.5]])
    assert small is not None and big is not None
    own = float(np.var(np.log(np.array(a) / np.array(b)), ddof=1)) / 2.0
    t = sequential_test(a, b, small, 0.05)
    assert t.se == pytest.approx(math.sqrt(2.0 * own / 3))
    assert t.df == small.df  # the pooled degrees of freedom, with the own variance
    t = sequential_test(a, b, big, 0.05)
    assert t.se == pytest.approx(math.sqrt(2.0 * big.variance / 3))
    assert t.verdict == OPEN


def test_look_alpha_spends_alpha_over_the_looks() -> None:
    rule = StoppingRule(2, 6, 0.05)
    assert rule.looks == 5
    assert [rule.look_alpha(k) for k in range(1, 8)] == pytest.approx(
        [0.0, 0.01, 0.01, 0.01, 0.01, 0.01, 0.0]
    )
    assert StoppingRule(3, 3, 0.05).look_alpha(3) == pytest.approx(0.05)
    assert StoppingRule.from_json(rule.to_json()) == rule


def _tables(rows: dict[Cell, list[float]]) -> dict[str, dict[Cell, dict[int, float]]]:
    return {"m": {c: {r + 1: v for r, v in enumerate(vals)} for c, vals in rows.items()}}


def test_decide_keeps_the_first_verdict() -> None:
    # a = 2 b in rounds 1-2, a = b / 2 in rounds 3-4: decided at round 2, and the later looks,
    # which alone would not say "holds", keep that verdict and its evidence
    tables = _tables(
        {
            ("x", 1): [200.0, 202.0, 50.0, 50.5],
            ("x", 2): [100.0, 100.0, 100.0, 100.0],
            ("x", 4): [100.0, 101.0, 100.0, 101.0],
        }
    )
    q = Question("a > b", "m", ("x", 1), ("x", 2), ">")
    rule = StoppingRule(2, 4, 0.05)
    looks = decide([q], tables, rule, 4)
    assert [row[0].verdict for row in looks] == ["holds", "holds", "holds"]
    assert [row[0].round for row in looks] == [2, 2, 2]
    assert looks[2][0].test == looks[0][0].test
    assert q.verdict(look_test(q, tables, rule, 4)) != "holds"
    # decide stops at max rounds
    assert len(decide([q], tables, StoppingRule(2, 3, 0.05), 4)) == 2


def test_threshold_blocks_a_small_real_difference() -> None:
    a, b = [101.0, 101.1, 100.9, 101.0], [100.0, 100.1, 99.9, 100.0]
    assert sequential_test(a, b, None, 0.05).verdict == "a > b"
    assert sequential_test(a, b, None, 0.05, threshold_pct=2.0).verdict == OPEN
    tables = _tables({("x", 1): a, ("x", 2): b, ("x", 4): [50.0, 50.1, 49.9, 50.0]})
    rule = StoppingRule(2, 4, 0.05)
    small = Question("1% > 0", "m", ("x", 1), ("x", 2), ">", threshold_pct=2.0)
    assert [row[0].verdict for row in decide([small], tables, rule, 4)] == [OPEN] * 3
    plain = Question("1% > 0", "m", ("x", 1), ("x", 2), ">")
    assert decide([plain], tables, rule, 4)[-1][0].verdict == "holds"


def test_spending_keeps_the_wrong_verdicts_under_alpha() -> None:
    """No true effect: 10 points with equal medians and a 5% CV, one question, looks after
    rounds 2..6. The rule's share of studies with a wrong verdict stays under alpha; testing at
    the full alpha at every look (no spending) exceeds it (at this seed: 0.020 and 0.128; at
    seeds 1-3: 0.015-0.025 and 0.093-0.118)."""
    rng = np.random.default_rng(20240601)
    studies, cells, rounds, alpha = 400, 10, 6, 0.05
    rule = StoppingRule(2, rounds, alpha)
    keys = [("c", i) for i in range(cells)]
    q = Question("c0 > c1", "m", keys[0], keys[1], ">")
    sigma = math.sqrt(math.log1p(0.05**2))
    wrong_rule = wrong_naive = 0
    for _ in range(studies):
        values = np.exp(sigma * rng.standard_normal((cells, rounds)))
        tables = _tables({k: list(map(float, values[i])) for i, k in enumerate(keys)})
        wrong_rule += decide([q], tables, rule, rounds)[-1][0].verdict != OPEN
        m = tables["m"]
        wrong_naive += any(
            sequential_test(
                [m[q.a][r] for r in range(1, k + 1)],
                [m[q.b][r] for r in range(1, k + 1)],
                pooled_at(m, k),
                alpha,
            ).verdict
            != OPEN
            for k in range(2, rounds + 1)
        )
    assert wrong_rule / studies <= alpha
    assert wrong_naive / studies > alpha
