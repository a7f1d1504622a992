from __future__ import annotations

from collections import Counter

import pytest

from servelab.design.schedule import orders, plan
from servelab.errors import ServelabError


def test_latin_square_full_puts_each_point_once_in_each_position() -> None:
    rows = orders("latin", 5, 5)
    for pos in range(5):
        assert sorted(r[pos] for r in rows) == list(range(5))
    for r in rows:
        assert sorted(r) == list(range(5))


def test_latin_partial_uses_distinct_positions() -> None:
    rows = orders("latin", 5, 3)
    for point in range(5):
        positions = [r.index(point) for r in rows]
        assert len(set(positions)) == 3


@pytest.mark.parametrize("k", [2, 3, 4, 5, 6])
def test_williams_balances_first_order_carry_over(k: int) -> None:
    n = k if k % 2 == 0 else 2 * k
    rows = orders("williams", k, n)
    pairs = Counter((a, b) for r in rows for a, b in zip(r, r[1:], strict=False))
    expected = 1 if k % 2 == 0 else 2
    assert set(pairs.values()) == {expected}
    assert len(pairs) == k * (k - 1)


def test_fixed_and_random() -> None:
    assert orders("fixed", 3, 2) == [[0, 1, 2], [0, 1, 2]]
    a = orders("random", 6, 4, seed=7)
    assert a == orders("random", 6, 4, seed=7)
    assert a != orders("random", 6, 4, seed=8)
    assert all(sorted(r) == list(range(6)) for r in a)


def test_plan_records_position_and_run_index() -> None:
    slots = plan([1, 2, 4], 3, "latin")
    assert [(s.repeat, s.level.value, s.position) for s in slots[:4]] == [
        (1, 1, 0),
        (1, 2, 1),
        (1, 4, 2),
        (2, 2, 0),
    ]
    assert [s.run_index for s in slots] == list(range(9))


def test_bad_order_is_a_clear_error() -> None:
    with pytest.raises(ServelabError, match="sweep.order: 'zigzag'"):
        orders("zigzag", 3, 3)
