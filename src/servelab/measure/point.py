"""The points of one server launch: what they share (`PointJob`), measuring one into its folder
(raw/<sc>/rep<RR>/<level>/, docs/raw-data.md), and the warm-up.

A point is measured into `<point>.partial/` and renamed when it completes; a point cut short is
kept as `<point>.incomplete[.N]/` with status "incomplete" and never read as data. A re-measure
of a point a host check found disturbed (servelab.measure.remeasure) goes the same way into
`<point>/attempt-<N>/`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from servelab.client import OpenLoop, PointRun, RequestSettings, run_point
from servelab.design.level import LevelValue
from servelab.design.schedule import Slot
from servelab.documents.declared import ChatBlock, DatasetBlock, IntendedReuse, WorkerStats
from servelab.errors import ServelabError
from servelab.experiment import (
    LengthRangeJson,
    LengthValuesJson,
    SweepSection,
    TelemetrySection,
    WorkloadSection,
)
from servelab.job import Say
from servelab.launch.session import Session
from servelab.measure.sending import Replay
from servelab.metrics import point_metrics
from servelab.store.jsonio import write_jsonl_gz
from servelab.store.paths import REQUESTS_FILE, ExperimentPaths, attempt_dir
from servelab.store.records import ArrivalsRecord, PointRecord
from servelab.telemetry import GpuSelection, PointTelemetry
from servelab.telemetry.sources import Beside
from servelab.workload.promptset import Item, slice_reuse


@dataclass(frozen=True)
class Again:
    """A re-measure of a point: its attempt (2 on) and why the one before was measured again
    (the host checks that failed, in words); point.json `attempt` and `remeasure_reason`."""

    attempt: int
    reason: str

    def info(self) -> dict[str, object]:
        return {"attempt": self.attempt, "remeasure_reason": self.reason}


class WorkloadBlocks(TypedDict, total=False):
    """point.json's workload blocks beyond the default's (`PointJob.workload_info`)."""

    dataset: DatasetBlock
    shared_prefix: IntendedReuse
    chat: ChatBlock
    trace: dict[str, Any]


def is_complete(pdir: Path) -> bool:
    return PointRecord.status_in(pdir) == "complete"


def keep_incomplete(partial: Path) -> Path:
    base = partial.with_name(partial.name.removesuffix(".partial") + ".incomplete")
    dest, n = base, 1
    while dest.exists():
        n += 1
        dest = base.with_name(f"{base.name}.{n}")
    partial.rename(dest)
    return dest


def _write_point(
    pdir: Path,
    run: PointRun,
    info: Mapping[str, object],
    slices: Sequence[Sequence[int]] | None = None,
) -> Mapping[str, object]:
    """Write a point's point.json (`info`, then its run's times and metrics) and requests into
    `pdir`; `slices`: the windows of a point sent in slices, which its duration and concurrency
    are measured over (info's `slices`)."""
    # more than one client process (workload.client_workers): what each sent and how busy it
    # was; a point sent from the sweep's own process records none
    workers = {"client_workers": run.workers} if len(run.workers) > 1 else {}
    point = PointRecord.new(
        {
            **info,
            "started_epoch_ns": run.started_epoch_ns,
            "finished_epoch_ns": run.finished_epoch_ns,
            "client_cpu_s": round(run.client_cpu_s, 6),
            **workers,
            **point_metrics(run.records, slices),
        }
    )
    write_jsonl_gz(pdir / REQUESTS_FILE, (r.to_json() for r in run.records))
    point.write(pdir / PointRecord.FILE)
    return point.doc


def _output_tokens(run: PointRun) -> int:
    """The point's `total_output_tokens`, for its energy per output token."""
    return int(point_metrics(run.records)["total_output_tokens"] or 0)  # never None


def _summary_line(point: Mapping[str, object]) -> str:
    tput = point.get("output_throughput")
    ttft = point.get("mean_ttft_ms")
    return (
        f"{tput:8.1f} tok/s, mean TTFT {ttft:8.1f} ms"
        if tput is not None and ttft is not None
        else "no successful request"
    ) + f", {point['failed']} failed"


@dataclass(frozen=True)
class PointJob:
    """What the warm-up and every point of one server launch share."""

    sc: str
    session: Session
    client: RequestSettings
    paths: ExperimentPaths  # points go to raw/<sc>/rep<RR>/c<CCCC>, the warm-up to raw/<sc>/warmup
    workload: WorkloadSection
    sweep: SweepSection
    telemetry: TelemetrySection
    prompts: Sequence[Item]
    launch_index: int
    orders: Mapping[int, list[LevelValue]]  # repeat -> its levels in run order
    say: Say
    gpus: GpuSelection | None = None  # the server's GPUs (None: every GPU NVML lists)
    # rate -> its send schedule (an open loop's; none for a closed loop)
    arrivals: Mapping[float, ArrivalsRecord] = field(default_factory=dict)
    # a dataset workload's record (raw/<sc>/dataset.json); None for synthetic prompts
    dataset: Mapping[str, Any] | None = None
    # the SLO capacity search's points (raw/<sc>/search/), not the sweep's
    search: bool = False
    replay: Replay | None = None  # a trace workload's window (None: no trace)

    def folder(self, slot: Slot) -> Path:
        """Where a point is measured: the sweep's raw layout, or the search's."""
        if self.search:
            assert slot.level.is_rate
            return self.paths.search_point(self.sc, slot.repeat, slot.level.value)
        return self.paths.slot(self.sc, slot)

    def warmup(self, offset: int) -> None:
        wl = self.workload
        n = wl.warmup.requests
        run = run_point(
            self.client,
            self.prompts[offset : offset + n],
            wl.warmup.concurrency,
            f"{self.sc}-warmup",
        )
        point = _write_point(
            self.paths.search_warmup(self.sc) if self.search else self.paths.warmup(self.sc),
            run,
            {
                "server_config": self.sc,
                "kind": "warmup",
                "launch": self.launch_index,
                "concurrency": wl.warmup.concurrency,
                "prompt_offset": offset,
                "ignore_eos": bool(wl.ignore_eos),
                "unique_prompts": bool(wl.unique_prompts),
                "status": "complete",
            },
        )
        self.say(f"[{self.sc}] warm-up: {point['num_prompts']} requests, {_summary_line(point)}")

    def point_info(self, slot: Slot, prompt_offset: int) -> dict[str, object]:
        """The fields of a measured point's point.json that say what it is (before its
        status, telemetry and metrics)."""
        wl = self.workload
        level: dict[str, object] = {**slot.level.to_json()}
        if slot.level.is_rate:
            level["arrival"] = self.arrivals[slot.level.value].summary()
        return {
            "server_config": self.sc,
            "kind": "measured",
            "repeat": slot.repeat,
            **level,
            "position": slot.position,
            "run_index": slot.run_index,
            "order": self.orders[slot.repeat],
            "order_kind": self.sweep.order,
            "launch": self.launch_index,
            **self.lengths_info(),
            "prompt_offset": prompt_offset,
            "ignore_eos": bool(wl.ignore_eos),
            "unique_prompts": bool(wl.unique_prompts),
            **self.workload_info(prompt_offset, self.requests(slot)),
            **self.trace_info(slot),
        }

    def lengths_info(self) -> dict[str, int | LengthValuesJson | LengthRangeJson]:
        """point.json `input_tokens` / `output_tokens`: the asked length, or its distribution
        ({min, max} or {values}); absent for a dataset, whose requests carry their own."""
        out: dict[str, int | LengthValuesJson | LengthRangeJson] = {}
        for key in ("input_tokens", "output_tokens"):
            v = getattr(self.workload, key)
            if v is not None:
                out[key] = v if isinstance(v, int) else v.to_json()
        return out

    def workload_info(self, offset: int, n: int) -> WorkloadBlocks:
        """point.json's workload blocks beyond the default's: `dataset` (the file's sha256 and
        the sample's), `shared_prefix` (what the point's prompts mean the prefix cache to
        serve) and `chat` (turns, think time); none for the default workload."""
        wl, out = self.workload, WorkloadBlocks()
        if self.dataset is not None:
            out["dataset"] = {
                "sha256": self.dataset["file"]["sha256"],
                "prompts_sha256": self.dataset.get("prompts_sha256"),
            }
        reuse = slice_reuse(self.prompts[offset : offset + n], wl)
        if reuse is not None:
            out["shared_prefix"] = reuse
        if wl.chat is not None:
            out["chat"] = {"turns": wl.chat.turns, "think_time_s": wl.chat.think_time_s}
        return out

    def trace_info(self, slot: Slot) -> WorkloadBlocks:
        """point.json `trace` (servelab.measure.sending); none without a trace."""
        if self.replay is None:
            return WorkloadBlocks()
        return WorkloadBlocks(trace=self.replay.point_block(float(slot.level.value)))

    def requests(self, slot: Slot) -> int:
        """The items a point sends: its rate's schedule, or concurrency x waves."""
        if slot.level.is_rate:
            return len(self.arrivals[slot.level.value].offsets_ns)
        return int(slot.level.value) * self.workload.waves

    def load(self, slot: Slot) -> int | OpenLoop:
        """How run_point sends a point: a closed loop of its concurrency, or its rate's
        schedule (an open loop)."""
        if slot.level.is_rate:
            schedule = self.arrivals[slot.level.value]
            return OpenLoop(schedule.offsets_ns, schedule.doc["max_in_flight"])
        return int(slot.level.value)

    def measure(
        self, slot: Slot, prompt_offset: int, progress: str, again: Again | None = None
    ) -> Mapping[str, object]:
        """Measure one point into <point>.partial/ and rename it when it is complete; a point
        cut short is kept as incomplete, and a server that died ends the job. `again`: a
        re-measure of a disturbed point, into <point>/attempt-<N>/ (servelab.measure.remeasure).
        Returns the point's point.json."""
        point = self.open(slot, prompt_offset, again)
        try:
            point.start()
            point.send()
        except BaseException as exc:
            point.interrupted(exc)
            raise
        return point.close(progress)

    def open(
        self,
        slot: Slot,
        prompt_offset: int,
        again: Again | None = None,
        siblings: tuple[int, ...] = (),
    ) -> OpenPoint:
        """A point to measure (`OpenPoint`); `siblings`: the process roots of the servers its
        slices alternate with, whose CPU its telemetry reads as theirs."""
        final = self.folder(slot)
        if again is not None:
            final = attempt_dir(final, again.attempt)
        info = self.point_info(slot, prompt_offset) | ({} if again is None else again.info())
        label = f"{self.sc}-r{slot.repeat:02d}-{self.folder(slot).name}"
        if again is not None:
            label += f"-{final.name}"
        # Telemetry: samplers run around the point and write telemetry.jsonl beside it, also for
        # a point cut short; their summary over the point's window goes into point.json.
        server = self.session.server.telemetry_process()
        tel = PointTelemetry(
            self.telemetry, server, self.client.base_url, gpus=self.gpus, beside=Beside(siblings)
        )
        return OpenPoint(self, slot, prompt_offset, final, info, label, tel)


@dataclass
class OpenPoint:
    """A point on its way: its folder (`<point>.partial/` until it is complete), the requests
    it has measured so far, its telemetry. `PointJob.measure` sends it whole; a side-by-side
    round sends a pair of points in slices that alternate between their servers
    (servelab.measure.alternate), and `slices` keeps each slice's window (point.json)."""

    job: PointJob
    slot: Slot
    offset: int
    final: Path
    info: dict[str, object]
    label: str
    tel: PointTelemetry
    run: PointRun = field(default_factory=PointRun)
    slices: list[list[int]] = field(default_factory=list)

    @property
    def partial(self) -> Path:
        return self.final.with_name(self.final.name + ".partial")

    def start(self) -> None:
        # made first: an interrupt once the folder exists keeps it as incomplete
        self.partial.mkdir(parents=True, exist_ok=True)
        self.tel.start()

    def send(self, part: tuple[int, int] | None = None) -> None:
        """Send the point's requests, all of them, or its items [lo, hi) as one slice; `run`
        fills as they end, also when a stop signal cuts the slice short."""
        job = self.job
        prompts = job.prompts[self.offset : self.offset + job.requests(self.slot)]
        workers, load = job.workload.client_workers, job.load(self.slot)
        if part is None:
            run_point(job.client, prompts, load, self.label, self.run, workers=workers)
            return
        lo, hi = part
        one = PointRun()
        label = f"{self.label}-s{len(self.slices):02d}"
        try:
            run_point(job.client, prompts[lo:hi], load, label, one, workers=workers)
        finally:
            self._add(one)

    def _add(self, one: PointRun) -> None:
        """One slice's run into the point's: its records, CPU and window."""
        run = self.run
        run.records.extend(one.records)
        run.records.sort(key=lambda r: r.request_id)
        run.started_epoch_ns = run.started_epoch_ns or one.started_epoch_ns
        run.finished_epoch_ns = one.finished_epoch_ns or run.finished_epoch_ns
        run.client_cpu_s += one.client_cpu_s
        run.workers = add_workers(run.workers, one.workers)
        self.slices.append([one.started_epoch_ns, one.finished_epoch_ns])

    def _info(self, status: dict[str, object]) -> dict[str, object]:
        return {**self.info, **({"slices": self.slices} if self.slices else {}), **status}

    def _write(self, status: dict[str, object]) -> Mapping[str, object]:
        """Write the point into its partial folder with `status` (point.json and its
        requests)."""
        return _write_point(self.partial, self.run, self._info(status), self.slices or None)

    def _telemetry(self) -> None:
        run = self.run
        self.info["telemetry"] = self.tel.finish(
            self.partial, run.started_epoch_ns, run.finished_epoch_ns, _output_tokens(run)
        )

    def interrupted(self, exc: BaseException) -> None:
        """Keep what a point cut short measured, as incomplete, and say where."""
        self.partial.mkdir(parents=True, exist_ok=True)
        self._telemetry()
        error = f"interrupted: {type(exc).__name__} {exc}".strip()
        self._write({"status": "incomplete", "error": error})
        kept = keep_incomplete(self.partial)
        self.job.say(
            f"[{self.job.sc}] point rep{self.slot.repeat:02d} {self.slot.name()} interrupted; "
            f"{len(self.run.records)} finished requests kept in {kept} (marked incomplete)"
        )

    def close(self, progress: str) -> Mapping[str, object]:
        """Its telemetry's summary, and the point complete (renamed to its folder); a server
        that died during it keeps it as incomplete and ends the job."""
        job, slot, run = self.job, self.slot, self.run
        sc, server = job.sc, job.session.server
        self._telemetry()
        if not server.alive_after(run.records):
            gone = server.gone_text()
            error = f"server {gone} during the point"
            self._write({"status": "incomplete", "error": error})
            kept = keep_incomplete(self.partial)
            raise ServelabError(
                f"[{sc}] the server {gone} during point rep{slot.repeat:02d} "
                f"{slot.name()}; the point is kept as {kept} (incomplete), completed "
                f"points stay in {job.paths.raw_config(sc)}; rerun to measure the rest. Last "
                f"lines of {server.log_path}:\n{server.log_tail()}"
            )
        point = self._write({"status": "complete"})
        os.replace(self.partial, self.final)  # final cannot exist: only missing points are measured
        sliced = f", {len(self.slices)} slices" if self.slices else ""
        job.say(
            f"[{sc}] {progress} rep{slot.repeat:02d} {slot.name():<6} "
            f"{_summary_line(point)} ({point['duration']:.1f} s{sliced})"
        )
        return point


def add_workers(mine: list[WorkerStats], more: list[WorkerStats]) -> list[WorkerStats]:
    """Client processes' entries (PointRun.workers) of two slices of a point, summed by
    process: requests, CPU and wall seconds, and busy share = CPU / wall."""
    if not mine:
        return list(more)
    out: list[WorkerStats] = []
    for a, b in zip(mine, more, strict=False):
        cpu, wall = a["cpu_s"] + b["cpu_s"], a["wall_s"] + b["wall_s"]
        out.append(
            {
                "requests": a["requests"] + b["requests"],
                "cpu_s": cpu,
                "wall_s": wall,
                "busy": cpu / wall if wall > 0 else 0.0,
            }
        )
    return out
