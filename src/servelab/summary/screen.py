"""The one-screen summary printed at the end of a run: the means per point, the validity line,
and where the time went on this host (the stages, a sequential sweep's rounds from
servelab.summary.rounds, each server start's phases, and the wall time against the measured
windows)."""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import TypedDict

from servelab.analysis.engine_diff import resolved_lines
from servelab.analysis.validity import (
    PointFlags,
    check_point,
    point_name,
    summary_line,
    use_attempts,
)
from servelab.config import default_section
from servelab.design.level import Level, LevelValue
from servelab.documents import JsonObject
from servelab.experiment import ValiditySection
from servelab.hostfacts.canary import run_canaries
from servelab.launch.serverlog import start_line
from servelab.metrics import PERCENTILES, samples_needed
from servelab.render import num
from servelab.store.paths import ExperimentPaths
from servelab.store.rawdata import RawPoint, load_points
from servelab.store.records import (
    CaptureRecord,
    ClientRunRecord,
    LaunchRecord,
    Record,
    launch_files,
)
from servelab.summary.rounds import round_launches, rounds_breakdown, sequential_record, starts_wall
from servelab.summary.values import PointDoc, mean_of, num_of, seconds_of

# First-run setup, left out of the wall time: a first run creates the runtime (a venv from its
# lock, or an image pull), client.cross_check's venvs, and fetches the model, all cached for
# every later run.
SETUP_STAGES = ("runtime", "client_tools", "model")


def _waited(record: JsonObject) -> float:
    """A launch's wait for the measuring-server lock (launch.json, capture.json lock.waited_s)."""
    lock = record.get("lock")
    return seconds_of(lock.get("waited_s") if isinstance(lock, dict) else None)


class SummaryRow(TypedDict):
    """One configuration and level of the summary: its repeats' mean throughput (and range),
    mean TTFT and failed requests."""

    server_config: str
    concurrency: LevelValue
    repeats: int
    output_throughput: float | None
    output_throughput_min: float | None
    output_throughput_max: float | None
    mean_ttft_ms: float | None
    failed: int


def summary_rows(points: Sequence[PointDoc]) -> list[SummaryRow]:
    """Per configuration and level (`concurrency`: a concurrency or a request rate)."""
    groups: dict[tuple[str, LevelValue], list[PointDoc]] = defaultdict(list)
    for p in points:
        groups[(str(p["server_config"]), Level.from_record(p).value)].append(p)
    rows: list[SummaryRow] = []
    for (sc, conc), ps in sorted(groups.items()):
        tput = [
            num_of(p["output_throughput"]) for p in ps if p.get("output_throughput") is not None
        ]
        ttft = [num_of(p["mean_ttft_ms"]) for p in ps if p.get("mean_ttft_ms") is not None]
        rows.append(
            {
                "server_config": sc,
                "concurrency": conc,
                "repeats": len(ps),
                "output_throughput": mean_of(tput),
                "output_throughput_min": min(tput) if tput else None,
                "output_throughput_max": max(tput) if tput else None,
                "mean_ttft_ms": mean_of(ttft),
                "failed": sum(int(num_of(p.get("failed", 0))) for p in ps),
            }
        )
    return rows


def tail_lines(points: Sequence[PointDoc]) -> list[str]:
    """How many requests the points hold against what each percentile's 95% interval needs
    (servelab.metrics.samples_needed), and at how many points each can be reported."""
    counts = [int(num_of(p.get("completed") or 0)) for p in points]
    if not counts:
        return []
    parts = []
    for pct in PERCENTILES:
        need = samples_needed(pct)
        parts.append(f"p{pct} needs {need} ({sum(n >= need for n in counts)} of {len(counts)})")
    return [
        f"tails: {min(counts)} to {max(counts)} completed requests per point; a percentile "
        "is reported with its 95% interval where a point holds enough, else as insufficient: "
        + ", ".join(parts)
    ]


def stage_times(exp_dir: Path) -> list[tuple[str, float]]:
    out = []
    for tsv in sorted((exp_dir / "benchmarks").glob("*.tsv")):
        with open(tsv, encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh, delimiter="\t"))
        if rows and "s" in rows[0]:
            out.append((tsv.stem, float(rows[-1]["s"])))
    return out


def point_validity(points: list[RawPoint], t: ValiditySection) -> list[PointFlags]:
    """The validity flags of every point (docs/analysis.md#validity); a point without
    requests.jsonl.gz is checked on its telemetry alone."""
    out: list[PointFlags] = []
    for p, _ in use_attempts(points, t):  # a re-measured point: the attempt the analysis uses
        recs = p.records() if p.requests_path.exists() else []
        flags = check_point(recs, p.meta, t, p.server_args, p.warmup)
        out.append((p.server_config, int(p.meta["repeat"]), p.level.value, flags))
    return out


def remeasured_lines(points: list[RawPoint], t: ValiditySection) -> list[str]:
    """The points measured again because a host check failed, each with the attempt used and
    why (validity.json `record`); none when no point was."""
    out = []
    for p, (_, choice) in zip(points, use_attempts(points, t), strict=True):
        if choice is not None:
            name = point_name(p.server_config, int(p.meta["repeat"]), p.level.value, p.level.axis)
            out.append(f"  {name}: {choice.reason}")
    if not out:
        return []
    return [f"measured again after a host check failed: {len(out)} point(s)", *out]


def render_summary(exp_dir: Path, validity: ValiditySection | None = None) -> str:
    """validity: the thresholds of the config's analysis.validity (the schema's defaults when
    None)."""
    t = validity or default_section(ValiditySection, "analysis", "validity")
    raw = load_points(exp_dir)
    points = [p.meta for p, _ in use_attempts(raw, t)]  # a re-measured point: the attempt used
    rows = summary_rows(points)
    lines = [f"servelab summary: {exp_dir}", ""]
    rates = any(Level.from_record(p).is_rate for p in points)
    header = (
        f"{'server config':<20} {'rate' if rates else 'conc':>5} {'n':>3} "
        f"{'output tok/s':>13} {'(min-max)':>17} "
        f"{'mean TTFT ms':>13} {'failed':>6}"
    )
    lines += [header, "-" * len(header)]
    last = None
    for r in rows:
        if last is not None and r["server_config"] != last:
            lines.append("")
        last = r["server_config"]
        rng = f"{num(r['output_throughput_min'], '.0f')}-{num(r['output_throughput_max'], '.0f')}"
        lines.append(
            f"{r['server_config']:<20} {r['concurrency']:>5g} {r['repeats']:>3} "
            f"{num(r['output_throughput'], '13.1f')} {rng:>17} "
            f"{num(r['mean_ttft_ms'], '13.1f')} {r['failed']:>6}"
        )
    by_sc: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        if r["output_throughput"] is not None:
            by_sc[r["server_config"]].append(r["output_throughput"])
    lines.append("")
    for sc, tputs in sorted(by_sc.items()):
        lines.append(
            f"{sc}: best/worst mean throughput across {'rates' if rates else 'concurrency'} = "
            f"{max(tputs) / min(tputs):.2f}x"
        )
    lines += ["", summary_line(point_validity(raw, t)), *remeasured_lines(raw, t)]
    lines += tail_lines(points)
    lines += canary_lines(exp_dir)
    lines += resolved_lines(exp_dir)
    lines += same_host_lines(exp_dir)
    times = stage_times(exp_dir)
    if times:
        lines.append("")
        lines.append("stage times: " + ", ".join(f"{name} {s:.1f} s" for name, s in times))
        lines += time_breakdown(exp_dir, dict(times), points)
        lines += start_lines(exp_dir)
        wall = wall_line(exp_dir, dict(times), points)
        if wall:
            lines += ["", wall]
    return "\n".join(lines) + "\n"


def same_host_lines(exp_dir: Path) -> list[str]:
    """The pairs of analysis.compare in three words (a rerun's answer), one line per level and
    metric: `reference-x -> current-x c=8 output_throughput: DIFFERENT (slower) 0.552 [0.50,
    0.61]`; none where the run compared none (analysis/same_host.json absent)."""
    from servelab.analysis.samehost import interval_text, word_text
    from servelab.store.jsonio import read_json
    from servelab.store.paths import SAME_HOST_TABLE

    table = exp_dir / "analysis" / SAME_HOST_TABLE
    if not table.is_file():
        return []
    doc = read_json(table)
    lines = [
        "",
        f"compared on this host (today's client measuring both sides; SAME within "
        f"{doc['margin_pct']:g}%, speed B / A [interval]):",
    ]
    for pair in doc["pairs"]:
        for r in pair["rows"]:
            interval = interval_text(r["speed"], r["low"], r["high"])
            word = word_text(r["word"], r["direction"], r["rounds_needed"])
            level = f"{doc['axis'][0]}={r['level']:g}"
            lines.append(f"  {pair['b']} vs {pair['a']} {level} {r['metric']}: {interval} {word}")
    return lines


def canary_lines(exp_dir: Path) -> list[str]:
    """The host-speed canary of each configuration's sweep, before its first launch and after
    its last: `mns4: compute 85.2 -> 86.0 ms, copy 5.01 -> 4.98 GB/s: steady (...)`; none for
    runs written before it was recorded."""
    lines = []
    for sc, c in run_canaries(ExperimentPaths(exp_dir)).items():
        b, a = c.before, c.after
        lines.append(
            f"  {sc}: compute {b.compute.median * 1e3:.1f} -> "
            f"{a.compute.median * 1e3:.1f} ms, copy {b.bandwidth.median:.2f} -> "
            f"{a.bandwidth.median:.2f} GB/s: {c.drift.line()}"
        )
        if c.gpu is not None:  # a GPU runtime's: the GPU's own canary, or why it was not timed
            lines.append(f"  {sc}: {c.gpu.line()}")
    if not lines:
        return []
    return [
        "",
        "host speed (the canary before each sweep's first launch and after its last):",
    ] + lines


def _launch(path: Path, record: type[Record]) -> JsonObject:
    """A launch.json or capture.json, read by its record type ({} when there is none)."""
    found = record.read_if_present(path)
    return found.doc if found is not None else {}


def _ready_s(path: Path, record: type[Record]) -> float | None:
    value = _launch(path, record).get("ready_s")
    return float(value) if isinstance(value, int | float) else None


def _launches(exp_dir: Path) -> list[tuple[str, JsonObject]]:
    """(stage, record) of the latest server launch of every sweep and profiling pass."""
    out = []
    for kind, path, record_type in launch_files(ExperimentPaths(exp_dir)):
        record = _launch(path, record_type)
        if record.get("ready_s") is not None:
            out.append((f"{kind}-{path.parent.name}", record))
    return out


def on_sweep_captures(exp_dir: Path) -> dict[str, float]:
    """Seconds of each profiling pass that ran on its sweep's own launch (capture.json
    `launch: sweep`, profile.launch), keyed `sweep-<sc>`: the stage whose time holds it."""
    out = {}
    for path in ExperimentPaths(exp_dir).capture_files():
        record = _launch(path, CaptureRecord)
        wall = record.get("job_wall_s")
        if record.get("launch") == "sweep" and isinstance(wall, int | float):
            out[f"sweep-{path.parent.name}"] = float(wall)
    return out


def _secs(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.1f}"


def start_lines(exp_dir: Path) -> list[str]:
    """Each server start's phases (launch.json / capture.json `start`, docs/raw-data.md), one
    line per launch: `start 44.1 s: import 7.0, config 7.2, ..., compile 22.0 (cache miss)`."""
    lines = []
    for stage, record in _launches(exp_dir):
        start = record.get("start")
        if not isinstance(start, dict) or not start.get("phases"):
            continue
        waited = _waited(record)
        lock = (
            f" (after {waited:.0f} s waiting for the measuring-server lock)" if waited >= 1 else ""
        )
        lines.append(f"  {stage:<28} {start_line(start)}{lock}")
    return ["server starts (latest launch of each), seconds per phase:", *lines] if lines else []


def wall_line(exp_dir: Path, times: dict[str, float], points: Sequence[PointDoc]) -> str | None:
    """The experiment's wall time against the sum of its measured windows: `wall 412 s for
    256 s of measured windows: 1.61x (server starts 120 s, profiling pass 60 s, rest 36 s)`.
    The wall time is the sum of the Snakemake stages' times (benchmarks/*.tsv), first-run setup
    (SETUP_STAGES), the summary itself and the bundle (which packs the summary, after it) left
    out; the server starts are the sweeps' (each
    configuration's latest launch, launch.json ready_s; a sequential sweep's every launch of
    every round, `sweep_starts`), the profiling pass every profile stage
    whole, its own server start included, and the part of a sweep stage spent on a profiling
    pass run on the sweep's launch (capture.json job_wall_s, profile.launch); the rest is
    prompts, warm-ups, shutdowns and the analysis. Time spent waiting for the host's
    measuring-server lock (launch.json and capture.json lock.waited_s) is another invocation's,
    not this experiment's: when there was some, it is named apart and the ratio is also given
    without it."""
    stages = {k: v for k, v in times.items() if k not in (*SETUP_STAGES, "summary")}
    if not stages:
        return None
    wall = sum(stages.values())
    windows = sum(seconds_of(p.get("duration")) for p in points)
    starts, waited, waits = sweep_starts(exp_dir, points, sequential="sweep" in stages)
    profiling = sum(v - waited.get(k, 0.0) for k, v in stages.items() if k.startswith("profile-"))
    profiling += sum(v for k, v in on_sweep_captures(exp_dir).items() if k in stages)
    tools = sum(_tool_runs(d)[1] for d in sorted((exp_dir / "raw").glob("*/clients")))
    rest = max(0.0, wall - windows - starts - waits - profiling - tools)

    def ratio(total: float) -> str:
        return f"{total / windows:.2f}x" if windows > 0 else "no measured window"

    lock = ""
    if waits >= 0.05:
        lock = (
            f"; {ratio(wall - waits)} without the {_secs(waits)} s spent waiting for the "
            "measuring-server lock"
        )
    line = (
        f"wall {_secs(wall)} s for {_secs(windows)} s of measured windows: {ratio(wall)}{lock} "
        f"(server starts {_secs(starts)} s, profiling pass {_secs(profiling)} s, "
        + (f"other tools' runs {_secs(tools)} s, " if tools else "")
        + f"rest {_secs(rest)} s)"
    )
    setup = [(k, times[k]) for k in SETUP_STAGES if k in times]
    if setup:
        line += (
            "; left out: "
            + ", ".join(f"{k} {_secs(v)} s" for k, v in setup)
            + " (first-run setup: creating the runtime, fetching the model)"
        )
    return line


def sweep_starts(
    exp_dir: Path, points: Sequence[PointDoc], *, sequential: bool
) -> tuple[float, dict[str, float], float]:
    """The sweeps' server starts (s), each launch's wait for the measuring-server lock keyed
    by its stage (`sweep-<sc>`, `profile-<sc>`), and every wait summed. A fixed design: each
    configuration's latest launch (launch.json). A sequential sweep (`sequential`: its one
    `sweep` stage ran): every launch of every round (`round_launches`), as the fixed design's
    launches are counted; its waits are summed with the profiling passes'."""
    launches = _launches(exp_dir)
    seq = sequential_record(exp_dir) if sequential else None
    if seq is None:
        starts = sum(
            float(num_of(r["ready_s"])) for stage, r in launches if stage.startswith("sweep-")
        )
        waited = {stage: _waited(r) for stage, r in launches}
        return starts, waited, sum(waited.values())
    rounds = round_launches(exp_dir, seq, points)
    starts = starts_wall(rounds, together=bool(seq.get("side_by_side")))
    waited = {stage: _waited(r) for stage, r in launches if not stage.startswith("sweep-")}
    return starts, waited, sum(waited.values()) + sum(launch.waited_s for launch in rounds)


def time_breakdown(exp_dir: Path, times: dict[str, float], points: Sequence[PointDoc]) -> list[str]:
    """Where the time of the measuring stages went on this host: server starts, measured
    points and the rest (prompts, warm-up, shutdown) per sweep, a sequential sweep's round by
    round (`rounds_breakdown`); server start per profiling pass. Times move between hosts (a
    slow host starts vLLM in minutes), so say them here."""
    lines = ["where the time went on this host:"]
    for name in ("runtime", "client_tools", "model"):
        if name in times:
            lines.append(f"  {name:<28} {times[name]:7.1f} s")
    durations: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for p in points:
        durations[str(p["server_config"])] += seconds_of(p.get("duration"))
        counts[str(p["server_config"])] += 1
    on_sweep = on_sweep_captures(exp_dir)
    for stage, total in sorted(times.items()):
        kind, _, sc = stage.partition("-")
        if stage == "sweep":  # a sequential plan: one sweep job for every configuration
            lines += rounds_breakdown(exp_dir, total, points)
            continue
        if kind not in ("sweep", "profile") or not (exp_dir / "raw" / sc).is_dir():
            continue  # profile-report-<sc> and the like: listed under stage times only
        paths = ExperimentPaths(exp_dir)
        ready = (
            _ready_s(paths.launch(sc), LaunchRecord)
            if kind == "sweep"
            else _ready_s(paths.capture(sc), CaptureRecord)
        )
        parts = [f"server start {ready:.1f} s" if ready is not None else "server start ?"]
        tools = _tool_runs(paths.clients(sc)) if kind == "sweep" else (0, 0.0)
        if kind == "sweep":
            parts.append(f"{counts[sc]} points {durations[sc]:.1f} s")
        if tools[0]:  # client.cross_check: the other tools' runs, start-up included
            parts.append(f"{tools[0]} runs of other tools {tools[1]:.1f} s")
        if stage in on_sweep:
            parts.append(f"profiling pass on this launch {on_sweep[stage]:.1f} s")
        known = (
            (ready or 0.0)
            + (durations[sc] if kind == "sweep" else 0.0)
            + on_sweep.get(stage, 0.0)
            + tools[1]
        )
        parts.append(f"other {max(0.0, total - known):.1f} s")
        lines.append(f"  {stage:<28} {total:7.1f} s = " + " + ".join(parts))
    return lines if len(lines) > 1 else []


def _tool_runs(clients: Path) -> tuple[int, float]:
    """client.cross_check's runs of a configuration (raw/<sc>/clients/, failed ones too): how
    many, and their wall time (client.json `wall_s`, the tool's start-up included)."""
    walls = [
        seconds_of(ClientRunRecord.read(f).get("wall_s"))
        for f in sorted(clients.glob(f"*/rep_*/*/{ClientRunRecord.FILE}"))
    ]
    return len(walls), sum(walls)
