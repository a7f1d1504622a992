"""Load measured points from either raw layout into one shape.

- servelab's own layout (docs/raw-data.md): metrics are recomputed from requests.jsonl.gz, so
  every table is a pure function of the raw requests;
- `vllm bench serve --save-result --save-detailed` trees: ROOT/rep_<NN>/concurrency_<CCC>/
  benchmark.json (runs at a concurrency, --max-concurrency C) or ROOT/rep_<NN>/rate_<R>/
  benchmark.json (runs at a request rate, --request-rate R), one server configuration per root,
  optionally with ROOT/server.log.
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from servelab.analysis.outputs import PointKey, PointOutputs, point_outputs
from servelab.analysis.peers import client_output_tokens, point_file, read_point
from servelab.analysis.search import SearchResult, read_search
from servelab.analysis.validity import (
    FAILED,
    NOT_CHECKED,
    NOTED,
    PASSED,
    Choice,
    Flag,
    check_point,
    checks_for,
    evaluate,
    facts_from_bench,
    failed,
    point_name,
    removing,
    use_attempts,
)
from servelab.analysis.validity.facts import BenchJson
from servelab.analysis.validity.flags import number_text
from servelab.analysis.validity.openloop import achieved_rate
from servelab.client import RequestRecord
from servelab.config import default_section
from servelab.design.level import RATE, Level, LevelValue
from servelab.design.stopping import StoppingRule
from servelab.documents.declared import (
    CpuFacts,
    IsaRecord,
    NodeFacts,
    RecordJson,
    RuleJson,
    StartRecord,
)
from servelab.errors import ServelabError
from servelab.experiment import ValiditySection
from servelab.hostfacts.canary import RunCanary, run_canaries
from servelab.launch.serverlog import parse_capacity
from servelab.metrics import (
    PERCENTILES,
    PointMetrics,
    assemble,
    point_metrics,
    request_latencies,
    supported,
)
from servelab.store.paths import SERVER_LOG, ExperimentPaths
from servelab.store.rawdata import DamagedRawData, RawPoint, Skipped, load_points
from servelab.store.records import (
    CapacityRecord,
    LaunchRecord,
    RunRecord,
    RuntimeRecord,
    launch_files,
)
from servelab.telemetry.columns import Cell, telemetry_columns

VLLM_REP = re.compile(r"^rep_(\d+)$")
VLLM_CONC = re.compile(r"^concurrency_(\d+)$")
VLLM_RATE = re.compile(r"^rate_(inf|\d+(?:\.\d+)?)$")
VLLM_TREE = "rep_<NN>/concurrency_<CCC>/benchmark.json or rep_<NN>/rate_<R>/benchmark.json"
NOT_BY_BENCH = "not recorded by vllm bench"


class PointExtra(TypedDict, total=False):
    """What a point carries beside its metrics: point.json's `launch` (which server launch
    measured it), `telemetry` and `trace` blocks; of a point measured more than once, the
    attempt the statistics use (validity.json `record`); a vllm-bench rate point's `arrival`."""

    launch: int
    telemetry: Mapping[str, object]
    trace: Mapping[str, object]
    record: RecordJson
    arrival: Arrival
    # another tool's own count of the output tokens of the point's completed requests (its
    # re-tokenization of the text; servelab.analysis.peers), beside the server's the metrics use
    client_output_tokens: int
    # a vllm-bench point's requests' span, first send to last end (s), where its file records
    # send times: what its `duration` is set against ("Clients compared")
    request_span_s: float
    # another tool's mean wait in its client before a send (ms; BenchJson client_waits)
    client_wait_ms: float
    # a vllm-bench point read from its file's aggregates (no per-request records)
    aggregates_only: bool


@dataclass
class Point:
    server_config: str
    repeat: int
    level: Level  # its concurrency, or an open-loop point's request rate (sweep.rate)
    # servelab.metrics' point metrics, client_cpu_s, and the telemetry columns
    metrics: Mapping[str, Cell]
    position: int | None = None
    ttfts_ms: list[float] = field(default_factory=list)
    # per successful request: (ttft, tpot or None, e2el), ms; for goodput under SLOs
    per_request: list[tuple[float, float | None, float]] = field(default_factory=list)
    extra: PointExtra = field(default_factory=lambda: PointExtra())
    # validity checks (analysis/validity/): a failed one leaves the metrics it affects out of
    # every statistic; `metrics` keeps the raw values
    checks: tuple[Flag, ...] = ()

    @property
    def valid(self) -> bool:
        return not failed(self.checks)

    def left_out(self, metric: str) -> list[Flag]:
        """The failed checks that leave `metric` of this point out of the statistics."""
        return removing(self.checks, metric)

    @property
    def label(self) -> str:
        return point_name(self.server_config, self.repeat, self.level.value, self.level.axis)


class SequentialSweep(TypedDict):
    """What the analysis reads of run.json's `sequential` (a sequential sweep's record,
    servelab.measure.sequential's SequentialRecord): the stopping rule, why measuring
    stopped, and the orderings judged beside the claims."""

    rule: RuleJson
    stopped: str
    orderings: NotRequired[list[str]]


class Capacity(TypedDict, total=False):
    """What the analysis reads of a configuration's capacity.json (servelab's layout, schema
    checked: LaunchCapacity or EndpointCapacity) or of a vllm-bench tree's server.log
    (`parse_capacity`); a fact an older servelab did not record is absent."""

    launched: bool  # False: a server servelab did not launch (runtime.kind endpoint)
    non_default_args: dict[str, object] | None
    max_num_seqs: object  # --max-num-seqs, as given
    max_concurrency: float | None
    max_concurrency_tokens_per_request: int | None
    kv_cache_tokens: int | None
    cudagraph_capture_sizes: list[int] | None
    cudagraph_capture_sizes_source: str | None
    cudagraph_mode: str | None


@dataclass(frozen=True)
class TurnPoint:
    """One measured chat point's requests, as the per-turn tables (servelab.analysis.turns)
    read them. `left_out`: a failed validity check leaves its TTFT out of the statistics; it
    is then only counted."""

    server_config: str
    level: LevelValue
    repeat: int
    records: Sequence[RequestRecord]
    left_out: bool = False


@dataclass
class Dataset:
    """Everything the analysis reads of one run, read once (`load_dataset`): its points, and
    the per-configuration records beside them. No other part of the analysis opens the run's
    raw files (tests/test_analysis_reads.py)."""

    layout: str  # "servelab" | "vllm-bench"
    root: Path
    points: list[Point]
    capacity: dict[str, Capacity]  # server_config -> capacity facts (may be empty)
    # the thresholds the points were checked with
    validity: ValiditySection
    # the measuring host per server config (launch.json cpu_facts) and what the runtime
    # computes with (runtime/runtime.json isa); empty where the raw data has none
    hosts: dict[str, CpuFacts] = field(default_factory=dict)
    runtime_isa: IsaRecord | None = None
    # points and per-configuration files left out by skip_damaged, each with why (empty
    # unless something was skipped)
    skipped: list[Skipped] = field(default_factory=list)
    # the node each server config was measured on (launch.json node: hostname, slurm_job_id,
    # host); no entry where the raw data has none (written before it was recorded)
    nodes: dict[str, NodeFacts] = field(default_factory=dict)
    # a sequential sweep's record (run.json `sequential`: the stopping rule, the rounds, why it
    # stopped); None for a fixed number of repeats
    sequential: SequentialSweep | None = None
    # the host-speed canary of each server config's sweep job (run.json `canary`); no entry
    # where the raw data has none (written before it was recorded)
    canaries: dict[str, RunCanary] = field(default_factory=dict)
    # each configuration's launch.json (its latest launch); none in a vllm-bench tree
    launches: dict[str, Mapping[str, object]] = field(default_factory=dict)
    # where each sweep's and profiling pass's latest server start went (`server_starts`)
    starts: dict[str, StartRecord] = field(default_factory=dict)
    # each configuration's SLO capacity search (raw/<sc>/search/search.json), where one ran
    searches: dict[str, SearchResult] = field(default_factory=dict)
    # the chat points (point.json `chat`), with their requests, for the per-turn tables
    turn_points: list[TurnPoint] = field(default_factory=list)
    # each point's completed requests that carry their output's token ids
    # (workload.record_output_ids), by configuration and (repeat, level); none for a point
    # that recorded none (servelab.analysis.outputs)
    outputs: dict[str, dict[PointKey, PointOutputs]] = field(default_factory=dict)

    def configs(self) -> list[str]:
        return sorted({p.server_config for p in self.points})


def detect_layout(root: Path) -> str:
    if (root / "raw").is_dir() and ExperimentPaths(root).point_files():
        return "servelab"
    if any(VLLM_REP.match(d.name) and d.is_dir() for d in root.glob("rep_*")):
        return "vllm-bench"
    raise ServelabError(
        f"{root}: neither servelab raw data (raw/<config>/rep<RR>/c<CCCC>/point.json) nor a "
        f"vllm-bench tree ({VLLM_TREE}); pass the experiment folder"
    )


def load_dataset(
    root: Path,
    name: str | None = None,
    validity: ValiditySection | None = None,
    skip_damaged: bool = False,
) -> Dataset:
    """Every complete point with its metrics and its validity flags under `validity`
    (the schema's defaults when None). Damaged raw data raises DamagedRawData; with
    `skip_damaged`, a damaged point of servelab's layout is left out and listed in
    `Dataset.skipped`, and so is a damaged capacity.json (the analysis then goes without that
    configuration's capacity facts, as for raw data that has none)."""
    t = validity or default_section(ValiditySection, "analysis", "validity")
    layout = detect_layout(root)
    if layout == "servelab":
        return _load_servelab(root, t, skip_damaged)
    return _load_vllm_bench(root, name or root.name, t)


def _per_request(
    records: list[RequestRecord],
) -> tuple[list[float], list[tuple[float, float | None, float]]]:
    ttfts: list[float] = []
    per: list[tuple[float, float | None, float]] = []
    for r in records:
        if r.ok and r.chunk_offsets_us:
            lat = request_latencies(r)
            ttfts.append(lat["ttft"])
            per.append((lat["ttft"], lat["tpot"], lat["e2el"]))
    return ttfts, per


def _point(
    raw: RawPoint, recs: list[RequestRecord], t: ValiditySection, choice: Choice | None
) -> Point:
    """One point of servelab's layout from its attempt the statistics use (`raw`, its
    requests): metrics recomputed from the requests, then its client CPU time and telemetry
    columns; the validity flags; `choice`, for a point measured more than once."""
    meta = raw.meta
    ttfts, per = _per_request(recs)
    metrics: dict[str, Cell] = dict(point_metrics(recs, meta.get("slices")))
    metrics["client_cpu_s"] = meta.get("client_cpu_s")
    if "telemetry" in meta:
        metrics.update(telemetry_columns(meta["telemetry"]))
    # point.json's launch, telemetry and trace, where it has them; the attempt used
    extra = PointExtra()
    if "launch" in meta:
        extra["launch"] = meta["launch"]
    if "telemetry" in meta:
        extra["telemetry"] = meta["telemetry"]
    if "trace" in meta:
        extra["trace"] = meta["trace"]
    if choice is not None:
        extra["record"] = choice.to_json()
    return Point(
        server_config=meta["server_config"],
        repeat=int(meta["repeat"]),
        level=raw.level,
        metrics=metrics,
        position=meta.get("position"),
        ttfts_ms=ttfts,
        per_request=per,
        extra=extra,
        checks=check_point(recs, meta, t, raw.server_args, raw.warmup),
    )


def _load_servelab(root: Path, t: ValiditySection, skip_damaged: bool = False) -> Dataset:
    points = []
    turns: list[TurnPoint] = []
    outputs: dict[str, dict[PointKey, PointOutputs]] = {}
    skipped: list[Skipped] = []
    # a re-measured point: the attempt the host checks leave (validity.json `record`); a
    # repeat measured again whole, one attempt throughout
    for raw, choice in use_attempts(load_points(root, skipped if skip_damaged else None), t):
        try:
            recs = raw.records()
        except DamagedRawData as exc:
            if not skip_damaged:
                raise
            skipped.append(Skipped(raw.folder, exc))
            continue
        point = _point(raw, recs, t, choice)
        points.append(point)
        ids = point_outputs(recs)
        if ids:
            outputs.setdefault(point.server_config, {})[(point.repeat, raw.level.value)] = ids
        if "chat" in raw.meta:
            left_out = bool(point.left_out("mean_ttft_ms"))
            turns.append(
                TurnPoint(point.server_config, raw.level.value, point.repeat, recs, left_out)
            )
    if skipped and not points:
        raise ServelabError(
            f"{root}: all {len(skipped)} points are damaged, nothing left to analyse; "
            f"the first: {min(skipped, key=lambda s: s.path).reason}"
        )
    capacity: dict[str, Capacity] = {}
    paths = ExperimentPaths(root)
    for cap in paths.capacity_files():
        try:
            doc: object = CapacityRecord.read(cap).doc  # as its schema has checked it
            capacity[cap.parent.name] = cast(Capacity, doc)
        except DamagedRawData as exc:
            if not skip_damaged:
                raise
            # per configuration, not per point: its points stay; what needs the facts (the
            # --max-num-seqs and CUDA graph capture sizes the diagnoses weigh) reads "unknown"
            skipped.append(Skipped(cap, exc, f"the capacity facts of {cap.parent.name}"))
    hosts: dict[str, CpuFacts] = {}
    nodes: dict[str, NodeFacts] = {}
    launches: dict[str, Mapping[str, object]] = {}
    for lj in paths.launch_files():
        try:
            launch = LaunchRecord.read(lj)
        except DamagedRawData as exc:
            if not skip_damaged:
                raise
            # every point of its configuration was left out for this same damage (load_points)
            if not any(s.reason == str(exc) for s in skipped):
                skipped.append(Skipped(lj, exc, f"the host facts of {lj.parent.name}"))
            continue
        launches[lj.parent.name] = dict(launch.doc)
        # launch.json's, as its schema has checked them (whatever type its reader gives)
        facts: object = launch.cpu_facts
        node: object = launch.node
        if facts is not None:
            hosts[lj.parent.name] = cast(CpuFacts, facts)
        if node is not None:
            nodes[lj.parent.name] = cast(NodeFacts, node)
    runtime = RuntimeRecord.read_if_present(paths.runtime_record)
    isa: object = runtime.isa if runtime is not None else None
    skipped.sort(key=lambda s: s.path)
    return Dataset(
        "servelab",
        root,
        points,
        capacity,
        t,
        hosts,
        cast(IsaRecord, isa) if isinstance(isa, dict) else None,
        skipped,
        nodes,
        _sequential(root, skipped if skip_damaged else None),
        # a damaged run.json is the sequential record's to report (_sequential)
        run_canaries(paths, skip_damaged=True),
        launches,
        server_starts(root),
        {p.parent.parent.name: read_search(p) for p in paths.search_files()},
        turns,
        outputs,
    )


def server_starts(root: Path) -> dict[str, StartRecord]:
    """The `start` record (serverlog.start_phases) of the latest launch of every sweep
    (server/<sc>/launch.json) and profiling pass (profile/<sc>/capture.json) under `root`, keyed
    `sweep <sc>` / `profile <sc>`; a file that has none (raw data written before it was
    recorded) or cannot be read is left out, so the report of such data has no Server starts
    section and stays as it was."""
    out: dict[str, StartRecord] = {}
    for kind, path, record in launch_files(ExperimentPaths(root)):
        try:
            start = record.read(path).get("start")
        except ServelabError:
            continue  # damaged: the raw-data checks name it
        if isinstance(start, dict) and isinstance(start.get("phases"), list):
            out[f"{kind} {path.parent.name}"] = cast(StartRecord, start)
    return out


def _sequential(root: Path, skipped: list[Skipped] | None) -> SequentialSweep | None:
    """The sequential record of the sweep (every run.json of a sequential sweep carries the
    same one); None for a fixed number of repeats or where no run.json was written. A damaged
    run.json raises, or with `skipped` is listed there and passed over."""
    for rj in ExperimentPaths(root).run_files():
        try:
            # run.json's, as its schema has checked it (whatever type its reader gives)
            seq: object = RunRecord.read(rj).sequential
        except DamagedRawData as exc:
            if skipped is None:
                raise
            skipped.append(Skipped(rj, exc, f"the sweep record of {rj.parent.name}"))
            continue
        if isinstance(seq, dict):
            try:  # a rule this servelab does not implement: its verdicts would differ
                StoppingRule.from_json(seq["rule"])
            except ServelabError as exc:
                raise ServelabError(f"{rj}: sequential.rule.method: {exc}") from None
            return cast(SequentialSweep, seq)
    return None


def _s_to_ms(xs: list[float]) -> list[float]:
    return [float(x) * 1000.0 for x in xs]


def vllm_bench_metrics(
    bench: BenchJson, source: str
) -> tuple[PointMetrics, list[float], list[tuple[float, float | None, float]]]:
    """Metrics of one benchmark.json, from its per-request lists, with servelab's definitions;
    one saved without them (no --save-detailed) from its aggregates (`aggregates_only`)."""
    if aggregates_only(bench):
        return aggregate_metrics(bench, source), [], []
    for key in ("ttfts", "itls", "output_lens", "duration"):
        if key not in bench:
            raise ServelabError(
                f"{source}: key {key!r} missing; save with --save-result --save-detailed"
            )
    n = len(bench["ttfts"])
    errors = bench.get("errors") or [""] * n
    input_lens = bench.get("input_lens") or [0] * n
    itls = bench["itls"]
    latencies = bench.get("latencies")
    ttft, tpot, e2el, itl_all = [], [], [], []
    per: list[tuple[float, float | None, float]] = []
    total_in = total_out = 0
    completed = 0
    for i in range(n):
        if errors[i] or bench["output_lens"][i] in (0, None):
            continue
        t = float(bench["ttfts"][i]) * 1000.0
        gaps = _s_to_ms(itls[i] or [])
        e = float(latencies[i]) * 1000.0 if latencies else t + sum(gaps)
        out = int(bench["output_lens"][i])
        tp = (e - t) / (out - 1) if out > 1 else None
        completed += 1
        total_in += int(input_lens[i] or 0)
        total_out += out
        ttft.append(t)
        e2el.append(e)
        itl_all.extend(gaps)
        if tp is not None:
            tpot.append(tp)
        per.append((t, tp, e))
    m = assemble(
        num_prompts=n,
        completed=completed,
        duration=float(bench["duration"]),
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        latencies_ms={"ttft": ttft, "tpot": tpot, "itl": itl_all, "e2el": e2el},
    )
    m["client_cpu_s"] = None
    return m, ttft, per


# what a benchmark.json without per-request lists must hold to be read from its aggregates
AGGREGATE_KEYS = ("duration", "completed", "total_output_tokens", "mean_ttft_ms")
AGGREGATES_ONLY = (
    "aggregates only: the file holds no per-request records (vllm bench without "
    "--save-detailed), so no check on requests can run"
)


def aggregates_only(bench: BenchJson) -> bool:
    """A vllm bench result saved without its per-request lists (no --save-detailed)."""
    return "ttfts" not in bench and all(k in bench for k in AGGREGATE_KEYS)


def aggregate_metrics(bench: BenchJson, source: str) -> PointMetrics:
    """A point's metrics from vllm bench's aggregates: its counts, duration and each latency's
    mean, median and std as it computed them; a percentile only where its count of requests
    can support one (metrics.samples_needed), without an interval (no sample to bound it)."""
    raw: Mapping[str, object] = cast(Mapping[str, object], bench)
    completed = int(cast(int, raw["completed"]))
    failed = raw.get("failed")
    m = assemble(
        num_prompts=completed + (int(failed) if isinstance(failed, int) else 0),
        completed=completed,
        duration=float(cast(float, raw["duration"])),
        total_input_tokens=int(cast(int, raw.get("total_input_tokens") or 0)),
        total_output_tokens=int(cast(int, raw["total_output_tokens"])),
        latencies_ms={},
    )
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", *(f"p{p}" for p in PERCENTILES)):
            value = raw.get(f"{stat}_{name}_ms")
            if not isinstance(value, int | float):
                continue
            if stat.startswith("p") and not supported(completed, float(stat[1:])):
                continue
            m[f"{stat}_{name}_ms"] = float(value)
        if raw.get(f"mean_{name}_ms") is not None:
            m[f"n_{name}"] = completed
    m["client_cpu_s"] = None
    return m


@dataclass(frozen=True)
class BenchFile:
    """One benchmark.json of a vllm-bench tree: its repeat (rep_<NN>) and what its folder names,
    a concurrency (concurrency_<CCC>) or a request rate (rate_<R>, R as given to --request-rate)."""

    path: Path
    repeat: int
    axis: str  # "concurrency" | "rate"
    folder_level: str  # the level as the folder spells it
    tool: str = "vllm"  # the tool that wrote it (servelab.analysis.peers.POINT_FILES)

    def read(self) -> BenchJson:
        """The point's results as vllm bench's per-request lists (another tool's, adapted)."""
        return read_point(self.path, self.tool)

    def concurrency(self, bench: BenchJson) -> int:
        """A concurrency point's level: benchmark.json's max_concurrency, else the folder's."""
        return int(bench.get("max_concurrency") or self.folder_level)

    def rate(self, bench: BenchJson) -> float:
        """A rate point's level: benchmark.json's request_rate, else the folder's; a finite
        rate above 0, or a one-line error (vLLM's default rate, inf, sends every request at
        once: that is no rate point)."""
        if bench.get("ramp_up_strategy") is not None:
            raise ServelabError(
                f"{self.path}: a ramp-up run (ramp_up_strategy {bench['ramp_up_strategy']!r}) "
                "has no single request rate; measure each rate with --request-rate R"
            )
        given = bench.get("request_rate")
        given = self.folder_level if given is None else given
        try:
            rate = float(given)
        except (TypeError, ValueError):
            raise ServelabError(f"{self.path}: request_rate {given!r} is not a number") from None
        if math.isinf(rate):
            raise ServelabError(
                f"{self.path}: request rate inf (vllm bench serve's default: every request at "
                "once) is not a rate point; measure with --request-rate R, or file it under "
                "concurrency_<CCC>"
            )
        if not rate > 0:
            raise ServelabError(f"{self.path}: request rate {given!r} is not above 0")
        return rate

    def level(self, bench: BenchJson) -> Level:
        """The point's concurrency or request rate (as `axis` says)."""
        if self.axis == RATE:
            return Level.at_rate(self.rate(bench))
        return Level.at_concurrency(self.concurrency(bench))


def vllm_bench_files(root: Path) -> list[BenchFile]:
    """Every point file of a vllm-bench tree (vllm bench's benchmark.json, or another tool's
    results: servelab.analysis.peers), by repeat, then folder name; a tree that holds
    both concurrency_<CCC> and rate_<R> folders is a one-line error (one sweep per root)."""
    files, axes = [], set()
    # the repeat folders, each with its name's match of VLLM_REP
    reps = {d: rm for d in root.glob("rep_*") if d.is_dir() and (rm := VLLM_REP.match(d.name))}
    for rep_dir in sorted(reps):
        rep = int(reps[rep_dir].group(1))
        for d in sorted(rep_dir.iterdir()):
            for axis, pattern in (("concurrency", VLLM_CONC), ("rate", VLLM_RATE)):
                m = pattern.match(d.name)
                if m is None or not d.is_dir():
                    continue
                axes.add(axis)
                found = point_file(d)
                if found is not None:
                    files.append(BenchFile(found[0], rep, axis, m.group(1), found[1]))
    if len(axes) > 1:
        raise ServelabError(
            f"{root}: holds both concurrency_<CCC> and rate_<R> folders; a vllm-bench tree is a "
            "sweep over concurrency or over request rate: give each its own folder"
        )
    return files


class Arrival(TypedDict):
    """A rate point's arrival process (`extra["arrival"]` of a vllm-bench point)."""

    process: str
    burstiness: float
    max_in_flight: int | None
    requests: int


def bench_arrival(bench: BenchJson) -> Arrival:
    """A rate point's arrival process as far as benchmark.json records it: `process` (gamma
    gaps of shape `burstiness`, vLLM's default 1: poisson; an infinite one: constant),
    `burstiness` (1 for poisson and constant, as servelab records them), `max_in_flight`
    (--max-concurrency, None without a cap) and `requests`."""
    b = bench.get("burstiness")
    burst = 1.0 if b is None else float(b)
    process = "constant" if math.isinf(burst) else "poisson" if burst == 1.0 else "gamma"
    cap = bench.get("max_concurrency")
    return {
        "process": process,
        "burstiness": burst if process == "gamma" else 1.0,
        "max_in_flight": int(cap) if cap else None,
        "requests": len(bench["ttfts"]),
    }


def _bench_ends(bench: BenchJson, sends: list[float]) -> list[float]:
    """Each request's end on the clock of `start_times` (s): its send plus `latencies`, else
    plus TTFT and the ITLs (a failed request: its send)."""
    n = len(sends)
    lat = bench.get("latencies")
    if lat and len(lat) == n:
        return [s + float(x or 0.0) for s, x in zip(sends, lat, strict=True)]
    itls = bench.get("itls") or [None] * n
    ttfts = bench["ttfts"]
    return [
        s + float(ttfts[i] or 0.0) + sum(float(g) for g in itls[i] or [])
        for i, s in enumerate(sends)
    ]


def _bench_arrival_rate(bench: BenchJson, rate: float, t: ValiditySection) -> Flag:
    """arrival_rate from vllm bench's send times (`start_times`, after any wait for a slot)
    against the target: vLLM records no schedule, but scales its drawn gaps so that request N
    of N is due at N/R s, and its first send then differs from 1/R by sampling alone."""
    limit = float(t.max_arrival_rate_error_pct)
    sends = sorted(float(x) for x in bench.get("start_times") or [])
    achieved = achieved_rate(sends)
    if achieved is None:
        why = "fewer than two requests sent at different times"
        if not sends:
            why = f"the send times (start_times) are {NOT_BY_BENCH}"
        return Flag("arrival_rate", NOT_CHECKED, None, limit, why)
    off = 100.0 * abs(achieved / rate - 1.0)
    said = (
        f"requests sent at {achieved:.3g} req/s, target {rate:g} req/s: {off:.2g}% off "
        f"(the schedule's own rate is {NOT_BY_BENCH}; vLLM scales its schedule to the target)"
    )
    if off > limit:
        return Flag("arrival_rate", FAILED, off, limit, f"{said} (limit {number_text(limit)}%)")
    return Flag("arrival_rate", PASSED, off, limit, said)


def _bench_cap_reached(bench: BenchJson, cap: int | None) -> Flag:
    """cap_reached from vllm bench's send times and waits for a slot (`queue_times`): a request
    was held when, as its schedule released it (its send less its wait), `cap` requests were
    sent and not ended."""
    if not cap:
        return Flag("cap_reached", NOT_CHECKED, None, None, "no cap on requests in flight")
    starts, queued = bench.get("start_times"), bench.get("queue_times")
    if not starts or not queued or len(starts) != len(queued):
        why = f"the waits for a slot (queue_times) are {NOT_BY_BENCH}"
        return Flag("cap_reached", NOT_CHECKED, None, None, why)
    sends = [float(x) for x in starts]
    sorted_sends = sorted(sends)
    ends = sorted(_bench_ends(bench, sends))
    n = 0
    for s, q in zip(sends, queued, strict=True):
        due = s - float(q or 0.0)
        others = bisect.bisect_right(sorted_sends, due) - (s <= due)  # sent by then, not itself
        in_flight = others - bisect.bisect_right(ends, due)
        n += in_flight >= cap
    if n:
        why = (
            f"{n} of {len(sends)} requests were released while all {cap} slots "
            "(--max-concurrency) were busy and waited for one: the point was partly a closed loop"
        )
        return Flag("cap_reached", NOTED, n / len(sends), None, why)
    return Flag("cap_reached", PASSED, 0.0, None, f"no request waited for one of the {cap} slots")


def bench_checks(bench: BenchJson, level: Level, t: ValiditySection) -> tuple[Flag, ...]:
    """Every check on one benchmark.json. A rate point's open-loop checks read what vllm bench
    records: the send times and waits for a slot (`start_times`, `queue_times`, in newer
    versions), never the scheduled send times, so `send_slip` is not checked. A file of
    aggregates only has every check not run, saying so."""
    if aggregates_only(bench):
        return tuple(
            Flag(c.name, NOT_CHECKED, None, None, AGGREGATES_ONLY) for c in checks_for(level.axis)
        )
    if not level.is_rate:
        return evaluate(facts_from_bench(bench), t)
    arrival = bench_arrival(bench)
    flags = evaluate(facts_from_bench(bench, level, arrival), t)
    slip_limit = float(t.max_send_slip_ms)
    own = {
        "arrival_rate": _bench_arrival_rate(bench, float(level.value), t),
        "send_slip": Flag(
            "send_slip",
            NOT_CHECKED,
            None,
            slip_limit,
            f"the scheduled send times are {NOT_BY_BENCH}",
        ),
        "cap_reached": _bench_cap_reached(bench, arrival["max_in_flight"]),
    }
    return tuple(own.get(f.check, f) for f in flags)


def _load_vllm_bench(root: Path, name: str, t: ValiditySection) -> Dataset:
    points = []
    for f in vllm_bench_files(root):
        bench = f.read()
        metrics, ttfts, per = vllm_bench_metrics(bench, str(f.path))
        level = f.level(bench)
        extra: PointExtra = {"arrival": bench_arrival(bench)} if level.is_rate else {}
        if aggregates_only(bench):
            extra["aggregates_only"] = True
        if bench.get("client_output_lens") is not None:
            extra["client_output_tokens"] = client_output_tokens(bench)
        waits = [float(w) for w in bench.get("client_waits") or [] if w is not None]
        if waits:
            extra["client_wait_ms"] = 1000.0 * sum(waits) / len(waits)
        sends = [float(x) for x in bench.get("start_times") or []]
        if sends and len(sends) == len(bench["ttfts"]):
            extra["request_span_s"] = max(_bench_ends(bench, sends)) - min(sends)
        points.append(
            Point(
                server_config=name,
                repeat=f.repeat,
                level=level,
                metrics=metrics,
                ttfts_ms=ttfts,
                per_request=per,
                extra=extra,
                checks=bench_checks(bench, level, t),
            )
        )
    if not points:
        raise ServelabError(f"{root}: no {VLLM_TREE} found")
    capacity: dict[str, Capacity] = {}
    log = root / SERVER_LOG
    if log.exists():
        facts: object = dict(parse_capacity(log.read_text(encoding="utf-8", errors="replace")))
        capacity[name] = cast(Capacity, facts)
    return Dataset("vllm-bench", root, points, capacity, t)
