"""Measuring again a point the host disturbed (`analysis.validity.remeasure`, docs/analysis.md,
"Re-measured points").

Right after a point is measured its host checks run on its telemetry, with the analysis' own
function (servelab.analysis.validity.host_flags): today `contention`, CPU busy outside the
server, the client and the samplers. After the last scheduled point of a server launch, every
point whose latest attempt failed one is measured again on the same launch, with the same
prompts, into <point>/attempt-<N>/, in the order the disturbed points were first measured
(run order); those still disturbed go round again, until each has `remeasure` re-measures. The
pending ones are found on disk, so a launch that resumes a sweep re-measures the disturbed
points of an earlier launch too. The analysis uses the first attempt that passes the host
checks (servelab.analysis.validity.use_attempt).

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
    """Measure again, on this launch, every disturbed point of `slots` (`pending`), round after
    round until none is pending; the number of re-measures."""
    sc, n = points.sc, 0
    while todo := pending(points.paths, sc, slots, exp):
        if (reason := why_not(exp, sc)) is not None:
            points.say(f"[{sc}] {len(todo)} disturbed point(s) {reason}")
            return n
        for k, d in enumerate(todo, 1):
            slot, again = d.slot, Again(d.attempts + 1, d.reason)
            points.say(
                f"[{sc}] rep{slot.repeat:02d} {slot.name()} attempt {d.attempts} disturbed "
                f"({d.reason}); measuring it again (attempt {again.attempt})"
            )
            point = points.measure(slot, offsets[slot.key], f"again {k}/{len(todo)}", again)
            n += 1
            still = disturbed_by(point, exp)
            points.say(
                f"[{sc}] attempt {again.attempt}: "
                + (f"disturbed too ({still})" if still else "passed the host checks")
            )
    return n
