"""A point's level: the load it was measured at, a concurrency (a closed loop: that many requests
always in flight) or an arrival rate in requests per second (an open loop: requests sent on a
schedule whether or not the earlier ones have ended).

`Level` is what every reader of a point's level goes through: how a point record (point.json,
run.json's plan) says it (`from_record`, `to_json`), how its folder is named in the raw layout
(`dirname`: c0008, r0002.500), how progress lines and reports print it (`str`: c=8, rate=2.5),
and how levels sort (by axis, concurrency first, then by value).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

CONCURRENCY = "concurrency"
RATE = "rate"
AXES = (CONCURRENCY, RATE)

LevelValue = int | float  # a level's number: a concurrency (int) or a rate (float, req/s)


def _number(value: object, key: str) -> LevelValue:
    """A record's level, a number."""
    if not isinstance(value, int | float):
        raise TypeError(f"{key}: {value!r} is not a number")
    return value


@dataclass(frozen=True, order=True)
class Level:
    """One level on one axis: `axis` is "concurrency" or "rate" (the key point records and
    tables name the level by), `value` the concurrency (an int) or the rate in requests per
    second (a float). Levels sort by axis (concurrency first), then by value; a concurrency and
    a rate are never equal."""

    axis: str
    value: LevelValue

    def __post_init__(self) -> None:
        if self.axis not in AXES:
            raise ValueError(f"level axis {self.axis!r} is not one of {', '.join(AXES)}")

    @classmethod
    def at_concurrency(cls, concurrency: int) -> Level:
        """A closed loop's level: `concurrency` requests in flight."""
        return cls(CONCURRENCY, int(concurrency))

    @classmethod
    def at_rate(cls, rate: float) -> Level:
        """An open loop's level: `rate` requests per second."""
        return cls(RATE, float(rate))

    @classmethod
    def on(cls, axis: str, value: LevelValue) -> Level:
        """The level `value` on `axis` ("concurrency": an int, "rate": a float)."""
        return cls.at_rate(value) if axis == RATE else cls(axis, int(value))

    @classmethod
    def from_record(cls, record: Mapping[str, object]) -> Level:
        """The level a record gives (point.json, a slot of run.json's plan): its `rate` when it
        has one that is not null (an open-loop point), else its `concurrency` (KeyError when it
        has neither; TypeError where the one it has is not a number)."""
        rate = record.get(RATE)
        if rate is not None:
            return cls.at_rate(_number(rate, RATE))
        return cls.at_concurrency(int(_number(record[CONCURRENCY], CONCURRENCY)))

    @property
    def is_rate(self) -> bool:
        """An open loop's level (a request rate)."""
        return self.axis == RATE

    @property
    def concurrency(self) -> int | None:
        """The concurrency; None at a rate."""
        return None if self.is_rate else int(self.value)

    @property
    def rate(self) -> float | None:
        """The request rate (requests per second); None at a concurrency."""
        return float(self.value) if self.is_rate else None

    def to_json(self) -> dict[str, LevelValue]:
        """The level as point records hold it: {"concurrency": 8} or {"rate": 2.5}."""
        return {self.axis: self.value}

    @property
    def dirname(self) -> str:
        """The folder of the level's points in the raw layout (servelab.store.paths): c, the
        concurrency with at least four digits (c0008); r, the rate with at least four digits
        before the point and three after it (r0002.500)."""
        if self.is_rate:
            return f"r{self.value:08.3f}"
        return f"c{self.value:04d}"

    def __str__(self) -> str:
        """How progress lines and reports name the level: c=8, or rate=2.5."""
        return f"rate={self.value:g}" if self.is_rate else f"c={self.value}"
