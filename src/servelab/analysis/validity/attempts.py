"""The host checks, and which attempt of a re-measured point the statistics use.

A host check judges the host around a point, not the server: `contention` (CPU busy outside
the server, the client and the samplers). It reads the point's telemetry block alone, so the
sweep runs it right after a point (servelab.measure.remeasure) with the very function the
analysis runs, and measures a disturbed point again at the end of its server launch, up to
`analysis.validity.remeasure` times, each attempt in its own folder (docs/raw-data.md).

The analysis then uses the first attempt that passes the host checks, and the first attempt
(flagged as measured) when none does: a disturbed record is never averaged in. `Choice` says
which one and why, for validity.json `record` (docs/analysis.md, "Re-measured points").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from servelab.analysis.validity.catalog import BY_NAME
from servelab.analysis.validity.facts import PointFacts
from servelab.analysis.validity.flags import FAILED, Flag
from servelab.experiment import ValiditySection
from servelab.store.rawdata import RawPoint

# the checks of the host rather than of the measurement: a point that fails one is measured
# again (the sweep-level canary's drift is judged once per sweep job, not per point)
HOST_CHECKS = ("contention",)


def host_flags(telemetry: Mapping[str, Any] | None, t: ValiditySection) -> tuple[Flag, ...]:
    """The host checks of one point from its point.json `telemetry` block: what the sweep
    knows right after the point, and all the analysis' own checks read for them."""
    facts = PointFacts((), None, telemetry if isinstance(telemetry, Mapping) else None)
    return tuple(BY_NAME[name].run(facts, t) for name in HOST_CHECKS)


def disturbed(flags: Sequence[Flag]) -> list[Flag]:
    """The host checks among `flags` that failed."""
    return [f for f in flags if f.check in HOST_CHECKS and f.status == FAILED]


def disturbance(flags: Sequence[Flag]) -> str:
    """A disturbed attempt's failed host checks in words: 'contention: 0.41 CPU cores ...'."""
    return "; ".join(f"{f.check}: {f.reason}" for f in disturbed(flags))


class RecordJson(TypedDict):
    """validity.json `record` of a point measured more than once."""

    attempt: int  # the attempt the statistics use
    attempts: int  # complete attempts on disk
    reason: str


@dataclass(frozen=True)
class Choice:
    """The attempt of a point the statistics use (1-based, as the folders number them), of
    how many, and why."""

    attempt: int
    attempts: int
    reason: str

    def to_json(self) -> RecordJson:
        return {"attempt": self.attempt, "attempts": self.attempts, "reason": self.reason}


def choose(host: Sequence[tuple[int, Sequence[Flag]]]) -> Choice:
    """Which attempt to use, from each attempt's number and host checks, the first attempt
    first: the first that passes them; the first, flagged, when none does."""
    n = len(host)
    said = [f"attempt {k} disturbed: {disturbance(h)}" for k, h in host if disturbed(h)]
    for i, (k, flags) in enumerate(host):
        if disturbed(flags):
            continue
        if i == 0:
            kept = f"{n - 1} re-measure{'s' if n > 2 else ''}"
            return Choice(k, n, f"attempt {k} passed the host checks; the {kept} kept unused")
        return Choice(k, n, f"{'; '.join(said)}; attempt {k} used")
    first = host[0][0]
    return Choice(first, n, f"every attempt disturbed ({'; '.join(said)}); attempt {first} used")


def use_attempt(point: RawPoint, t: ValiditySection) -> tuple[RawPoint, Choice | None]:
    """The attempt of a measured point the statistics read, and the choice (None for a point
    measured once)."""
    if not point.remeasures:
        return point, None
    attempts = point.attempts
    choice = choose([(a.attempt, host_flags(a.meta.get("telemetry"), t)) for a in attempts])
    return next(a for a in attempts if a.attempt == choice.attempt), choice
