"""Load measured points from either raw layout into one shape.

- servelab's own layout (docs/raw-data.md): metrics are recomputed from requests.jsonl.gz, so
  every table is a pure function of the raw requests;
- `vllm bench serve --save-result --save-detailed` trees (and other tools' results read into
  their shape): ROOT/rep_<NN>/concurrency_<CCC>/ or ROOT/rep_<NN>/rate_<R>/ point folders, one
  server configuration per root, optionally with ROOT/server.log; each point's file, metrics
  and checks by servelab.analysis.benchtree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from servelab.analysis.benchtree import (
    VLLM_REP,
    VLLM_TREE,
    Arrival,
    aggregates_only,
    bench_arrival,
    bench_checks,
    bench_ends,
    run_waits,
    vllm_bench_files,
    vllm_bench_metrics,
)
from servelab.analysis.outputs import PointKey, PointOutputs, point_outputs
from servelab.analysis.peers import client_output_tokens
from servelab.analysis.search import SearchResult
from servelab.analysis.search_records import read_search
from servelab.analysis.validity import (
    Choice,
    Flag,
    check_point,
    failed,
    point_name,
    removing,
    use_attempts,
)
from servelab.client import RequestRecord
from servelab.config import default_section
from servelab.design.level import Level, LevelValue
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
    point_metrics,
    request_latencies,
    text_lag,
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
    # an open-loop point's offered rate (req/s): its schedule's own (servelab's point.json
    # arrival.scheduled_rate, another tool's recorded schedule), else the target (vllm bench
    # scales its drawn schedule to it)
    offered_rate: float
    # servelab's point: how its completed requests' text followed their first token
    text_lag: TextLag


class TextLag(TypedDict):
    """A servelab point's completed requests against a client that times TTFT at the first
    chunk with text (servelab.metrics.text_lag): how many there were, how many had chunks of
    output without text before the first with text (`lagged`, and the most such chunks), and
    how many had no text at all (`no_text`)."""

    requests: int
    lagged: int
    most: int
    no_text: int


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


def _text_lag(records: list[RequestRecord]) -> TextLag:
    """TextLag of a point's requests (the completed ones)."""
    lags = [text_lag(r) for r in records if r.ok and r.chunk_offsets_us]
    shown = [n for n in lags if n is not None]
    return {
        "requests": len(lags),
        "lagged": sum(1 for n in shown if n > 0),
        "most": max(shown, default=0),
        "no_text": len(lags) - len(shown),
    }


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
    scheduled = (meta.get("arrival") or {}).get("scheduled_rate")
    if isinstance(scheduled, int | float):
        extra["offered_rate"] = float(scheduled)
    extra["text_lag"] = _text_lag(recs)
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


def _load_vllm_bench(root: Path, name: str, t: ValiditySection) -> Dataset:
    points = []
    for f in vllm_bench_files(root):
        bench = f.read()
        metrics, ttfts, per = vllm_bench_metrics(bench, str(f.path))
        level = f.level(bench)
        extra: PointExtra = {}
        arrival = None
        if level.is_rate:
            arrival = bench_arrival(bench)
            extra["arrival"] = arrival
            extra["offered_rate"] = arrival["scheduled_rate"] or float(level.value)
        if aggregates_only(bench):
            extra["aggregates_only"] = True
        if bench.get("client_output_lens") is not None:
            extra["client_output_tokens"] = client_output_tokens(bench)
        waits = run_waits(bench)  # the waits of requests scheduled within the run
        if waits:
            extra["client_wait_ms"] = 1000.0 * sum(waits) / len(waits)
        sends = [float(x) for x in bench.get("start_times") or []]
        if sends and len(sends) == len(bench["ttfts"]):
            extra["request_span_s"] = max(bench_ends(bench, sends)) - min(sends)
        points.append(
            Point(
                server_config=name,
                repeat=f.repeat,
                level=level,
                metrics=metrics,
                ttfts_ms=ttfts,
                per_request=per,
                extra=extra,
                checks=bench_checks(bench, level, t, arrival),
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
