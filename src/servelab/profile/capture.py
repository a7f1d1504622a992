"""The profiling pass: its own server launch, a short diagnostic workload per profiled
concurrency, and windows that bridge each point into the trace clock.

GPU (nsys): the server runs under `nsys profile` with a capture range driven by vLLM's
/start_profile and /stop_profile (`--profiler-config {"profiler": "cuda"}`; older vLLM:
VLLM_TORCH_CUDA_PROFILE=1); one range spans the diagnostic points, then `nsys export --type
sqlite`. CPU: vLLM's torch profiler, bounded (no stacks, shapes, memory or flops; a cap on
engine steps; the frontend not profiled), one trace JSON per point. DESIGN.md measured the
unbounded default: a 100 MB trace and an engine stalled for minutes.

Every point records its wall-clock window (the client's clock, bridged to the trace by the
session start) and, when the `nvtx` package is importable, the client also emits one NVTX
start/end range per request: message = the point's label (a registered string), payload = the
request index. A tool that is not there gives an explicit "not profiled: reason" record.
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
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab import config as cfgmod
from servelab.client import PointRun, Workload, run_point
from servelab.container import ENGINES, ContainerRun, container_run_for
from servelab.errors import ServelabError
from servelab.jsonio import write_json, write_jsonl_gz
from servelab.profile.windows import FORMAT_VERSION, Window, windows_json
from servelab.redact import redact_argv, redact_env
from servelab.server import ServerLaunch, choose_port, make_server, raise_on_signals

Say = Callable[[str], None]
TOOLS = ("auto", "torch", "nsys", "none")
NVTX_DOMAIN = "servelab"

NSYS_PROFILE_ARGS = (
    "profile",
    "--trace=cuda,nvtx",
    "--cuda-graph-trace=node",
    "--trace-fork-before-exec=true",
    "--capture-range=cudaProfilerApi",
    "--capture-range-end=repeat",
    "--force-overwrite=true",
)


# --- command lines --------------------------------------------------------------------------


def nsys_profile_command(output: Path, nsys: str = "nsys") -> list[str]:
    """The prefix that runs the server under Nsight Systems (output: report path, no suffix)."""
    return [nsys, *NSYS_PROFILE_ARGS, f"--output={output}"]


def nsys_export_command(report: Path, sqlite: Path, nsys: str = "nsys") -> list[str]:
    return [
        nsys,
        "export",
        "--type=sqlite",
        "--force-overwrite=true",
        f"--output={sqlite}",
        str(report),
    ]


def torch_profiler_config(trace_dir: Path, max_iterations: int) -> dict[str, Any]:
    """vLLM's --profiler-config for a bounded CPU capture (names as in vllm/config/profiler.py)."""
    return {
        "profiler": "torch",
        "torch_profiler_dir": str(trace_dir),
        "torch_profiler_with_stack": False,
        "torch_profiler_record_shapes": False,
        "torch_profiler_with_memory": False,
        "torch_profiler_with_flops": False,
        "torch_profiler_use_gzip": True,
        "ignore_frontend": True,
        "max_iterations": max_iterations,
    }


def vllm_profiler_args(
    tool: str, trace_dir: Path, interface: str, max_iterations: int
) -> tuple[list[str], dict[str, str]]:
    """Server arguments and environment that enable vLLM's profiler endpoints."""
    if tool not in ("torch", "nsys"):
        raise ValueError(tool)
    if interface == "config":
        cfg = (
            torch_profiler_config(trace_dir, max_iterations)
            if tool == "torch"
            else {"profiler": "cuda"}
        )
        return ["--profiler-config", json.dumps(cfg, sort_keys=True)], {}
    if tool == "nsys":
        return [], {"VLLM_TORCH_CUDA_PROFILE": "1"}
    env = {
        "VLLM_TORCH_PROFILER_DIR": str(trace_dir),
        "VLLM_TORCH_PROFILER_WITH_STACK": "0",
        "VLLM_TORCH_PROFILER_RECORD_SHAPES": "0",
        "VLLM_TORCH_PROFILER_WITH_PROFILE_MEMORY": "0",
        "VLLM_TORCH_PROFILER_WITH_FLOPS": "0",
    }
    if max_iterations:
        env["VLLM_PROFILER_MAX_ITERS"] = str(max_iterations)
    return [], env


def vllm_interface(python: str) -> str:
    """'config' when the runtime's vLLM has --profiler-config (vllm/config/profiler.py), else
    'env' (older releases read VLLM_TORCH_* variables). Looked up without importing vLLM."""
    code = (
        "import importlib.util, os; s = importlib.util.find_spec('vllm'); "
        "print(os.path.isfile(os.path.join(list(s.submodule_search_locations)[0], "
        "'config', 'profiler.py')))"
    )
    try:
        out = subprocess.run(
            [python, "-c", code], capture_output=True, text=True, timeout=60, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "config"
    return "env" if out == "False" else "config"


@dataclass
class ProfiledLaunch(ServerLaunch):
    """A server launch with a wrapper in front (nsys profile ...); in a container the wrapper
    runs inside it (ServerLaunch.command)."""


# --- the plan ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    tool: str | None  # torch | nsys | None (not profiled)
    reason: str | None = None
    note: str | None = None


def profiled_configs(cfg: dict[str, Any]) -> list[str]:
    """Server configurations that get a profile job (in server.configs order)."""
    names = [c["name"] for c in cfg["server"]["configs"]]
    wanted = cfg["profile"]["server_configs"]
    if wanted is None:
        return names
    unknown = [n for n in wanted if n not in names]
    if unknown:
        raise ServelabError(
            f"profile.server_configs: {unknown[0]!r} is not in server.configs "
            f"({', '.join(names)}); list names from server.configs, or null for all"
        )
    return [n for n in names if n in wanted]


def plan(
    cfg: dict[str, Any], which: Callable[[str], str | None] = shutil.which
) -> dict[str, Decision]:
    """What each profiled configuration will get; raises before anything starts when
    profiling is required and cannot happen."""
    p = cfg["profile"]
    device = cfg["runtime"]["device"]
    tool = p["tool"]
    # in a container, nsys is the image's (or a mount's): the runtime stage looks for it there
    # (runtime.json "nsys"), and for_runtime() revises this decision
    nsys_found = cfg["runtime"]["kind"] in ENGINES or which(p["nsys"]) is not None
    decision: Decision
    if not p["enabled"]:
        decision = Decision(None, "profile.enabled is false")
    elif tool == "none":
        decision = Decision(None, "profile.tool is none")
    elif tool == "nsys" and device != "gpu":
        decision = Decision(None, "profile.tool nsys needs runtime.device gpu")
    elif tool == "nsys" and not nsys_found:
        decision = Decision(None, f"nsys ({p['nsys']}) not found on PATH")
    elif tool == "auto" and device == "gpu":
        decision = (
            Decision("nsys")
            if nsys_found
            else Decision("torch", note=f"nsys ({p['nsys']}) not found; vLLM's torch profiler used")
        )
    elif tool == "auto":
        decision = Decision("torch")
    else:
        decision = Decision(tool)
    if p["required"] and decision.tool is None and p["enabled"]:
        raise ServelabError(
            f"profile.required is true but {decision.reason}; install Nsight Systems (nsys) "
            "or set profile.required: false"
        )
    return {sc: decision for sc in profiled_configs(cfg)}


def for_runtime(decision: Decision, cfg: dict[str, Any], runtime: dict[str, Any]) -> Decision:
    """The plan's decision, revised by what the runtime stage found in a container image."""
    if runtime.get("kind") != "container" or decision.tool != "nsys" or runtime.get("nsys"):
        return decision
    p = cfg["profile"]
    where = f"{p['nsys']} is not in {runtime.get('image_ref')}"
    if p["tool"] == "auto":
        return Decision("torch", note=f"{where}; vLLM's torch profiler used")
    return Decision(None, f"{where} (see containers/README.md)")


# --- the diagnostic workload ------------------------------------------------------------


def nvtx_available() -> bool:
    return importlib.util.find_spec("nvtx") is not None


class NvtxRanges:
    """One NVTX start/end range per request (domain "servelab", message = point label,
    payload = request index); a no-op when the nvtx package is not importable."""

    def __init__(self, label: str) -> None:
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

    def start(self, index: int) -> Any:
        if not self.active:
            return None
        attrs = self.domain.get_event_attributes(message=self.message, payload=index)
        return self.domain.start_range(attrs)

    def end(self, range_id: Any) -> None:
        if self.active and range_id is not None:
            self.domain.end_range(range_id)


def run_diagnostic_point(
    w: Workload, prompts: Sequence[str], concurrency: int, label: str
) -> PointRun:
    """A closed-loop point with an NVTX range around every request (when nvtx is importable)."""
    return run_point(w, prompts, concurrency, label, marks=NvtxRanges(label))


def _post(base_url: str, path: str, body: dict[str, Any] | None, timeout_s: float) -> None:
    data = json.dumps(body).encode("utf-8") if body is not None else b""
    req = urllib.request.Request(
        f"{base_url}{path}", data=data, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:300].decode("utf-8", "replace").replace("\n", " ")
        raise ServelabError(
            f"POST {path} answered HTTP {exc.code}: {detail}; is the profiler enabled on the "
            "server (--profiler-config)?"
        ) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        raise ServelabError(f"POST {path} failed: {exc}") from None


def _wait_for_file(folder: Path, pattern: str, timeout_s: float) -> Path | None:
    """A file the profiler writes after /stop_profile (torch trace, nsys report), once its
    size stops changing."""
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


def profile_dir(exp_dir: Path, sc: str) -> Path:
    return exp_dir / "profile" / sc


def run_profile(
    cfg: dict[str, Any],
    sc: str,
    model_dir: Path,
    runtime: dict[str, Any],
    exp_dir: Path,
    say: Say = print,
    which: Callable[[str], str | None] = shutil.which,
) -> dict[str, Any]:
    """Capture one server configuration; writes capture.json last (the job's output)."""
    t_job = time.monotonic()
    out = profile_dir(exp_dir, sc)
    out.mkdir(parents=True, exist_ok=True)
    decision = for_runtime(plan(cfg, which)[sc], cfg, runtime)
    record: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "server_config": sc,
        "tool": decision.tool,
        "note": decision.note,
    }
    if decision.tool is None:
        say(f"[{sc}] not profiled: {decision.reason}")
        record.update(status="not profiled", reason=decision.reason, traces=[], points=[])
        write_json(out / "capture.json", record)
        return record
    raise_on_signals()
    record.update(_capture(cfg, sc, decision.tool, model_dir, runtime, out, say, which))
    record["job_wall_s"] = round(time.monotonic() - t_job, 3)
    write_json(out / "capture.json", record)
    return record


def build_launch(
    cfg: dict[str, Any],
    sc: str,
    tool: str,
    model_dir: Path,
    runtime: dict[str, Any],
    out: Path,
    interface: str,
    nsys: str,
    port: int,
) -> ProfiledLaunch:
    """The profiled server's command line and environment (tested without a GPU)."""
    raw_dir = (out / "torch-raw").resolve()
    prof_args, prof_env = vllm_profiler_args(
        tool, raw_dir, interface, cfg["profile"]["max_iterations"]
    )
    wrapper = (
        nsys_profile_command((out / "nsys" / "profile").resolve(), nsys) if tool == "nsys" else []
    )
    # in a container: the profile folder is mounted at its own path (traces are written there)
    container = container_run_for(
        cfg,
        runtime,
        str(model_dir.resolve()),
        sc,
        "profile",
        str(out.resolve().parents[1]),
        writable=[str(out.resolve())],
        cuda_visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
    )
    return ProfiledLaunch(
        python=runtime["python"],
        model_path=str(model_dir.resolve()),
        served_name=cfg["model"]["served_name"],
        host=cfg["server"]["host"],
        port=port,
        args=cfgmod.args_to_cli(cfgmod.server_args(cfg, sc)) + prof_args,
        env={"HF_HUB_OFFLINE": "1", **cfg["runtime"]["env"], **prof_env},
        wrapper=wrapper,
        container=container,
    )


def _capture(
    cfg: dict[str, Any],
    sc: str,
    tool: str,
    model_dir: Path,
    runtime: dict[str, Any],
    out: Path,
    say: Say,
    which: Callable[[str], str | None],
) -> dict[str, Any]:
    from servelab.sweep import build_prompts, vocab_ids

    p = cfg["profile"]
    scfg = cfg["server"]
    wl = cfg["workload"]
    say_sc: Say = lambda msg: say(f"[{sc}] profile: {msg}")  # noqa: E731
    raw_dir = (out / "torch-raw").resolve()
    trace_dir = out / ("torch" if tool == "torch" else "nsys")
    for d in (raw_dir, trace_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    in_container = runtime.get("kind") == "container"
    if p["vllm_interface"] != "auto":
        interface = p["vllm_interface"]
    elif in_container:  # the runtime stage looked inside the image
        interface = "env" if runtime.get("profiler_config") is False else "config"
    else:
        interface = vllm_interface(runtime["python"])
    nsys = (
        str(runtime.get("nsys") or p["nsys"])
        if in_container
        else str(which(p["nsys"]) or p["nsys"])
    )
    port = choose_port(scfg["host"], scfg["port"], say_sc)
    launch = build_launch(cfg, sc, tool, model_dir, runtime, out, interface, nsys, port)
    log_path = out / "server.log"
    log_path.unlink(missing_ok=True)
    windows: list[Window] = []
    points: list[dict[str, Any]] = []
    traces: list[str] = []
    t0 = time.monotonic()
    say_sc(f"starting vLLM with the {tool} profiler ({interface} interface) on {launch.base_url}")
    with make_server(launch, log_path, scfg["shutdown_timeout_s"]) as server:
        ready_s = server.wait_ready(scfg["startup_timeout_s"], say_sc)
        say_sc(f"server ready in {ready_s:.1f} s")
        placement = server.lower_engine_priority(scfg["engine_nice"], say_sc)
        workload = Workload(
            base_url=launch.base_url,
            model=launch.served_name,
            max_tokens=wl["output_tokens"],
            ignore_eos=wl["ignore_eos"],
            request_timeout_s=wl["request_timeout_s"],
        )
        n = max(max(c * p["waves"] for c in p["concurrency"]), p["warmup_requests"])
        prompts = build_prompts(server, launch.served_name, wl, n, vocab_ids(model_dir))
        if p["warmup_requests"]:
            wu = run_diagnostic_point(
                workload, prompts[: p["warmup_requests"]], max(p["concurrency"]), "warmup"
            )
            say_sc(f"warm-up: {sum(r.ok for r in wu.records)} requests")
        if tool == "nsys":
            _post(launch.base_url, "/start_profile", {}, 600)
        for c in p["concurrency"]:
            label = f"c{c:04d}"
            if tool == "torch":
                body = {"profile_prefix": label} if interface == "config" else {}
                _post(launch.base_url, "/start_profile", body, 600)
            run = run_diagnostic_point(workload, prompts[: c * p["waves"]], c, label)
            if not server.alive_after(run.records):
                raise ServelabError(
                    f"[{sc}] the profiled server exited during point {label}; last lines of "
                    f"{log_path}:\n{server.log_tail()}"
                )
            if tool == "torch":
                t_stop = time.monotonic()
                _post(launch.base_url, "/stop_profile", None, 900)
                # older vLLM (env interface) names traces without the point's prefix; each
                # is moved away before the next point starts
                prefix = f"{label}_" if interface == "config" else ""
                trace = _wait_for_file(raw_dir, f"{prefix}*.pt.trace.json*", 300)
                if trace is None:
                    raise ServelabError(
                        f"[{sc}] no torch trace for {label} in {raw_dir} after /stop_profile; "
                        f"last lines of {log_path}:\n{server.log_tail()}"
                    )
                dest = trace_dir / f"{label}.pt.trace.json{'.gz' if trace.suffix == '.gz' else ''}"
                shutil.move(str(trace), dest)
                traces.append(dest.relative_to(out).as_posix())
                for table in raw_dir.glob(f"{prefix}*.profiler_out.txt"):
                    shutil.move(str(table), trace_dir / f"{label}.profiler_out.txt")
                stop_s = time.monotonic() - t_stop
            else:
                stop_s = 0.0
            ok = [r for r in run.records if r.ok]
            tokens = sum(r.output_tokens or 0 for r in ok)
            dur = (run.finished_epoch_ns - run.started_epoch_ns) / 1e9
            windows.append(
                Window(
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
            )
            write_jsonl_gz(
                out / "requests" / f"{label}.jsonl.gz", (r.to_json() for r in run.records)
            )
            points.append(
                {
                    "label": label,
                    "concurrency": c,
                    "requests": len(run.records),
                    "failed": len(run.records) - len(ok),
                    "output_tokens": tokens,
                    "duration_s": round(dur, 6),
                    "trace_write_s": round(stop_s, 3),
                }
            )
            say_sc(
                f"{label}: {len(ok)}/{len(run.records)} requests, {tokens} tokens in "
                f"{dur:.2f} s (trace written in {stop_s:.1f} s)"
            )
        if tool == "nsys":
            _post(launch.base_url, "/stop_profile", None, 900)
            # the range's report is written while the server runs on: wait for it before
            # stopping the server, so a slow finalization is not cut by the shutdown
            if _wait_for_file(trace_dir, "*.nsys-rep", 900) is None:
                say_sc("no nsys report yet after /stop_profile; stopping the server")
        command = redact_argv(launch.command())
    helper = _helper_container(cfg, sc, runtime, model_dir, out)
    if tool == "nsys":
        traces = _export_nsys(trace_dir, out, nsys, say_sc, helper)
    if helper is not None:
        _give_back(helper, out, say_sc)
    shutil.rmtree(raw_dir, ignore_errors=True)
    write_json(
        out / "windows.json",
        windows_json(windows, server_config=sc, tool=tool, nvtx=nvtx_available()),
    )
    say_sc(f"{len(points)} points captured in {time.monotonic() - t0:.1f} s")
    return {
        "status": "profiled",
        "reason": None,
        "interface": interface,
        "command": command,
        "env": redact_env(launch.env),
        "ready_s": round(ready_s, 3),
        "placement": placement,
        "traces": traces,
        "windows": "windows.json",
        "points": points,
    }


def _helper_container(
    cfg: dict[str, Any], sc: str, runtime: dict[str, Any], model_dir: Path, out: Path
) -> ContainerRun | None:
    """The image, without GPUs, for work on the profile folder (nsys export, ownership)."""
    return container_run_for(
        cfg,
        runtime,
        str(model_dir.resolve()),
        sc,
        "profile-helper",
        str(out.resolve().parents[1]),
        writable=[str(out.resolve())],
        gpus=False,
    )


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


def _export_nsys(
    trace_dir: Path, out: Path, nsys: str, say: Say, helper: ContainerRun | None = None
) -> list[str]:
    reports = sorted(trace_dir.glob("*.nsys-rep"), key=lambda p: (p.stat().st_size, p.name))
    if not reports:
        raise ServelabError(f"nsys wrote no report in {trace_dir}; see {out / 'server.log'}")
    report = reports[-1]  # one capture range spans every point: the largest report is it
    sqlite = report.with_suffix(".sqlite")
    cmd = nsys_export_command(report.resolve(), sqlite.resolve(), nsys)
    if helper is not None:  # the image's nsys (the host may have none)
        cmd = helper.run_command(cmd, "", 0)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ServelabError(
            f"{' '.join(cmd)} failed with code {proc.returncode}: "
            f"{(proc.stderr or proc.stdout)[-500:]}"
        )
    say(f"exported {report.name} to {sqlite.name}")
    return [report.relative_to(out).as_posix(), sqlite.relative_to(out).as_posix()]
