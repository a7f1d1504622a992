"""Balanced run orders for repeated points.

Each function returns one order per repeat: a list of indices into the points. A cyclic Latin
square puts every point in a different position in each repeat (and in every position once when
repeats == points); a Williams design also balances which point runs right before which.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from servelab.design.level import CONCURRENCY, Level, LevelValue
from servelab.errors import ServelabError

ORDERS = ("latin", "williams", "fixed", "random")

T = TypeVar("T")


def in_turn(items: Sequence[T], k: int) -> list[T]:
    """Items taking turns at step k: as listed in odd steps, reversed in even ones (A B, B A,
    A B, ...), so that none always goes first: the configurations of an interleaved plan's
    round k, a side-by-side round's pair at its k-th level, a sliced pair's k-th slice."""
    return list(items) if k % 2 else list(items)[::-1]


def latin(k: int, repeats: int) -> list[list[int]]:
    return [[(i + r) % k for i in range(k)] for r in range(repeats)]


def williams(k: int, repeats: int) -> list[list[int]]:
    """Williams design rows (k rows for even k, 2k for odd k), cycled when repeats exceed them."""
    first = [0]
    lo, hi = 1, k - 1
    while len(first) < k:
        first.append(lo)
        lo += 1
        if len(first) < k:
            first.append(hi)
            hi -= 1
    rows = [[(x + r) % k for x in first] for r in range(k)]
    if k % 2 == 1:
        rows += [list(reversed(row)) for row in rows]
    return [rows[r % len(rows)] for r in range(repeats)]


def fixed(k: int, repeats: int) -> list[list[int]]:
    return [list(range(k)) for _ in range(repeats)]


def seeded_random(k: int, repeats: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    out = []
    for _ in range(repeats):
        row = list(range(k))
        rng.shuffle(row)
        out.append(row)
    return out


def orders(kind: str, k: int, repeats: int, seed: int = 0) -> list[list[int]]:
    if k < 1 or repeats < 1:
        raise ServelabError(
            f"schedule: need at least one point and one repeat (got {k}, {repeats})"
        )
    if kind == "latin":
        return latin(k, repeats)
    if kind == "williams":
        return williams(k, repeats)
    if kind == "fixed":
        return fixed(k, repeats)
    if kind == "random":
        return seeded_random(k, repeats, seed)
    raise ServelabError(f"sweep.order: {kind!r} is not one of {', '.join(ORDERS)}")


@dataclass(frozen=True)
class Slot:
    """One measured point in the run: which repeat, which level (a concurrency, or a request
    rate for an open-loop sweep), where in the order."""

    repeat: int  # 1-based
    level: Level
    position: int  # index within its repeat's order
    run_index: int  # index in the whole run

    @property
    def key(self) -> tuple[int, LevelValue]:
        """(repeat, level value): the point's identity within one configuration."""
        return (self.repeat, self.level.value)

    def name(self) -> str:
        """How progress lines name the level: c=8, rate=2.5."""
        return str(self.level)

    def to_json(self) -> dict[str, LevelValue]:
        """The slot as run.json's plan lists it (the key of the level it has)."""
        return {
            "repeat": self.repeat,
            **self.level.to_json(),
            "position": self.position,
            "run_index": self.run_index,
        }


def plan(
    levels: Sequence[LevelValue], repeats: int, kind: str, seed: int = 0, axis: str = CONCURRENCY
) -> list[Slot]:
    """Every (repeat, level) of a balanced design: levels are concurrencies, or request rates
    with axis "rate"."""
    values = [Level.on(axis, v) for v in levels]
    slots: list[Slot] = []
    for r, row in enumerate(orders(kind, len(values), repeats, seed), 1):
        for pos, idx in enumerate(row):
            slots.append(Slot(r, values[idx], pos, len(slots)))
    return slots
