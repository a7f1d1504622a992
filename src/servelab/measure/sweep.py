"""One sweep job: one server configuration, every (repeat, level) point, in a balanced order.
A level is a concurrency (closed loop) or a request rate (open loop, sweep.rate).

Layout written (docs/raw-data.md):
  server/<sc>/server.log  launch.json  capacity.json
  raw/<sc>/prompts.jsonl.gz  warmup/{requests.jsonl.gz,point.json}
  raw/<sc>/dataset.json              a dataset workload's file and what was sampled from it
  raw/<sc>/trace.json                a trace workload's file and the window replayed
  raw/<sc>/rep<RR>/c<CCCC>/{requests.jsonl.gz,point.json}      a concurrency's point
  raw/<sc>/rep<RR>/r<RRRR.RRR>/{requests.jsonl.gz,point.json}  a rate's point
  raw/<sc>/arrivals/r<RRRR.RRR>.json  a rate's send schedule, the same for every repeat
  raw/<sc>/run.json                  written last: the job's output, status "complete"

  raw/<sc>/rep<RR>/<level>/attempt-<N>/  a point measured again: a host check failed

Nothing measured is lost on failure: a point is measured into `<point>.partial/` and renamed
when it completes; a point cut short is kept as `<point>.incomplete[.N]/` with status
"incomplete" and never read as data. A rerun keeps the completed points, skips them, and
measures the rest on a fresh server launch (recorded in each point as `launch`).

`SweepJob` is the job; its `measure` serves one launch (servelab.launch.session, as the profile
capture does) and hands the points to a `PointJob` (servelab.measure.point), which holds what
they share; after the launch's last scheduled point, the points a host check found disturbed
are measured again (servelab.measure.remeasure).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from servelab.analysis.validity import HOST_SPEED_WORDS
from servelab.design.level import LevelValue
from servelab.design.schedule import Slot, plan
from servelab.env.client_tools import TOOLS, runtime_tool
from servelab.errors import ServelabError
from servelab.hostfacts.canary import CanaryTimes
from servelab.hostfacts.gpucanary import GpuMeasure
from servelab.job import ConfigJob, MeasureJob
from servelab.launch.canary import gpu_canary
from servelab.launch.hostlock import MeasuringLock
from servelab.launch.ports import choose_port
from servelab.launch.server import ServerLaunch, raise_on_signals
from servelab.launch.session import LaunchAdditions, Session, build_launch, serve
from servelab.measure.crosscheck import CrossCheck, Target, done
from servelab.measure.point import OpenPoint, PointJob, is_complete, keep_incomplete
from servelab.measure.remeasure import pending, remeasure
from servelab.measure.sending import Replay, requests_of, schedule_of
from servelab.profile.capture import PlannedCapture, plan_capture
from servelab.profile.plan import on_sweep_launch
from servelab.store.records import (
    ArrivalsRecord,
    CapacityRecord,
    ClientsRecord,
    LaunchRecord,
    RunRecord,
)
from servelab.telemetry import server_gpus
from servelab.workload.promptset import PromptSource, write_prompts
from servelab.workload.synthetic import PromptPlan, prompt_plan


@dataclass(frozen=True)
class Start:
    """A launch about to start (SweepJob.prepare): the launch, its port and index, the
    profiler's interface (None: no profiling pass on it), the GPU canary, and since when."""

    launch: ServerLaunch
    port: int
    index: int
    interface: str | None
    gpu: GpuMeasure | None
    t0: float


@dataclass
class Live:
    """A launch that is up, warmed up, with points to measure (SweepJob.on_launch): `measure`
    one point, then `finish` (the points a host check found disturbed measured again, and the
    profiling pass on this launch)."""

    job: SweepJob
    session: Session
    start: Start
    points: PointJob
    pplan: PromptPlan
    slots: list[Slot]
    measured: int
    again: int = 0
    # the other tools of client.cross_check (None: none)
    cross: CrossCheck | None = None

    def measure(self, slot: Slot, label: str) -> None:
        def ours() -> None:
            self.points.measure(slot, self.pplan.offsets[slot.key], label)

        if self.cross is None:
            ours()
        else:  # servelab's client and the tools of client.cross_check, in this point's order
            self.cross_check(slot, ours)

    def cross_check(self, slot: Slot, ours: Callable[[], None] | None = None) -> None:
        """The point by the tools of client.cross_check and, given `ours`, servelab's client,
        in the point's turn of their rotating order."""
        if self.cross is None:
            return
        at, n = self.pplan.offsets[slot.key], self.points.requests(slot)
        # a rate's send schedule, the one servelab's client keeps (raw/<sc>/arrivals/)
        schedule = self.points.arrivals.get(slot.level.value) if slot.level.is_rate else None
        self.cross.measure(slot, self.points.prompts[at : at + n], ours, schedule)

    def open(self, slot: Slot, siblings: tuple[int, ...]) -> OpenPoint:
        """A point of this launch to send in slices (servelab.measure.alternate), beside the
        servers whose process roots are `siblings`."""
        return self.points.open(slot, self.pplan.offsets[slot.key], siblings=siblings)

    def pid(self) -> int | None:
        """The root of this launch's server processes (None: not sampled here)."""
        pid = self.session.server.telemetry_process()
        return pid if isinstance(pid, int) else None

    def finish(self) -> None:
        job = self.job
        if self.cross is not None:  # points measured on an earlier launch the tools missed
            for slot in self.slots:
                if self.cross.missing(slot) and is_complete(job.paths.slot(job.sc, slot)):
                    self.cross_check(slot)
        self.again = remeasure(self.points, self.slots, self.pplan.offsets, job.exp)
        if job.capture is not None and self.start.interface is not None:
            job.capture_here(
                self.session, self.start.launch, self.start.interface, warm=bool(self.measured)
            )


@dataclass(frozen=True)
class SweepJob(ConfigJob):
    """One sweep job: a server configuration of a measuring job (the experiment, its model
    and runtime, where its data goes)."""

    # profile.launch sweep (servelab.profile.plan.on_sweep_launch): the profiling pass of this
    # configuration, captured on this job's launch after its last point
    capture: PlannedCapture | None = None
    # the host-speed canary, before the job's first launch and after its last (run.json)
    canary: CanaryTimes = field(default_factory=CanaryTimes)

    @property
    def raw(self) -> Path:
        return self.paths.raw_config(self.sc)

    @property
    def server_dir(self) -> Path:
        return self.paths.server(self.sc)

    @property
    def records_dir(self) -> Path:
        """Where a launch's capacity.json and launch.json go: server/<sc>/."""
        return self.server_dir

    def note(self, msg: str) -> None:
        self.say(f"[{self.sc}] {msg}")

    @cached_property
    def prompt_source(self) -> PromptSource:
        """Where this job's prompts come from (a dataset pinned once, before any launch)."""
        return PromptSource.of(self.exp, self.model_dir, self.note)

    def measure(self, slots: list[Slot], todo: list[Slot], launch_index: int) -> None:
        """One server launch: its capacity and launch records, the prompts, the warm-up, then
        every point still to measure. The host's measuring-server lock is held from before the
        host canary that precedes the launch until after the one that follows it."""
        with MeasuringLock(self.exp.server.lock_timeout_s, self.note) as lock:
            start = self.prepare(launch_index)
            log = self.paths.server_log(self.sc)
            with serve(start.launch, log, self.exp.server, self.note, lock=lock) as s:
                live = self.on_launch(s, start, slots, todo)
                for k, slot in enumerate(todo, 1):
                    live.measure(slot, f"{k}/{len(todo)}")
                live.finish()
            self.stopped(live)

    def prepare(self, launch_index: int) -> Start:
        """What a launch needs before its server starts: a port, the profiler's additions, the
        launch itself, and the host canary timed before the job's first launch (with the host's
        measuring-server lock held: no other measuring server shares the host meanwhile, and
        the GPU canary first removes what a killed job left on the launch's GPUs)."""
        exp = self.exp
        port = choose_port(exp.server.host, exp.server.port, self.note)
        interface, additions = self.profiler_setup()
        launch = build_launch(self.job, self.sc, port=port, additions=additions)
        gpu = gpu_canary(launch, exp.runtime.device)  # None: a CPU runtime times no GPU part
        for line in self.canary.before_launch(gpu) or ():
            self.note(f"host canary before: {line}")
        self.note(
            f"starting vLLM on {launch.base_url} (launch {launch_index}): {' '.join(launch.args)}"
            if launch.endpoint is None
            else f"measuring the running server at {launch.base_url} (launch {launch_index})"
        )
        return Start(launch, port, launch_index, interface, gpu, time.monotonic())

    def on_launch(
        self, session: Session, start: Start, slots: list[Slot], todo: list[Slot]
    ) -> Live:
        """The launch is up: its records, its prompts and its warm-up; the points to measure
        on it, one `Live.measure` each."""
        self.started(session, start.launch, start.port, start.index)
        points, pplan = self.point_job(session, start.launch, slots, start.index)
        if self.exp.workload.warmup.requests and (
            todo or pending(self.paths, self.sc, slots, self.exp)
        ):
            points.warmup(pplan.warmup_offset)
        live = Live(self, session, start, points, pplan, slots, len(todo))
        live.cross = self.cross_check(start, live.pid())
        return live

    def cross_check(self, start: Start, server_pid: int | None) -> CrossCheck | None:
        """The tools of client.cross_check on this launch (None: none); vllm bench serve
        from this configuration's own runtime."""
        exp = self.exp
        if not exp.cross_check or exp.client is None:
            return None
        tools = dict(ClientsRecord.read(self.paths.clients_record).doc["tools"])
        if "vllm" in tools:
            tools["vllm"] = runtime_tool(TOOLS["vllm"], self.runtime.doc)
        wl = exp.workload
        assert isinstance(wl.output_tokens, int)  # config: one output length
        target = Target(
            start.launch.base_url,
            start.launch.served_name,
            self.model_dir,
            wl.output_tokens,
            wl.ignore_eos,
            wl.seed,
            exp.client.timeout_s,
            exp.sweep.arrival if exp.sweep.rate else None,
        )
        return CrossCheck(
            exp, self.sc, self.paths, tools, target, server_pid, start.index, self.say
        )

    def stopped(self, live: Live) -> None:
        """The launch's server has stopped: the host canary after it (the lock still held),
        and what it measured."""
        took = f"{time.monotonic() - live.start.t0:.1f} s"
        for line in self.canary.after_launch(live.start.gpu):
            self.note(f"host canary after: {line}")
        n = live.measured
        if self.capture is not None and live.start.interface is not None:
            self.note(f"server stopped; measured {n} points and profiled in {took}")
        else:
            done = "server stopped" if live.start.launch.endpoint is None else "server left running"
            self.note(f"{done}; measured {n} points in {took}")
        if live.again:
            self.note(f"{live.again} of them measured again after a host check failed")

    def started(self, session: Session, launch: ServerLaunch, port: int, launch_index: int) -> None:
        """A server launch is up: its capacity.json and launch.json (the latest launch), in
        server/<sc>/ (`records_dir`); Session.capacity and Session.launch_record say what they
        hold (for a server servelab did not launch too)."""
        where, args = self.records_dir, self.exp.server.args_of(self.sc)
        capacity = {**session.capacity(args), "server_config": self.sc}
        CapacityRecord.new(capacity).write(where / CapacityRecord.FILE)
        record = session.launch_record(launch_index, self.sc, args, self.runtime)
        LaunchRecord.new(record).write(where / LaunchRecord.FILE)

    def point_job(
        self, session: Session, launch: ServerLaunch, slots: list[Slot], launch_index: int
    ) -> tuple[PointJob, PromptPlan]:
        """The prompts of this launch (prompts.jsonl.gz) and what its warm-up and points share;
        where each takes its prompts from."""
        exp, sc, wl = self.exp, self.sc, self.exp.workload
        replay = self.replay(session)
        pplan = prompt_plan(
            slots,
            lambda s: replay.requests if replay is not None else requests_of(exp, s),
            wl.warmup.requests,
            wl.unique_prompts,
        )
        t_p = time.monotonic()
        pset = self.prompt_source.build(session, pplan.total)
        write_prompts(self.paths.prompts(sc), self.paths.dataset(sc), pset)
        self.note(
            f"{pset.describe(wl)} ready "
            f"({'unique per point' if wl.unique_prompts else 'shared by the points'}, "
            f"{time.monotonic() - t_p:.1f} s)"
        )
        points = PointJob(
            sc=sc,
            session=session,
            client=session.client(wl),
            paths=self.paths,
            workload=wl,
            sweep=exp.sweep,
            telemetry=exp.telemetry,
            prompts=pset.items,
            dataset=pset.dataset,
            launch_index=launch_index,
            orders=_orders_by_repeat(slots),
            arrivals=self.arrivals(slots, replay),
            replay=replay,
            say=self.say,
            # the GPUs this launch gave the server: the only ones its telemetry samples
            gpus=server_gpus(exp.runtime.device, launch.container, launch.env, os.environ),
        )
        return points, pplan

    def replay(self, session: Session) -> Replay | None:
        """The trace window this launch replays (None: no trace workload)."""
        tr, source = self.exp.workload.trace, self.prompt_source
        if tr is None or source.dataset is None:
            return None
        win = source.trace_window(session)
        return Replay(win, source.dataset.sha256, win.block_tokens)

    def arrivals(self, slots: list[Slot], replay: Replay | None) -> dict[float, ArrivalsRecord]:
        """The send schedule of every rate of the plan (none for a closed loop), written to
        raw/<sc>/arrivals/ the first time and checked against the one written before."""
        out: dict[float, ArrivalsRecord] = {}
        for rate in sorted({float(s.level.value) for s in slots if s.level.is_rate}):
            assert self.exp.sweep.arrival is not None
            drawn = schedule_of(self.exp.sweep.arrival, rate, self.exp.workload.seed, replay)
            path = self.paths.arrivals(self.sc, rate)
            kept = ArrivalsRecord.read_if_present(path)
            if kept is not None and kept.doc != drawn.doc:
                raise ServelabError(
                    f"{path}: the points of rate {rate:g} were measured on another send "
                    "schedule than sweep.arrival and workload.seed now draw; measure into a "
                    "fresh results_dir, or restore the config they were measured with"
                )
            if kept is None:
                path.parent.mkdir(parents=True, exist_ok=True)
                drawn.write(path)
            out[rate] = drawn
        return out

    def profiler_setup(self) -> tuple[str | None, LaunchAdditions | None]:
        """With the profiling pass on this launch: how vLLM's profiler is driven and what it
        adds to the launch (the profiler configured, idle until the last point is measured);
        (None, None) without one, or when the profiler cannot be set up (the capture is then
        "not profiled" with the reason, unless profile.required)."""
        if not self.capture_pending:
            return None, None
        capture = self.capture
        assert capture is not None and capture.job is not None
        try:
            interface = capture.job.prepare()
            return interface, capture.job.additions(interface)
        except ServelabError as exc:
            capture.fail(exc)
            return None, None

    def capture_here(
        self, session: Session, launch: ServerLaunch, interface: str, *, warm: bool
    ) -> None:
        """The profiling pass on this launch, after its last point: capture.json."""
        capture = self.capture
        assert capture is not None and capture.job is not None
        job = capture.job
        capture.t0 = time.monotonic()  # the profiling pass's own time, not the sweep's
        capture.finish(lambda: job.capture_on_sweep(session, launch, interface, warm=warm))

    @property
    def capture_pending(self) -> bool:
        """The profiling pass is to run on this job's launch and has not run yet."""
        c = self.capture
        return c is not None and c.job is not None and "status" not in c.record

    def measure_missing(self, repeats: int) -> list[Slot]:
        """The plan of `repeats` balanced repeats, measuring (on one server launch) every point
        of it not complete yet; the plan."""
        slots, todo, launch = self.missing(repeats)
        if launch:
            self.measure(slots, todo, next_launch_index(self.server_dir))
        return slots

    def missing(self, repeats: int) -> tuple[list[Slot], list[Slot], bool]:
        """The plan of `repeats` balanced repeats, the points of it not complete yet, and
        whether a launch is needed (points to measure, or to measure again, or the profiling
        pass); a stale partial point is kept as incomplete, and a resumed plan says so."""
        sweep, raw = self.exp.sweep, self.raw
        raw.mkdir(parents=True, exist_ok=True)
        slots = plan(sweep.levels, repeats, sweep.order, sweep.order_seed, sweep.axis)
        self.prompt_source  # noqa: B018 - a dataset is pinned (or refused) before any launch
        todo = [s for s in slots if not is_complete(self.paths.slot(self.sc, s))]
        tools_todo = self.tools_missing(slots)
        for stale in [*raw.glob("rep*/*.partial"), *raw.glob("rep*/*/attempt-*.partial")]:
            keep_incomplete(stale)
        redo = pending(self.paths, self.sc, slots, self.exp)
        if not todo and not redo and not self.capture_pending and not tools_todo:
            self.note(f"all {len(slots)} points already complete")
            return slots, todo, False
        if not todo:
            why = (
                f"{len(redo)} to measure again"
                if redo
                else f"{tools_todo} runs of other tools to measure"
                if tools_todo
                else "a launch for the profiling pass"
            )
            self.note(f"all {len(slots)} points already complete; {why}")
        if len(todo) < len(slots):
            self.note(f"resuming: {len(slots) - len(todo)} of {len(slots)} points already complete")
        return slots, todo, True

    def tools_missing(self, slots: list[Slot]) -> int:
        """The runs of client.cross_check's tools not complete yet, over the plan's points."""
        return sum(
            not done(self.paths, self.sc, tool, slot)
            for tool in self.exp.cross_check
            for slot in slots
        )

    def write_run(self, slots: list[Slot], wall_s: float, **extra: Any) -> dict[str, Any]:
        """run.json, the job's output, written last: the plan measured and how; `extra`: what a
        sequential sweep adds (its rounds)."""
        raw = self.raw
        record = RunRecord.new(
            {
                "server_config": self.sc,
                "status": "complete",
                "points": len(slots),
                "launches": next_launch_index(self.server_dir) - 1,
                "order": self.exp.sweep.order,
                "plan": [s.to_json() for s in slots],
                "incomplete_kept": sorted(
                    p.relative_to(raw).as_posix()
                    for p in [
                        *raw.glob("rep*/*.incomplete*"),
                        *raw.glob("rep*/*/attempt-*.incomplete*"),  # a re-measure cut short
                    ]
                ),
                "job_wall_s": round(wall_s, 3),
                **extra,
            }
            | ({} if (canary := self.canary.record()) is None else {"canary": canary.to_json()})
        )
        record.write(self.paths.run(self.sc))
        if canary is not None:
            self.note(f"{HOST_SPEED_WORDS[canary.drift.verdict]}: {canary.drift.line()}")
            if canary.gpu is not None and canary.gpu.present:  # an absent one was said
                self.note(canary.gpu.line())
        return record.doc


def run_sweep(job: MeasureJob, server_config: str) -> dict[str, Any]:
    """Measure every missing point of one server configuration; writes run.json last. A
    sequential plan (`sweep.repeats: {min, max}`) is run by servelab.measure.sequential instead."""
    raise_on_signals()
    t_job = time.monotonic()
    exp, paths = job.exp, job.paths
    capture = plan_capture(job, server_config) if server_config in on_sweep_launch(exp) else None
    if capture is not None:
        # written by this job, after its points: never a capture of an earlier job
        paths.capture(server_config).unlink(missing_ok=True)
    sweep = SweepJob(job, server_config, capture)
    if exp.sweep.rounds is not None:
        raise ServelabError(
            f"sweep.repeats is a sequential plan; measure {server_config} with "
            "servelab.measure.sequential.run_rounds, which measures every configuration round by "
            "round"
        )
    slots = sweep.measure_missing(exp.sweep.most_repeats)
    if capture is not None and not capture.written:
        capture.finish(None)  # the profiler could not be set up: "not profiled", and why
    return sweep.write_run(slots, time.monotonic() - t_job)


def next_launch_index(srv_dir: Path) -> int:
    launch = LaunchRecord.read_if_present(srv_dir / LaunchRecord.FILE)
    return 1 if launch is None else launch.launch + 1


def _orders_by_repeat(slots: list[Slot]) -> dict[int, list[LevelValue]]:
    out: dict[int, list[LevelValue]] = {}
    for s in slots:
        out.setdefault(s.repeat, []).append(s.level.value)
    return out
