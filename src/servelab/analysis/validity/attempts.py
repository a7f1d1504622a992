"""The host checks, and which attempt of a re-measured point the statistics use.

A host check judges the host around a point, not the server: `contention` (CPU busy outside
the server, the client and the samplers). It reads the point's telemetry block alone, so the
sweep runs it right after a point (servelab.measure.remeasure) with the very function the
analysis runs, and measures a disturbed point again at the end of its server launch, up to
`analysis.validity.remeasure` times, each attempt in its own folder (docs/raw-data.md).

The sweep measures a disturbed point's whole repeat again (every level, in its planned order,
one attempt number for the repeat), so that the paired tests, which pair a level's repeat r
with the other levels' repeat r, keep their balance. The analysis reads such a repeat from one
attempt throughout (`use_attempts`): the first attempt of the repeat whose every point passes
the host checks; when none does, the one with the fewest disturbed points (the earliest of
those), whose disturbed points stay flagged. A point measured again alone (a sweep of an earlier
servelab re-measured the disturbed point only) keeps the rule it was measured under: the first
of its attempts that passes the host checks, and the first attempt (flagged as measured) when
none does. Either way a disturbed record is never averaged in. `Choice` says which attempt and
why, for validity.json `record` (docs/analysis.md, "Re-measured points").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from servelab.analysis.validity.catalog import BY_NAME
from servelab.analysis.validity.facts import PointFacts
from servelab.analysis.validity.flags import FAILED, Flag
from servelab.documents.declared import RecordJson
from servelab.experiment import ValiditySection
from servelab.store.rawdata import RawPoint

# the checks of the host rather than of the measurement: a point that fails one is measured
# again (the sweep-level canary's drift is judged once per sweep job, not per point)
HOST_CHECKS = ("contention",)


def host_flags(telemetry: object, t: ValiditySection) -> tuple[Flag, ...]:
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


def use_attempts(
    points: Sequence[RawPoint], t: ValiditySection
) -> list[tuple[RawPoint, Choice | None]]:
    """`use_attempt` of every point, in order, except that a repeat measured again whole (an
    attempt number past 1 that every point of the repeat has) is read from one attempt
    throughout (`row_choice`)."""
    rows: dict[tuple[str, int], list[RawPoint]] = {}
    for p in points:
        rows.setdefault((p.server_config, int(p.meta["repeat"])), []).append(p)
    chosen: dict[int, tuple[RawPoint, Choice | None]] = {}
    for row in rows.values():
        for p, pick in zip(row, row_choice(row, t), strict=True):
            chosen[id(p)] = pick
    return [chosen[id(p)] for p in points]


def row_choice(row: Sequence[RawPoint], t: ValiditySection) -> list[tuple[RawPoint, Choice | None]]:
    """The attempts of one repeat's points: one shared attempt where the repeat was measured
    again whole, each point's own choice (`use_attempt`) otherwise."""
    shared = sorted(set.intersection(*({a.attempt for a in p.attempts} for p in row)))
    if len(shared) < 2:
        return [use_attempt(p, t) for p in row]
    flags = {
        (id(p), a.attempt): host_flags(a.meta.get("telemetry"), t) for p in row for a in p.attempts
    }

    def hit(k: int) -> int:
        return sum(bool(disturbed(flags[id(p), k])) for p in row)

    k = min(shared, key=lambda j: (hit(j), j))
    out: list[tuple[RawPoint, Choice | None]] = []
    for p in row:
        said = [
            f"attempt {a.attempt} disturbed: {disturbance(flags[id(p), a.attempt])}"
            for a in p.attempts
            if disturbed(flags[id(p), a.attempt])
        ]
        whole = f"repeat measured again whole: attempt {k} of each of its points used"
        if disturbed(flags[id(p), k]):
            why = f"every attempt of its repeat has a disturbed point ({'; '.join(said)}); {whole}"
        else:
            why = "; ".join([*said, whole])
        out.append((next(a for a in p.attempts if a.attempt == k), Choice(k, len(p.attempts), why)))
    return out
