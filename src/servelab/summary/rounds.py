"""The summary's lines for a sequential sweep (sweep.repeats: {min, max}): where its one
stage's time went, per step of rounds (its server starts, its points, the rest) and the look
after each, from run.json's `sequential` record."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from servelab.analysis.rounds import STOPPED
from servelab.documents import JsonObject, JsonValue
from servelab.store.paths import ExperimentPaths
from servelab.store.records import LaunchRecord, RunRecord
from servelab.summary.values import PointDoc, items_of, num_of, seconds_of

# A sequential sweep (sweep.repeats: {min, max}): one Snakemake stage, `sweep`, measures every
# configuration round by round (servelab.measure.sequential); its run.json `sequential` record
# has the rounds, the seconds of each step of rounds, every look and every launch.


@dataclass(frozen=True)
class RoundStep:
    """A step of a sequential sweep's rounds: rounds `first` to `last`, measured together
    (the first step measures the first `min` rounds on one launch per configuration, each
    later step one round on fresh launches), its seconds (run.json `round_s`; None where not
    recorded) and the look after it."""

    first: int
    last: int
    seconds: float | None
    look: JsonObject | None

    @property
    def label(self) -> str:
        return (
            f"round {self.last}" if self.first == self.last else f"rounds {self.first}-{self.last}"
        )


@dataclass(frozen=True)
class RoundStart:
    """A server launch of a sequential sweep: the round of the look after it, its
    configuration, its index, its start (ready_s, None where not recorded) and its wait for
    the measuring-server lock."""

    round: int
    server_config: str
    launch: int | None
    ready_s: float | None
    waited_s: float

    def describe(self) -> str:
        start = f"{self.ready_s:.1f} s" if self.ready_s is not None else "?"
        lock = (
            f" after {self.waited_s:.0f} s waiting for the measuring-server lock"
            if self.waited_s >= 1
            else ""
        )
        return (
            f"{self.server_config} #{self.launch if self.launch is not None else '?'} {start}{lock}"
        )


def sequential_record(exp_dir: Path) -> JsonObject | None:
    """The sequential sweep's record (run.json `sequential`, the same in every
    configuration's); None for a fixed number of repeats."""
    for path in ExperimentPaths(exp_dir).run_files():
        run = RunRecord.read_if_present(path)
        if run is not None and run.sequential is not None:
            return run.sequential
    return None


def _rounds_of(entries: JsonValue) -> dict[int, JsonObject]:
    """A record's entries per round (`looks`, `compared`: each names its `round`)."""
    out: dict[int, JsonObject] = {}
    for e in items_of(entries):
        if isinstance(e, dict) and isinstance(e.get("round"), int):
            out[int(num_of(e["round"]))] = e
    return out


def round_steps(seq: JsonObject) -> list[RoundStep]:
    """The steps of rounds the record says were measured: rounds 1 to `min`, then one round
    each up to `rounds`, with their `round_s` and looks."""
    rounds = int(num_of(seq.get("rounds") or 0))
    rule = seq.get("rule")
    lowest = min(
        int(num_of((rule.get("min_rounds") if isinstance(rule, dict) else None) or 1)), rounds
    )
    spans = ([(1, lowest)] if lowest >= 1 else []) + [(k, k) for k in range(lowest + 1, rounds + 1)]
    round_s = [float(x) for x in items_of(seq.get("round_s")) if isinstance(x, int | float)]
    looks = _rounds_of(seq.get("looks"))
    return [
        RoundStep(a, b, round_s[i] if i < len(round_s) else None, looks.get(b))
        for i, (a, b) in enumerate(spans)
    ]


def _recorded_launch(e: JsonObject) -> RoundStart:
    """A launch as the sequential record's `launches` holds it."""
    launch, ready = e.get("launch"), e.get("ready_s")
    return RoundStart(
        int(num_of(e["round"])),
        str(e["server_config"]),
        launch if isinstance(launch, int) else None,
        float(ready) if isinstance(ready, int | float) else None,
        seconds_of(e.get("lock_waited_s")),
    )


def round_launches(exp_dir: Path, seq: JsonObject, points: Sequence[PointDoc]) -> list[RoundStart]:
    """Every server launch of the sweep, with the round of the look after it: the record's
    `launches`; in raw data from before it kept them, each step's launches from its points'
    `launch`, the start known for each configuration's latest launch alone (launch.json)."""
    recorded = seq.get("launches")
    if isinstance(recorded, list):
        return [_recorded_launch(e) for e in recorded if isinstance(e, dict)]
    last_of = {r: step.last for step in round_steps(seq) for r in range(step.first, step.last + 1)}
    seen: dict[tuple[str, int], int] = {}
    for p in points:
        k, launch = last_of.get(int(num_of(p.get("repeat") or 0))), p.get("launch")
        if k is not None and isinstance(launch, int):
            key = (str(p["server_config"]), int(launch))
            seen[key] = min(k, seen.get(key, k))
    paths, out = ExperimentPaths(exp_dir), []
    for (sc, n), k in sorted(seen.items(), key=lambda item: (item[1], item[0])):
        latest = LaunchRecord.read_if_present(paths.launch(sc))
        if latest is not None and latest.launch == n:
            out.append(RoundStart(k, sc, n, latest.ready_s, latest.lock_waited_s))
        else:  # an earlier launch: launch.json keeps the latest alone
            out.append(RoundStart(k, sc, n, None, 0.0))
    return out


def starts_wall(launches: list[RoundStart], *, together: bool) -> float:
    """The wall time of the launches' starts: their sum, one after another; side by side
    (`together`: a round's servers started at once), the longest start of each round's
    launches (a configuration's n-th launch of a step was started beside the others' n-th)."""
    if not together:
        return sum(launch.ready_s or 0.0 for launch in launches)
    longest: dict[tuple[int, int | None], float] = {}
    for launch in launches:
        key = (launch.round, launch.launch)
        longest[key] = max(longest.get(key, 0.0), launch.ready_s or 0.0)
    return sum(longest.values())


def _spent(
    launches: list[RoundStart], points: Sequence[PointDoc], detail: bool, together: bool
) -> tuple[str, float]:
    """`2 server starts 61.3 s (a #1 30.1 s, b #1 31.2 s) + 30 points 290.0 s` (the launches
    named with `detail`), and the seconds it accounts for; side by side (`together`), the
    starts' wall time, `2 server starts side by side 31.2 s (...)`."""
    starts = starts_wall(launches, together=together)
    measured = sum(seconds_of(p.get("duration")) for p in points)
    n, unknown = len(launches), sum(1 for launch in launches if launch.ready_s is None)
    text = f"{n} server start{'s' if n > 1 else ''}" if n else "no server start"
    if n > 1 and together:
        text += " side by side"
    if n and unknown < n:
        text += f" {starts:.1f} s" + (" + ?" if unknown else "")
    elif n:
        text += " ?"
    if detail and launches:
        text += " (" + ", ".join(launch.describe() for launch in launches) + ")"
    return f"{text} + {len(points)} points {measured:.1f} s", starts + measured


def _look(look: JsonObject | None, compared: JsonObject | None = None) -> str:
    """`look after round 4: 7 of 9 questions decided, 2 open`: the claims (and orderings) of
    the look, and the rows of analysis.compare it asked (`compared`, where recorded)."""
    if look is None:
        return "no look recorded"
    decided, still = int(num_of(look.get("decided") or 0)), int(num_of(look.get("open") or 0))
    if compared is not None:
        asked = int(num_of(compared.get("asked") or 0))
        unknown = int(num_of(compared.get("open") or 0))
        decided, still = decided + asked - unknown, still + unknown
    text = f"look after round {look.get('round')}: {decided} of {decided + still} questions decided"
    return text + (f", {still} open" if still else "")


def rounds_breakdown(exp_dir: Path, total: float, points: Sequence[PointDoc]) -> list[str]:
    """A sequential sweep's stage: its server starts, points and the rest, then per step of
    rounds its launches with their starts, its points with their measured time, the rest and
    the look after it, then the looks and the rest of the job."""
    seq = sequential_record(exp_dir)
    if seq is None:  # no record: nothing to split the stage by
        return [f"  {'sweep':<28} {total:7.1f} s"]
    steps = round_steps(seq)
    launches = round_launches(exp_dir, seq, points)
    together = bool(seq.get("side_by_side"))
    compared = _rounds_of(seq.get("compared"))
    spent, known = _spent(launches, points, detail=False, together=together)
    stopped = seq.get("stopped")
    lines = [
        f"  {'sweep':<28} {total:7.1f} s = {spent} + other {max(0.0, total - known):.1f} s; "
        f"{seq.get('rounds')} rounds, stopped: {STOPPED.get(str(stopped), stopped)}"
    ]
    for step in steps:
        mine = [p for p in points if step.first <= int(num_of(p.get("repeat") or 0)) <= step.last]
        spent, known = _spent(
            [x for x in launches if x.round == step.last], mine, detail=True, together=together
        )
        if step.seconds is None:
            look = _look(step.look, compared.get(step.last))
            lines.append(f"    {step.label:<26} {'?':>7} s = {spent}; {look}")
            continue
        other = max(0.0, step.seconds - known)
        lines.append(
            f"    {step.label:<26} {step.seconds:7.1f} s = {spent} + other {other:.1f} s; "
            + _look(step.look, compared.get(step.last))
        )
    if steps and all(step.seconds is not None for step in steps):
        rest = max(0.0, total - sum(step.seconds or 0.0 for step in steps))
        lines.append(f"    {'the looks and the rest':<26} {rest:7.1f} s")
    return lines
