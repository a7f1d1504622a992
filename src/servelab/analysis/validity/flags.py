"""The vocabulary of the validity checks: a check's outcome (Flag), the check itself (Check:
its name, definition, what a failure removes, its threshold key) and the thresholds as
validity.json records them."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from servelab.analysis.validity.facts import number
from servelab.documents.declared import FlagJson
from servelab.experiment import ValiditySection

if TYPE_CHECKING:
    from servelab.analysis.validity.facts import PointFacts

PASSED, FAILED, NOTED, NOT_CHECKED = "passed", "failed", "noted", "not checked"
STATUSES = (PASSED, FAILED, NOTED, NOT_CHECKED)
LATENCY, TTFT, ITL, ALL, NONE = "latency", "ttft", "itl", "all", "none"
TTFT_E2EL = "ttft_e2el"
AFFECTS_WORDS = {
    LATENCY: "TTFT, TPOT, ITL",
    TTFT: "TTFT",
    ITL: "ITL",
    TTFT_E2EL: "TTFT, E2EL",
    ALL: "every metric",
    NONE: "nothing (note)",
}
AFFECTED_METRIC = {
    LATENCY: re.compile(r"_(ttft|tpot|itl)_ms$"),
    TTFT: re.compile(r"_ttft_ms$"),
    ITL: re.compile(r"_itl_ms$"),
    TTFT_E2EL: re.compile(r"_(ttft|e2el)_ms$"),
}
SECTION = "analysis.validity"


# the thresholds of the open-loop checks, recorded for a sweep over rates only
OPEN_LOOP_THRESHOLDS = ("max_arrival_rate_error_pct", "max_send_slip_ms")
# the keys of analysis.validity that are no threshold: how often the sweep re-measures a point
# a host check failed (validity.json `record` says which attempt a point uses)
NOT_THRESHOLDS = ("remeasure",)
# thresholds absent from a config unless given (None): their checks' own defaults
DEFAULT_THRESHOLDS = {"min_trace_reuse": 0.5, "max_trace_missing_pct": 5.0}


def threshold_of(t: ValiditySection, key: str) -> float:
    """The threshold `key` of analysis.validity, or its default when the config leaves it out."""
    v = getattr(t, key)
    return float(DEFAULT_THRESHOLDS[key] if v is None else v)


def thresholds_json(t: ValiditySection, axis: str = "concurrency") -> dict[str, float]:
    """The thresholds as validity.json records them: numbers, counts as integers; those of
    the open-loop checks for a sweep over rates only."""
    return {
        f.name: int(v) if f.name == "max_failed_requests" else float(v)
        for f in fields(t)
        for v in [getattr(t, f.name)]
        if v is not None
        and f.name not in NOT_THRESHOLDS
        and (axis == "rate" or f.name not in OPEN_LOOP_THRESHOLDS)
    }


@dataclass(frozen=True)
class Flag:
    check: str
    status: str
    value: float | None
    threshold: float | None
    reason: str

    def to_json(self) -> FlagJson:
        return {
            "check": self.check,
            "status": self.status,
            "value": self.value,
            "threshold": self.threshold,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Check:
    name: str
    definition: str
    affects: str  # LATENCY | TTFT | ITL | TTFT_E2EL | ALL | NONE
    threshold_key: str | None  # key under analysis.validity
    run: Callable[[PointFacts, ValiditySection], Flag]

    def removes(self, metric: str) -> bool:
        if self.affects == ALL:
            return True
        pattern = AFFECTED_METRIC.get(self.affects)
        return pattern is not None and pattern.search(metric) is not None

    def threshold(self, t: ValiditySection) -> float | None:
        return None if self.threshold_key is None else threshold_of(t, self.threshold_key)


def number_text(x: float) -> str:
    """A number in a flag's words, as short as it reads exactly (0.25, 5, 1e+06)."""
    return f"{x:g}"


def share_text(x: float) -> str:
    return f"{100 * x:.3g}%"


def block(d: Mapping[str, object], key: str) -> Mapping[str, object]:
    """A JSON block's block `key` (point.json's telemetry, trace or arrival); {} where it
    has none."""
    v = d.get(key)
    return v if isinstance(v, Mapping) else {}


def block_mean(d: Mapping[str, object], key: str) -> float | None:
    v = block(d, key).get("mean")
    return None if v is None else number(v)
