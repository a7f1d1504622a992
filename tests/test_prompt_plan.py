"""Which prompts the warm-up and every point send (servelab.workload.synthetic.prompt_plan)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from servelab.design.schedule import Slot, plan
from servelab.workload.synthetic import prompt_plan

LEVELS = [1, 2, 4, 8, 16]


def _waves(waves: int) -> Callable[[Slot], int]:
    """A closed-loop point's requests: concurrency x waves."""
    return lambda s: (s.level.concurrency or 0) * waves


def test_unique_prompts_give_every_point_its_own_range_after_the_warmup() -> None:
    slots = plan(LEVELS, 3, "latin")
    waves, warmup = 4, 16
    pp = prompt_plan(slots, _waves(waves), warmup, unique=True)
    # the default experiment: 16 warm-up prompts + 3 repeats x (1+2+4+8+16) x 4
    assert pp.total == 16 + 3 * 31 * 4 == 388
    assert pp.warmup_offset == 0
    assert set(pp.offsets) == {(s.repeat, s.level.value) for s in slots}
    # in the order of the plan, contiguous, starting after the warm-up, ending at the total
    at = warmup
    for s in slots:
        assert pp.offsets[(s.repeat, s.level.value)] == at
        at += s.level.value * waves
    assert at == pp.total
    # disjoint: no prompt is sent twice, the warm-up's included
    used = list(range(pp.warmup_offset, pp.warmup_offset + warmup))
    for s in slots:
        start = pp.offsets[(s.repeat, s.level.value)]
        used += range(start, start + s.level.value * waves)
    assert sorted(used) == list(range(pp.total))


def test_offsets_depend_on_the_full_plan_not_on_what_is_left_to_do() -> None:
    """A resumed run measures only some slots but plans with all of them (the sweep passes
    every slot; tests/test_runtime_container.py checks it on a resumed sweep), so each point
    gets the prompts a fresh run would have given it; planning with the remaining slots alone
    would not."""
    slots = plan(LEVELS, 2, "williams")
    fresh = prompt_plan(slots, _waves(2), 8, unique=True)
    assert prompt_plan(list(slots), _waves(2), 8, unique=True) == fresh  # a pure function
    todo = slots[3:]
    partial = prompt_plan(todo, _waves(2), 8, unique=True)
    keys = [(s.repeat, s.level.value) for s in todo]
    assert [partial.offsets[k] for k in keys] != [fresh.offsets[k] for k in keys]
    # another order gives other ranges, each still its own
    other = prompt_plan(plan(LEVELS, 2, "fixed"), _waves(2), 8, unique=True)
    assert other.total == fresh.total and other.offsets != fresh.offsets


@pytest.mark.parametrize("warmup", [0, 16, 200])
def test_shared_prompts_are_the_first_ones_as_before(warmup: int) -> None:
    slots = plan(LEVELS, 3, "latin")
    pp = prompt_plan(slots, _waves(4), warmup, unique=False)
    assert pp.warmup_offset == 0
    assert set(pp.offsets.values()) == {0}
    assert pp.total == max(16 * 4, warmup)


def test_no_warmup_starts_the_first_point_at_zero() -> None:
    slots = plan([3, 1], 1, "fixed")
    pp = prompt_plan(slots, _waves(2), 0, unique=True)
    assert pp.offsets == {(1, 3): 0, (1, 1): 6} and pp.total == 8


def test_rate_points_take_their_own_counts_of_prompts() -> None:
    """An open-loop sweep: each rate's point sends ceil(rate x duration_s) prompts, keyed by
    (repeat, rate), and the rate slots name their level in run.json without a concurrency."""
    slots = plan([0.5, 2.0], 2, "latin", axis="rate")
    counts = {0.5: 5, 2.0: 20}
    pp = prompt_plan(slots, lambda s: counts[s.level.value], 4, unique=True)
    assert set(pp.offsets) == {(1, 0.5), (1, 2.0), (2, 0.5), (2, 2.0)}
    assert pp.total == 4 + 2 * (5 + 20)
    assert [s.to_json() for s in slots[:2]] == [
        {"repeat": 1, "rate": 0.5, "position": 0, "run_index": 0},
        {"repeat": 1, "rate": 2.0, "position": 1, "run_index": 1},
    ]
    assert plan([4], 1, "fixed")[0].to_json() == {
        "repeat": 1,
        "concurrency": 4,
        "position": 0,
        "run_index": 0,
    }
