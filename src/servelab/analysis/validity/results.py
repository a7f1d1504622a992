"""What the report, validity.json and the end-of-run summary say about the checks."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from servelab.analysis.validity.catalog import checks_for, failed
from servelab.analysis.validity.flags import (
    FAILED,
    NONE,
    NOT_CHECKED,
    NOTED,
    PASSED,
    SECTION,
    STATUSES,
    Check,
    Flag,
    thresholds_json,
)
from servelab.design.level import CONCURRENCY, Level, LevelValue
from servelab.documents.declared import (
    HostSpeedJson,
    RecordJson,
    StatusCounts,
    ValidityJson,
    ValidityPoint,
)
from servelab.experiment import ValiditySection
from servelab.hostfacts.canary import RunCanary

FORMAT_VERSION = 1

# server_config, repeat, level (a concurrency, or a rate in an open-loop sweep), flags
PointFlags = tuple[str, int, LevelValue, Sequence[Flag]]


def level_name(level: LevelValue, axis: str = CONCURRENCY) -> str:
    """A level as reports name it: c=8, or rate=2.5 (requests per second)."""
    return str(Level(axis, level))


def point_name(server_config: str, repeat: int, level: LevelValue, axis: str = CONCURRENCY) -> str:
    """A point as the report and invalid-verdicts name it: 'rep02 c=1 max-num-seqs-1', or
    'rep02 rate=2.5 max-num-seqs-8' in an open-loop sweep."""
    return f"rep{repeat:02d} {level_name(level, axis)} {server_config}"


def axis_of(points: Sequence[PointFlags]) -> str:
    """The sweep's axis the points say: rate when a level is a float, else concurrency."""
    return "rate" if any(isinstance(p[2], float) for p in points) else "concurrency"


def checks_of(points: Sequence[PointFlags]) -> tuple[Check, ...]:
    """The checks the points ran: their axis's, and a trace replay's when one of them is."""
    trace = any(f.check == "trace_reuse" for *_, flags in points for f in flags)
    return checks_for(axis_of(points), trace)


def counts(points: Sequence[PointFlags]) -> dict[str, dict[str, int]]:
    """check -> status -> number of points."""
    out = {c.name: dict.fromkeys(STATUSES, 0) for c in checks_of(points)}
    for *_, flags in points:
        for f in flags:
            out[f.check][f.status] += 1
    return out


def validity_json(
    points: Sequence[PointFlags],
    t: ValiditySection,
    records: Mapping[tuple[str, int, LevelValue], RecordJson] | None = None,
) -> ValidityJson:
    """validity.json; `records`: per (server config, repeat, level) of a point measured more
    than once, which attempt its flags and statistics are of, and why (`Choice.to_json`)."""
    rec = records or {}
    rows = sorted(points, key=lambda p: (p[0], p[2], p[1]))
    axis = axis_of(rows)
    checks = checks_of(rows)
    return {
        "format_version": FORMAT_VERSION,
        "thresholds": thresholds_json(t, axis),
        "checks": [
            {
                "name": c.name,
                "definition": c.definition,
                "affects": c.affects,
                "threshold_key": f"{SECTION}.{c.threshold_key}" if c.threshold_key else None,
                "threshold": c.threshold(t),
            }
            for c in checks
        ],
        "counts": {k: _status_counts(c) for k, c in counts(rows).items()},
        "points": [_point(row, axis, rec.get(row[:3])) for row in rows],
    }


def _status_counts(c: Mapping[str, int]) -> StatusCounts:
    return {
        "passed": c[PASSED],
        "failed": c[FAILED],
        "noted": c[NOTED],
        "not checked": c[NOT_CHECKED],
    }


def _point(row: PointFlags, axis: str, record: RecordJson | None) -> ValidityPoint:
    """validity.json's entry of a point: its level on the sweep's axis, whether it is valid,
    its checks and (measured more than once) which attempt counts."""
    sc, rep, level, flags = row
    out: ValidityPoint = {
        "server_config": sc,
        "repeat": rep,
        "valid": not failed(flags),
        "checks": [f.to_json() for f in flags],
    }
    if axis == "rate":
        out["rate"] = level
    else:
        out["concurrency"] = int(level)
    if record is not None:
        out["record"] = record.copy()
    return out


def summary_line(points: Sequence[PointFlags], anchor: str = "analysis/report.md#validity") -> str:
    """One line for the end of a run: how many points were flagged and by which checks."""
    n = len(points)
    if n == 0:
        return "validity: no measured point"
    c = counts(points)
    flagged = sum(1 for *_, flags in points if failed(flags))
    checks = checks_of(points)
    excluding = [k.name for k in checks if k.affects != NONE]
    if flagged:
        by = ", ".join(f"{k} {c[k][FAILED]}" for k in excluding if c[k][FAILED])
        line = f"validity: {flagged} of {n} points flagged ({by}); see {anchor}"
    elif any(c[k][NOT_CHECKED] < n for k in excluding):
        ran = [k for k in excluding if c[k][NOT_CHECKED] < n]
        line = f"validity: all {n} points passed the {len(ran)} checks that could run"
    else:
        return f"validity: no check could run on the {n} points (no requests or telemetry)"
    skipped = [k for k in excluding if c[k][NOT_CHECKED] == n]
    if skipped:
        line += f"; not checked: {', '.join(skipped)}"
    noted = {k.name: c[k.name][NOTED] for k in checks if k.affects == NONE and c[k.name][NOTED]}
    for name, k in noted.items():
        line += f"; {name} noted on {k} point{'s' if k != 1 else ''} (not excluded)"
    return line


# what validity.json `host_speed` says of a sweep, by the canary's drift verdict
HOST_SPEED_WORDS = {
    "steady": "host speed steady",
    "moved": "the host changed speed during the sweep",
    "unsteady": "the host's speed varied while the canary ran",
}


def host_speed_json(canaries: Mapping[str, RunCanary]) -> dict[str, HostSpeedJson]:
    """validity.json `host_speed` (present only where a sweep recorded the canary): for each
    server configuration, the canary before its sweep job's first launch and after its last,
    the drift, and `noted` where it moved beyond its own noise (the host changed speed under
    the sweep) or was too noisy to call steady (docs/analysis.md, "Host speed"). Noted, not
    failed: the points stay in, and a balanced, interleaved design spreads a slow drift over
    every level alike."""
    out: dict[str, HostSpeedJson] = {}
    for sc, canary in sorted(canaries.items()):
        verdict = canary.verdict  # the CPU canary's, or the GPU canary's where it is worse
        out[sc] = {
            "status": PASSED if verdict == "steady" else NOTED,
            "reason": f"{HOST_SPEED_WORDS[verdict]}: {canary.drift.line()}",
            "before": canary.before.medians(),
            "after": canary.after.medians(),
            "drift": canary.drift.to_json(),
        }
        gpu = canary.gpu
        if gpu is None:  # a CPU runtime: no GPU part, as before it was recorded
            continue
        out[sc]["reason"] += f"; {gpu.line()}"
        if gpu.before is None or gpu.after is None or gpu.drift is None:
            out[sc]["gpu"] = {"present": False, "reason": gpu.reason}
        else:
            out[sc]["gpu"] = {
                "present": True,
                "before": gpu.before.medians(),
                "after": gpu.after.medians(),
                "drift": gpu.drift.to_json(),
            }
    return out
