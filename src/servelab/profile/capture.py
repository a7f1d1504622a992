"""The profiling pass: its own server launch, a short diagnostic workload per profiled
concurrency, and windows that bridge each point into the trace clock.

GPU (nsys): the server runs under `nsys profile` with one capture range driven by vLLM's
/start_profile and /stop_profile (`--profiler-config {"profiler": "cuda"}`: a vLLM without
--profiler-config is not profiled with nsys) that spans the diagnostic points, POINT_GAP_S
apart: a point's window is the client's wall-clock interval mapped once through the session
start, and kernels at its edges would otherwise land in the neighbouring window. The range
ends at cudaProfilerStop (`--capture-range-end=stop`), so nsys writes the report while the
server runs on; the job takes it once nsys says so in the server log or once the report file
has settled (servelab.profile.nsys_report: nsys's output may be buffered until it exits), for
profile.report_timeout_s, else stops the server with that much more time for nsys to write
it at its exit. Then `nsys export --type sqlite`. CPU: vLLM's torch profiler,
bounded (no stacks, shapes, memory or flops; a cap on engine steps; the frontend not
profiled), one trace JSON per point: with the unbounded defaults a trace reached 100 MB and the
engine stalled for minutes.

Every point records its wall-clock window (the client's clock, bridged to the trace by the
session start) and, when the `nvtx` package is importable, the client also emits one NVTX
start/end range per request: message = the point's label (a registered string), payload = the
request index. The client runs outside the server's Nsight Systems session, so the trace holds
those ranges only when the client ran under the same session; windows.json says only whether
the client emitted them (`client_nvtx_emitted`). A tool that is not there gives an explicit
"not profiled: reason" record, and so does a capture that fails when profile.required is false
(what was measured is kept).

The command lines are in servelab.profile.commands, which configurations get which tool in
servelab.profile.plan; the server is launched and served as the sweep's is
(servelab.launch.session).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import time
import urllib.error
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.client import PointRun, RequestSettings, run_point
from servelab.documents import JsonValue
from servelab.documents.declared import NsysReport
from servelab.env.container import ContainerRun, Mount
from servelab.env.runtime import NSYS_GLOBS, find_host_nsys
from servelab.errors import ServelabError
from servelab.hostfacts import node_facts
from servelab.job import ConfigJob, MeasureJob, Say
from servelab.launch.ports import choose_port
from servelab.launch.server import Server, ServerLaunch, raise_on_signals
from servelab.launch.session import LaunchAdditions, Session, build_launch, serve, server_container
from servelab.profile.commands import profiler_additions, profiler_interface
from servelab.profile.nsys_report import ReportWait, export_nsys
from servelab.profile.plan import NsysUse, for_runtime, profile_plan
from servelab.profile.records import PointRow, Progress
from servelab.profile.windows import Window, windows_json
from servelab.redact import redact_argv, redact_env
from servelab.store.jsonio import write_jsonl_gz
from servelab.store.paths import SERVER_LOG
from servelab.store.records import CaptureRecord, WindowsRecord
from servelab.workload.promptset import Item, PromptSource

Which = Callable[[str], str | None]
NVTX_DOMAIN = "servelab"
# between two nsys points (one capture range spans them all): the GPU idles, so a kernel at a
# window's edge lands in no window rather than in the neighbouring one
POINT_GAP_S = 1.0


# --- the diagnostic workload ------------------------------------------------------------


def nvtx_available() -> bool:
    return importlib.util.find_spec("nvtx") is not None


class NvtxRanges:
    """One NVTX start/end range per request (domain "servelab", message = point label,
    payload = request index); a no-op when the nvtx package is not importable."""

    def __init__(self, label: str) -> None:
        # the nvtx package's (untyped) domain and registered string
        self.domain: Any = None
        self.message: Any = None
        try:
            nvtx = importlib.import_module("nvtx")
        except ImportError:
            return
        with contextlib.suppress(Exception):
            self.domain = nvtx.get_domain(NVTX_DOMAIN)
            self.message = self.domain.get_registered_string(label)

    @property
    def active(self) -> bool:
        return self.domain is not None and self.message is not None

    def start(self, index: int) -> object:
        if not self.active:
            return None
        attrs = self.domain.get_event_attributes(message=self.message, payload=index)
        return self.domain.start_range(attrs)

    def end(self, range_id: object) -> None:
        if self.active and range_id is not None:
            self.domain.end_range(range_id)


def run_diagnostic_point(
    w: RequestSettings, prompts: Sequence[Item], concurrency: int, label: str
) -> PointRun:
    """A closed-loop point with an NVTX range around every request (when nvtx is importable)."""
    return run_point(w, prompts, concurrency, label, marks=NvtxRanges(label))


def _profiler_request(
    server: Server, path: str, body: Mapping[str, object] | None, timeout_s: float
) -> None:
    """POST to vLLM's /start_profile or /stop_profile; a refusal or a failure is one line."""
    try:
        server.post_json(path, body, timeout_s)
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode("utf-8", "replace").replace("\n", " ")
        raise ServelabError(
            f"POST {path} answered HTTP {exc.code}: {detail}; is the profiler enabled on the "
            "server (--profiler-config)?"
        ) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise ServelabError(f"POST {path} failed: {exc}") from None
    except json.JSONDecodeError:
        pass  # the answer's body, if any, says nothing the capture needs


def _wait_for_file(folder: Path, pattern: str, timeout_s: float) -> Path | None:
    """A torch trace vLLM writes after /stop_profile, once its size stops changing (vLLM
    says nothing when it is done)."""
    deadline = time.monotonic() + timeout_s
    last: tuple[Path, int] | None = None
    while time.monotonic() < deadline:
        found = sorted(folder.glob(pattern))
        if found:
            size = found[-1].stat().st_size
            if last is not None and last == (found[-1], size) and size > 0:
                return found[-1]
            last = (found[-1], size)
        time.sleep(0.5)
    return None


# --- the job ------------------------------------------------------------------------------


def run_profile(
    job: MeasureJob,
    sc: str,
    *,
    which: Which = shutil.which,
    nsys_globs: Sequence[str] = NSYS_GLOBS,
) -> dict[str, object]:
    """Capture one server configuration on a launch of its own (profile.launch own, and
    every nsys capture); writes capture.json last (the job's output).

    which and nsys_globs: how Nsight Systems is looked for on this host
    (servelab.env.runtime.find_host_nsys). A capture that fails is a "not profiled" record with
    the reason and what was measured, unless profile.required is true."""
    planned = plan_capture(job, sc, which=which, nsys_globs=nsys_globs)
    if planned.job is not None:
        raise_on_signals()
    return planned.finish(planned.job.capture if planned.job is not None else None)


@dataclass
class PlannedCapture:
    """A configuration's capture before any server starts: the first fields of capture.json
    (the tool and why), and the job that captures it (None: not profiled, the record is
    complete). `finish` runs the capture and writes capture.json."""

    record: dict[str, object]  # capture.json, as it is written
    job: CaptureJob | None
    t0: float  # when the job started (time.monotonic)
    out: Path
    written: bool = False  # capture.json is written

    def fail(self, exc: ServelabError) -> None:
        """A capture that failed: a "not profiled" record with the reason and what was
        measured, unless profile.required is true (then it raises)."""
        assert self.job is not None
        if self.job.exp.profile.required:
            raise exc
        reason = (str(exc).strip().splitlines() or ["the capture failed"])[0][:500]
        self.job.say(f"[{self.job.sc}] not profiled: {exc}")
        self.record.update(
            {"points": [], **self.job.progress, "status": "not profiled", "reason": reason},
            traces=[],
        )

    def finish(self, capture: Callable[[], dict[str, object]] | None) -> dict[str, object]:
        """Run `capture` (the fields it adds to capture.json) and write capture.json."""
        if self.job is not None and capture is not None and "status" not in self.record:
            try:
                self.record.update(capture())
            except ServelabError as exc:
                self.fail(exc)
        if self.job is not None:
            self.record["job_wall_s"] = round(time.monotonic() - self.t0, 3)
        CaptureRecord(self.record).write(self.out / CaptureRecord.FILE)
        self.written = True
        return self.record


def plan_capture(
    job: MeasureJob,
    sc: str,
    *,
    which: Which = shutil.which,
    nsys_globs: Sequence[str] = NSYS_GLOBS,
) -> PlannedCapture:
    """The tool that profiles `sc` here (servelab.profile.plan) and the job that will; a
    configuration that is not profiled gets its complete "not profiled" record."""
    t_job = time.monotonic()
    exp, paths, say = job.exp, job.paths, job.say
    out = paths.profile(sc)
    out.mkdir(parents=True, exist_ok=True)
    p = exp.profile
    decision = for_runtime(
        profile_plan(exp, which, nsys_globs)[sc],
        p,
        job.runtime_of(sc).doc,
        lambda: find_host_nsys(p.nsys, which, nsys_globs),
    )
    record: dict[str, object] = {
        "format_version": CaptureRecord.FORMAT_VERSION,
        "server_config": sc,
        "tool": decision.tool,
        "note": decision.note,
    }
    if decision.nsys is not None:
        record["nsys"] = decision.nsys.to_json()
    if decision.tool is None:
        say(f"[{sc}] not profiled: {decision.reason}")
        record.update(status="not profiled", reason=decision.reason, traces=[], points=[])
        return PlannedCapture(record, None, t_job, out)
    capture = CaptureJob(job, sc, decision.tool, decision.nsys)
    return PlannedCapture(record, capture, t_job, out)


def profiled_launch(capture: CaptureJob, interface: str, port: int) -> ServerLaunch:
    """The profiled server's command line and environment (tested without a GPU): the
    sweep's launch of the capture's configuration, with the profiler added (`additions`: in a
    container, the Nsight Systems it runs mounted in)."""
    return build_launch(
        capture.job,
        capture.sc,
        port=port,
        purpose="profile",
        additions=capture.additions(interface),
    )


@dataclass(frozen=True)
class CaptureJob(ConfigJob):
    """One capture job: a server configuration, the tool that profiles it, and its folder
    profile/<sc>/. `progress` holds what capture.json keeps when the capture fails."""

    tool: str  # torch | nsys
    nsys: NsysUse | None = None  # the Nsight Systems that runs (tool nsys)
    progress: Progress = field(default_factory=lambda: Progress())

    @property
    def out(self) -> Path:
        return self.paths.profile(self.sc)

    @property
    def raw_dir(self) -> Path:
        """Where vLLM writes torch traces; each is moved to trace_dir under its point's name."""
        return (self.out / "torch-raw").resolve()

    @property
    def trace_dir(self) -> Path:
        return self.out / ("torch" if self.tool == "torch" else "nsys")

    @property
    def nsys_executable(self) -> str:
        """The nsys this capture runs (as the launch runs it), or profile.nsys."""
        return self.nsys.executable if self.nsys is not None else self.exp.profile.nsys

    @property
    def mounts(self) -> tuple[Mount, ...]:
        return (self.nsys.mount,) if self.nsys is not None and self.nsys.mount else ()

    def note(self, msg: str) -> None:
        self.say(f"[{self.sc}] profile: {msg}")

    def prepare(self) -> str:
        """Empty trace folders for this capture; how vLLM's profiler is driven (config |
        env)."""
        for d in (self.raw_dir, self.trace_dir):
            shutil.rmtree(d, ignore_errors=True)
            d.mkdir(parents=True)
        return profiler_interface(self.exp.profile, self.runtime.doc)

    def additions(self, interface: str) -> LaunchAdditions:
        """What the capture adds to the server's launch (servelab.profile.commands)."""
        return profiler_additions(
            self.tool,
            self.paths.profile(self.sc),
            interface=interface,
            nsys=self.nsys_executable,
            max_iterations=self.exp.profile.max_iterations,
            mounts=self.mounts,
        )

    def capture(self) -> dict[str, object]:
        """Serve the profiled server on a launch of its own, capture every point, export the
        trace; the fields of capture.json this job adds."""
        tool = self.tool
        interface = self.prepare()
        nsys = self.nsys_executable
        port = choose_port(self.exp.server.host, self.exp.server.port, self.note)
        launch = profiled_launch(self, interface, port)
        self.launched(interface, launch)
        helper = server_container(
            self.job,
            self.sc,
            purpose="profile-helper",
            writable=(self.out,),
            mounts=self.mounts,
            gpus=False,
        )
        log_path = self.out / SERVER_LOG
        t0 = time.monotonic()
        self.note(
            f"starting vLLM with the {tool} profiler ({interface} interface) on {launch.base_url}"
        )
        try:
            report: NsysReport | None = None
            with serve(launch, log_path, self.exp.server, self.note, fresh_log=True) as session:
                self.progress.update(
                    {
                        "ready_s": round(session.ready_s, 3),
                        "start": dict(session.start or {}),
                        "lock": dict(session.lock),
                    }
                )
                points = CapturePoints(self, session, session.client(self.exp.workload), interface)
                windows, rows, traces = points.run()
                if tool == "nsys":
                    report = self.wait_for_report(session)
            if tool == "nsys":
                report = report or self.report_after_exit(session)
                self.progress["nsys_report"] = report
                traces = export_nsys(self.out / report["path"], self.out, nsys, self.note, helper)
        finally:
            if helper is not None:
                _give_back(helper, self.out, self.note)
        return {
            **self.finish(windows, rows, traces, t0),
            "launch": "own",
            "ready_s": round(session.ready_s, 3),
            "start": dict(session.start or {}),  # as a sweep's launch.json records it
            "lock": dict(session.lock),
            "compile_cache": session.compile_cache,
            "placement": session.placement,
            **({"nsys_report": report} if report is not None else {}),
        }

    def capture_on_sweep(
        self, session: Session, launch: ServerLaunch, interface: str, *, warm: bool
    ) -> dict[str, object]:
        """Capture every point on the sweep's own launch (profile.launch: sweep), after its
        last measured point: the server was started with `additions` and its profiler left
        idle until now. `warm`: the sweep measured points on this launch, which warmed it up,
        so the capture's own warm-up is left out. The fields of capture.json it adds; the
        launch itself (its start, lock, compile cache, placement) is the sweep's launch.json."""
        t0 = time.monotonic()
        self.launched(interface, launch)
        self.note(
            f"the {self.tool} profiler ({interface} interface) on the sweep's launch "
            f"({launch.base_url}), after its last point"
        )
        points = CapturePoints(
            self, session, session.client(self.exp.workload), interface, warm_up=not warm
        )
        windows, rows, traces = points.run()
        return {
            **self.finish(windows, rows, traces, t0),
            "launch": "sweep",
            "warmup": "the sweep's points" if warm else "its own",
        }

    def launched(self, interface: str, launch: ServerLaunch) -> None:
        """How the server was launched, kept in `progress` (capture.json has it, whether the
        capture succeeds or fails)."""
        self.progress.update(
            {
                "interface": interface,
                "command": redact_argv(launch.command()),
                "env": redact_env(launch.env),
            }
        )

    def finish(
        self, windows: list[Window], rows: list[PointRow], traces: list[str], t0: float
    ) -> dict[str, object]:
        """windows.json, and the fields of capture.json every capture has (the launch's as
        `launched` kept them)."""
        shutil.rmtree(self.raw_dir, ignore_errors=True)
        top: dict[str, JsonValue] = {"server_config": self.sc, "tool": self.tool}
        top["client_nvtx_emitted"] = nvtx_available()
        if self.tool == "nsys":
            top["point_gap_s"] = POINT_GAP_S
        WindowsRecord(windows_json(windows, **top)).write(self.paths.windows(self.sc))
        self.note(f"{len(rows)} points captured in {time.monotonic() - t0:.1f} s")
        return {
            "status": "profiled",
            "reason": None,
            **{k: self.progress[k] for k in ("interface", "command", "env")},
            "node": node_facts(),  # the node it ran on, as a sweep's launch.json records it
            "traces": traces,
            "windows": WindowsRecord.FILE,
            "points": rows,
        }

    @property
    def reports(self) -> ReportWait:
        """The nsys report of this capture (servelab.profile.nsys_report)."""
        return ReportWait(self.trace_dir, self.out, self.note)

    def wait_for_report(self, session: Session) -> NsysReport | None:
        """After the capture range ends: wait until nsys has written the report (its
        "Generated:" line in the server log, or the report file settled) or exits, for
        profile.report_timeout_s. A settled file, or none by then: the server is stopped with
        that much more time, so that nsys finishes (or writes) the report at its exit before
        it is exported; None when there was none."""
        server, timeout = session.server, self.exp.profile.report_timeout_s
        t0 = time.monotonic()
        found = self.reports.until_written(server, session.log_offset, timeout)
        if (found is not None and found["found_by"] == "log line") or not server.alive():
            return found
        server.shutdown_timeout_s = self.exp.server.shutdown_timeout_s + timeout
        if found is None:
            self.note(
                f"nsys has not written its report {timeout:g} s after the capture range ended "
                f"(profile.report_timeout_s); stopping the server, with up to "
                f"{server.shutdown_timeout_s:g} s for nsys to write it"
            )
            self.progress["report_wait_s"] = round(time.monotonic() - t0, 3)
        return found

    def report_after_exit(self, session: Session) -> NsysReport:
        """The report once nsys has exited (servelab.profile.nsys_report.ReportWait)."""
        return self.reports.after_exit(
            session.server.log_path, session.log_offset, self.exp.profile.report_timeout_s
        )


@dataclass(frozen=True)
class CapturePoints:
    """The diagnostic points of one profiled server launch."""

    job: CaptureJob
    session: Session
    client: RequestSettings
    interface: str  # config | env: how vLLM's profiler is driven
    warm_up: bool = True  # profile.warmup_requests first (not after a sweep on this launch)

    def run(self) -> tuple[list[Window], list[PointRow], list[str]]:
        """The warm-up, then every profiled concurrency: their windows, capture.json rows and
        (torch) traces."""
        job, p = self.job, self.job.exp.profile
        server = self.session.server
        n = max(max(c * p.waves for c in p.concurrency), p.warmup_requests)
        source = PromptSource.of(job.exp, job.model_dir, job.say)
        prompts = source.build(self.session, n).items
        if p.warmup_requests and self.warm_up:
            wu = run_diagnostic_point(
                self.client, prompts[: p.warmup_requests], max(p.concurrency), "warmup"
            )
            job.note(f"warm-up: {sum(r.ok for r in wu.records)} requests")
        if job.tool == "nsys":
            _profiler_request(server, "/start_profile", {}, 600)
        windows: list[Window] = []
        rows: list[PointRow] = job.progress.setdefault("points", [])
        traces: list[str] = []
        for k, c in enumerate(p.concurrency):
            if k and job.tool == "nsys":
                time.sleep(POINT_GAP_S)  # the GPU idles between two windows of one trace
            window, row, trace = self.point(c, prompts[: c * p.waves])
            windows.append(window)
            rows.append(row)
            if trace is not None:
                traces.append(trace)
        if job.tool == "nsys":
            # cudaProfilerStop: the capture range ends and nsys writes the report
            _profiler_request(server, "/stop_profile", None, 900)
        return windows, rows, traces

    def point(self, c: int, prompts: Sequence[Item]) -> tuple[Window, PointRow, str | None]:
        """One diagnostic point at concurrency c (torch: inside its own profiler range)."""
        job, server = self.job, self.session.server
        label = f"c{c:04d}"
        if job.tool == "torch":
            body = {"profile_prefix": label} if self.interface == "config" else {}
            _profiler_request(server, "/start_profile", body, 600)
        run = run_diagnostic_point(self.client, prompts, c, label)
        if not server.alive_after(run.records):
            raise ServelabError(
                f"[{job.sc}] the profiled server exited during point {label}; last lines of "
                f"{server.log_path}:\n{server.log_tail()}"
            )
        trace: str | None = None
        if job.tool == "torch":
            t_stop = time.monotonic()
            trace = self.torch_trace(label)
            stop_s = time.monotonic() - t_stop
        else:
            stop_s = 0.0
        ok = [r for r in run.records if r.ok]
        tokens = sum(r.output_tokens or 0 for r in ok)
        dur = (run.finished_epoch_ns - run.started_epoch_ns) / 1e9
        window = Window(
            label,
            run.started_epoch_ns,
            run.finished_epoch_ns,
            "epoch",
            tokens,
            {
                "concurrency": c,
                "requests": len(run.records),
                "failed": len(run.records) - len(ok),
            },
        )
        write_jsonl_gz(
            job.out / "requests" / f"{label}.jsonl.gz", (r.to_json() for r in run.records)
        )
        row: PointRow = {
            "label": label,
            "concurrency": c,
            "requests": len(run.records),
            "failed": len(run.records) - len(ok),
            "output_tokens": tokens,
            "duration_s": round(dur, 6),
            "trace_write_s": round(stop_s, 3),
        }
        job.note(
            f"{label}: {len(ok)}/{len(run.records)} requests, {tokens} tokens in "
            f"{dur:.2f} s (trace written in {stop_s:.1f} s)"
        )
        return window, row, trace

    def torch_trace(self, label: str) -> str:
        """Stop the point's torch profiler range and move its trace (and table) under the
        point's name; the trace's path in the profile folder."""
        job, server = self.job, self.session.server
        _profiler_request(server, "/stop_profile", None, 900)
        # older vLLM (env interface) names traces without the point's prefix; each
        # is moved away before the next point starts
        prefix = f"{label}_" if self.interface == "config" else ""
        trace = _wait_for_file(job.raw_dir, f"{prefix}*.pt.trace.json*", 300)
        if trace is None:
            raise ServelabError(
                f"[{job.sc}] no torch trace for {label} in {job.raw_dir} after /stop_profile; "
                f"last lines of {server.log_path}:\n{server.log_tail()}"
            )
        dest = job.trace_dir / f"{label}.pt.trace.json{'.gz' if trace.suffix == '.gz' else ''}"
        shutil.move(str(trace), dest)
        for table in job.raw_dir.glob(f"{prefix}*.profiler_out.txt"):
            shutil.move(str(table), job.trace_dir / f"{label}.profiler_out.txt")
        return dest.relative_to(job.out).as_posix()


def _give_back(helper: ContainerRun, out: Path, say: Say) -> None:
    """docker runs the server as root: hand what it wrote in the profile folder back to this
    user, so that a rerun can replace it (podman and apptainer write as this user already)."""
    if helper.engine != "docker" or os.getuid() == 0:
        return
    path = str(out.resolve())
    cmd = helper.run_command(["chown", "-R", f"{os.getuid()}:{os.getgid()}", path], "", 0)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        say(f"could not hand {path} back to this user ({(proc.stderr or '').strip()[-200:]})")
