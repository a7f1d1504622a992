"""The values the summary reads from a run's records (point.json, launch.json, run.json):
numbers, seconds and lists as the records hold them, one place for the summary's modules."""

from __future__ import annotations

import statistics
from collections.abc import Mapping

from servelab.documents import JsonValue

# a point's point.json, as read
PointDoc = Mapping[str, JsonValue]


def mean_of(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def num_of(value: JsonValue) -> float:
    """A number of a record (TypeError where it is not one), as it is (an int stays an int)."""
    if not isinstance(value, int | float):
        raise TypeError(f"expected a number, got {value!r}")
    return value


def seconds_of(value: JsonValue) -> float:
    """Seconds a record gives, 0.0 where it gives none (null, absent)."""
    return float(num_of(value)) if value else 0.0


def items_of(value: JsonValue) -> list[JsonValue]:
    """The entries of a record's list ([] where there is none)."""
    return value if isinstance(value, list) else []
