"""search.json's document, as `analysis.search` writes it (`SearchResult.to_json`) and the
report and the claims read it: the spec, the path (every rate measured, with its repeats) and
the answer."""

from __future__ import annotations

from typing import TypedDict


class RepeatJson(TypedDict):
    """A repeat of a rate: its SLO attainment (None without requests), whether it was valid,
    how many requests it sent and, when invalid, why."""

    attainment: float | None
    valid: bool
    requests: int | None
    reasons: list[str]


class SpecJson(TypedDict):
    """How the search ran (`SearchSpec`)."""

    start_rate: float
    bounds: dict[str, float | None]
    target: float
    growth: float
    tolerance: float
    max_measurements: int
    min_rate: float | None
    max_rate: float | None
    resolution: float | None


class StepJson(TypedDict):
    """A measured rate of the path (`Step`)."""

    order: int
    phase: str
    rate: float
    repeats: list[RepeatJson]
    meets: bool


class AnswerJson(TypedDict):
    """The search's answer (`Answer`), with its bracket's relative width and its words."""

    met_rate: float | None
    failed_rate: float | None
    relative_width: float | None
    stopped: str
    reason: str | None
    text: str


class SearchJson(TypedDict):
    """search.json."""

    format_version: int
    spec: SpecJson
    path: list[StepJson]
    answer: AnswerJson
