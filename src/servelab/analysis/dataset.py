"""Load measured points from either raw layout into one shape.

- servelab's own layout (docs/raw-data.md): metrics are recomputed from requests.jsonl.gz, so
  every table is a pure function of the raw requests;
- `vllm bench serve --save-result --save-detailed` trees: ROOT/rep_<NN>/concurrency_<CCC>/
  benchmark.json (one server configuration per root), optionally with ROOT/server.log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.analysis.stopping import StoppingRule
from servelab.analysis.validity import (
    Flag,
    check_point,
    evaluate,
    facts_from_bench,
    failed,
    point_name,
    removing,
)
from servelab.client import RequestRecord
from servelab.config import default_section
from servelab.errors import ServelabError
from servelab.experiment import ValiditySection
from servelab.jsonio import read_json
from servelab.metrics import assemble, point_metrics, request_latencies
from servelab.paths import SERVER_LOG, ExperimentPaths
from servelab.rawdata import DamagedRawData, Skipped, load_points
from servelab.records import CapacityRecord, LaunchRecord, RunRecord, RuntimeRecord
from servelab.serverlog import parse_capacity
from servelab.telemetry.summary import telemetry_columns

VLLM_REP = re.compile(r"^rep_(\d+)$")
VLLM_CONC = re.compile(r"^concurrency_(\d+)$")


@dataclass
class Point:
    server_config: str
    repeat: int
    concurrency: int
    metrics: dict[str, Any]
    position: int | None = None
    ttfts_ms: list[float] = field(default_factory=list)
    # per successful request: (ttft, tpot or None, e2el), ms; for goodput under SLOs
    per_request: list[tuple[float, float | None, float]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
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
        return point_name(self.server_config, self.repeat, self.concurrency)


@dataclass
class Dataset:
    layout: str  # "servelab" | "vllm-bench"
    root: Path
    points: list[Point]
    capacity: dict[str, dict[str, Any]]  # server_config -> capacity facts (may be empty)
    # the thresholds the points were checked with
    validity: ValiditySection
    # the measuring host per server config (launch.json cpu_facts) and what the runtime
    # computes with (runtime/runtime.json isa); empty where the raw data has none
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    runtime_isa: dict[str, Any] | None = None
    # points and per-configuration files left out by skip_damaged, each with why (empty
    # unless something was skipped)
    skipped: list[Skipped] = field(default_factory=list)
    # the node each server config was measured on (launch.json node: hostname, slurm_job_id,
    # host); no entry where the raw data has none (written before it was recorded)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # a sequential sweep's record (run.json `sequential`: the stopping rule, the rounds, why it
    # stopped); None for a fixed number of repeats
    sequential: dict[str, Any] | None = None

    def configs(self) -> list[str]:
        return sorted({p.server_config for p in self.points})


def detect_layout(root: Path) -> str:
    if (root / "raw").is_dir() and ExperimentPaths(root).point_files():
        return "servelab"
    if any(VLLM_REP.match(d.name) and d.is_dir() for d in root.glob("rep_*")):
        return "vllm-bench"
    raise ServelabError(
        f"{root}: neither servelab raw data (raw/<config>/rep<RR>/c<CCCC>/point.json) nor a "
        "vllm-bench tree (rep_<NN>/concurrency_<CCC>/benchmark.json); pass the experiment folder"
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


def _load_servelab(root: Path, t: ValiditySection, skip_damaged: bool = False) -> Dataset:
    points = []
    skipped: list[Skipped] = []
    for raw in load_points(root, skipped if skip_damaged else None):
        meta = raw.meta
        try:
            recs = raw.records()
        except DamagedRawData as exc:
            if not skip_damaged:
                raise
            skipped.append(Skipped(raw.folder, exc))
            continue
        ttfts, per = _per_request(recs)
        metrics = point_metrics(recs)
        metrics["client_cpu_s"] = meta.get("client_cpu_s")
        if "telemetry" in meta:
            metrics.update(telemetry_columns(meta["telemetry"]))
        points.append(
            Point(
                server_config=meta["server_config"],
                repeat=int(meta["repeat"]),
                concurrency=int(meta["concurrency"]),
                metrics=metrics,
                position=meta.get("position"),
                ttfts_ms=ttfts,
                per_request=per,
                extra={k: meta[k] for k in ("launch", "telemetry") if k in meta},
                checks=check_point(recs, meta, t, raw.server_args, raw.warmup),
            )
        )
    if skipped and not points:
        raise ServelabError(
            f"{root}: all {len(skipped)} points are damaged, nothing left to analyse; "
            f"the first: {min(skipped, key=lambda s: s.path).reason}"
        )
    capacity = {}
    paths = ExperimentPaths(root)
    for cap in paths.capacity_files():
        try:
            capacity[cap.parent.name] = CapacityRecord.read(cap).doc
        except DamagedRawData as exc:
            if not skip_damaged:
                raise
            # per configuration, not per point: its points stay; what needs the facts (the
            # --max-num-seqs and CUDA graph capture sizes the diagnoses weigh) reads "unknown"
            skipped.append(Skipped(cap, exc, f"the capacity facts of {cap.parent.name}"))
    hosts, nodes = {}, {}
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
        facts, node = launch.cpu_facts, launch.node
        if facts is not None:
            hosts[lj.parent.name] = facts
        if node is not None:
            nodes[lj.parent.name] = node
    runtime = RuntimeRecord.read_if_present(paths.runtime_record)
    isa = runtime.isa if runtime is not None else None
    skipped.sort(key=lambda s: s.path)
    return Dataset(
        "servelab",
        root,
        points,
        capacity,
        t,
        hosts,
        isa if isinstance(isa, dict) else None,
        skipped,
        nodes,
        _sequential(root, skipped if skip_damaged else None),
    )


def _sequential(root: Path, skipped: list[Skipped] | None) -> dict[str, Any] | None:
    """The sequential record of the sweep (every run.json of a sequential sweep carries the
    same one); None for a fixed number of repeats or where no run.json was written. A damaged
    run.json raises, or with `skipped` is listed there and passed over."""
    for rj in ExperimentPaths(root).run_files():
        try:
            seq = RunRecord.read(rj).sequential
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
            return seq
    return None


def _s_to_ms(xs: list[Any]) -> list[float]:
    return [float(x) * 1000.0 for x in xs]


def vllm_bench_metrics(
    bench: dict[str, Any], source: str
) -> tuple[dict[str, Any], list[float], list[tuple[float, float | None, float]]]:
    """Metrics of one benchmark.json, from its per-request lists, with servelab's definitions."""
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


def _load_vllm_bench(root: Path, name: str, t: ValiditySection) -> Dataset:
    points = []
    for rep_dir in sorted(d for d in root.glob("rep_*") if d.is_dir() and VLLM_REP.match(d.name)):
        rep = int(VLLM_REP.match(rep_dir.name).group(1))  # type: ignore[union-attr]
        for cdir in sorted(d for d in rep_dir.glob("concurrency_*") if VLLM_CONC.match(d.name)):
            bj = cdir / "benchmark.json"
            if not bj.exists():
                continue
            bench = read_json(bj)
            conc = int(bench.get("max_concurrency") or VLLM_CONC.match(cdir.name).group(1))  # type: ignore[union-attr]
            metrics, ttfts, per = vllm_bench_metrics(bench, str(bj))
            checks = evaluate(facts_from_bench(bench), t)
            points.append(Point(name, rep, conc, metrics, None, ttfts, per, checks=checks))
    if not points:
        raise ServelabError(f"{root}: no rep_<NN>/concurrency_<CCC>/benchmark.json found")
    capacity: dict[str, dict[str, Any]] = {}
    log = root / SERVER_LOG
    if log.exists():
        capacity[name] = parse_capacity(log.read_text(encoding="utf-8", errors="replace"))
    return Dataset("vllm-bench", root, points, capacity, t)
