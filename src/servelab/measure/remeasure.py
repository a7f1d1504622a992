"""Measuring again a point the host disturbed (`analysis.validity.remeasure`, docs/analysis.md,
"Re-measured points").

Right after a point is measured its host checks run on its telemetry, with the analysis' own
function (servelab.analysis.validity.host_flags): today `contention`, CPU busy outside the
server, the client and the samplers. After the last scheduled point of a server launch, the
whole repeat of every point whose latest attempt failed one is measured again on the same
launch, with the same prompts: every level of that repeat, in the repeat's planned (balanced)
order, each into <point>/attempt-<N>/ with one N for the repeat. A repeat still disturbed goes
round again, until its disturbed point has `remeasure` re-measures. The pending ones are found
on disk, so a launch that resumes a sweep re-measures the disturbed points of an earlier
launch too. The analysis reads a repeat so measured again from one attempt throughout: the
first whose every point passes the host checks (servelab.analysis.validity.use_attempts).

Why the whole repeat: the paired tests pair a level's repeat r with the other levels' repeat r.
A point measured alone after the launch's last one ran later than the points it pairs with, so
whatever drifts along a launch reaches it alone; where disturbance falls on one level more
than the others this turned the paired test's 5% of false positives into 13-22%
(benchmarks/README.md, "Re-measured points and the paired test's false positives"). A repeat
measured again whole keeps its order and so the pairs' balance, at the cost of measuring its
other levels again (one repeat's points per disturbed repeat).

The sweep-level host check (the host-speed canary's drift, before the job's first launch and
after its last) is no point's: it is noted in validity.json `host_speed`, never re-measured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from servelab.analysis.validity import disturbance, host_flags
from servelab.design.schedule import Slot
from servelab.experiment import Experiment
from servelab.measure.point import Again, PointJob, is_complete
from servelab.store.paths import POINT_FILE, ExperimentPaths, attempt_dirs
from servelab.store.records import DamagedRawData, PointRecord


@dataclass(frozen=True)
class Disturbed:
    """A point whose latest attempt failed a host check: its slot, how many attempts it has,
    and the failed checks in words."""

    slot: Slot
    attempts: int
    reason: str


def disturbed_by(point: Mapping[str, object], exp: Experiment) -> str:
    """The host checks a point's point.json fails under the experiment's thresholds, in words
    ('contention: 0.41 CPU cores busy ... (limit 0.25)'); '' when it passes them."""
    telemetry = point.get("telemetry")
    return disturbance(
        host_flags(telemetry if isinstance(telemetry, Mapping) else None, exp.analysis.validity)
    )


def pending(
    paths: ExperimentPaths, sc: str, slots: Sequence[Slot], exp: Experiment
) -> list[Disturbed]:
    """The complete points of `slots` whose latest attempt failed a host check and that have
    fewer than 1 + `remeasure` attempts, in run order."""
    limit = exp.analysis.validity.remeasure
    out = []
    for slot in sorted(slots, key=lambda s: s.run_index):
        folder = paths.slot(sc, slot)
        if limit == 0 or not is_complete(folder):
            continue
        attempts = [folder, *attempt_dirs(folder)]
        if len(attempts) > limit:
            continue
        try:
            latest = PointRecord.read(attempts[-1] / POINT_FILE)
        except DamagedRawData:
            continue  # the analysis reports it; nothing to judge the host by
        why = disturbed_by(latest.doc, exp)
        if why:
            out.append(Disturbed(slot, len(attempts), why))
    return out


@dataclass(frozen=True)
class Row:
    """A repeat to measure again whole: its slots in run order, the attempt every one of them
    is measured as (one more than the most any of them has), and why (its disturbed points)."""

    repeat: int
    slots: tuple[Slot, ...]
    attempt: int
    disturbed: tuple[Disturbed, ...]

    def reason(self, slot: Slot) -> str:
        """point.json `remeasure_reason` of the slot's re-measure: its own failed host checks,
        or the disturbed point whose repeat it is measured again with."""
        own = [d.reason for d in self.disturbed if d.slot.key == slot.key]
        if own:
            return own[0]
        first = self.disturbed[0]
        return (
            f"its repeat is measured again whole, in its planned order: {first.slot.name()} "
            f"was disturbed ({first.reason})"
        )


def pending_rows(
    paths: ExperimentPaths, sc: str, slots: Sequence[Slot], exp: Experiment
) -> list[Row]:
    """The repeats of `slots` with a disturbed point (`pending`), in run order, each with its
    complete points."""
    todo = pending(paths, sc, slots, exp)
    out = []
    for repeat in sorted({d.slot.repeat for d in todo}):
        row = [
            s
            for s in sorted(slots, key=lambda s: s.run_index)
            if s.repeat == repeat and is_complete(paths.slot(sc, s))
        ]
        most = max(1 + len(attempt_dirs(paths.slot(sc, s))) for s in row)
        hit = tuple(d for d in todo if d.slot.repeat == repeat)
        out.append(Row(repeat, tuple(row), most + 1, hit))
    return out


def why_not(exp: Experiment, sc: str) -> str | None:
    """Why the disturbed points of `sc` are not measured again, or None when they are: unique
    prompts through a prefix cache (the re-measure's prompts would be served from the cache the
    first attempt filled)."""
    if exp.workload.unique_prompts and exp.server.args_of(sc).get("enable-prefix-caching"):
        return (
            "not measured again: the configuration caches prefixes and every point sends its "
            "own prompts, which the first attempt left in the cache"
        )
    return None


def remeasure(
    points: PointJob,
    slots: Sequence[Slot],
    offsets: Mapping[tuple[int, int | float], int],
    exp: Experiment,
) -> int:
    """Measure again, on this launch, the whole repeat of every disturbed point of `slots`
    (`pending_rows`), round after round until none is pending; the number of re-measures."""
    sc, n = points.sc, 0
    while rows := pending_rows(points.paths, sc, slots, exp):
        if (reason := why_not(exp, sc)) is not None:
            hit = sum(len(r.disturbed) for r in rows)
            points.say(f"[{sc}] {hit} disturbed point(s) {reason}")
            return n
        total, k = sum(len(r.slots) for r in rows), 0
        for row in rows:
            for d in row.disturbed:
                points.say(
                    f"[{sc}] rep{row.repeat:02d} {d.slot.name()} attempt {d.attempts} disturbed "
                    f"({d.reason}); measuring rep{row.repeat:02d} again whole, in its planned "
                    f"order (attempt {row.attempt})"
                )
            for slot in row.slots:
                k += 1
                again = Again(row.attempt, row.reason(slot))
                point = points.measure(slot, offsets[slot.key], f"again {k}/{total}", again)
                still = disturbed_by(point, exp)
                points.say(
                    f"[{sc}] rep{slot.repeat:02d} {slot.name()} attempt {row.attempt}: "
                    + (f"disturbed too ({still})" if still else "passed the host checks")
                )
        n += k
    return n
