"""vLLM server lifecycle: launch, readiness, capacity facts from the log, shutdown.

The server runs in its own process group (its own session) so that stopping it reaches every
process vLLM spawns. It also gets PR_SET_PDEATHSIG, so it dies with the job even when the job is
killed with SIGKILL and has no chance to clean up.

In a container (docker, podman) the server is not a child of the job: `docker run` is, and the
container lives in the engine. Stopping therefore stops the container by name (`docker stop`,
then `docker rm --force`), and every start first removes a container of the same name, which
only a job killed outright (SIGKILL) can leave behind. apptainer runs the server as a child, so
the process group covers it.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from servelab.compilecache import CompileCache
from servelab.container import ContainerRun, server_inner_command, vllm_server_command
from servelab.errors import ServelabError

if TYPE_CHECKING:
    from servelab.client import RequestRecord

LOG_TAIL_LINES = 25


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def choose_port(host: str, wanted: int, say: Callable[[str], None] = print) -> int:
    """The configured port when it is free; otherwise (or for 0) a free one."""
    if wanted and port_is_free(host, wanted):
        return wanted
    port = free_port(host)
    if wanted:
        say(f"server: port {wanted} on {host} is taken; using {port} instead")
    return port


# --- capacity facts from the startup log -------------------------------------------------

_NUM = r"([\d,]+(?:\.\d+)?)"
_KV_RE = re.compile(r"\b(CPU|GPU|XPU|TPU)?\s*KV cache size:\s*" + _NUM + r"\s*tokens", re.I)
_MAXCONC_RE = re.compile(
    r"Maximum concurrency for\s*" + _NUM + r"\s*tokens per request:\s*" + _NUM + r"\s*x", re.I
)
_NONDEFAULT_RE = re.compile(r"non-default args:\s*(\{.*\})")
_VERSION_RE = re.compile(r"(?:vLLM API server version|version)\s+v?(\d+\.\d+\.\d+\S*)")
# The CUDA graph capture sizes the engine used. vLLM prints its whole configuration when the
# engine starts ("Initializing a V1 LLM engine (vX) with config: ... compilation_config=...");
# the compilation config is JSON in 0.6-0.10 (`"cudagraph_capture_sizes":[256,248,...,1]`,
# largest first) and a Python dict in later versions (`'cudagraph_capture_sizes': [1, 2, 4]`,
# `'cudagraph_mode': <CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>`). A server started with
# --cudagraph-metrics prints `- Capture sizes: [1, 2, 4]` with its statistics; a later warning
# "Capping cudagraph capture sizes from max 512 to 352" drops the sizes above the cap.
_COMPILATION_RE = re.compile(r"compilation_config=\{")
_CAPTURE_SIZES_RE = re.compile(
    r"""['"]cudagraph_capture_sizes['"]\s*:\s*(\[[\d,\s]*\]|None|null)"""
)
_CUDAGRAPH_MODE_RE = re.compile(
    r"""['"]cudagraph_mode['"]\s*:\s*(?:<CUDAGraphMode\.(\w+)|['"](\w+)['"])"""
)
_METRICS_SIZES_RE = re.compile(r"- Capture sizes:\s*(\[[\d,\s]*\])")
_METRICS_MODE_RE = re.compile(r"- Mode:\s*(\w+)")
_CAPPING_RE = re.compile(r"Capping cudagraph capture sizes from max (\d+) to (\d+)")
# "...is not supported with spec-decode for attention backend ...; setting cudagraph_mode=PIECEWISE"
_MODE_SET_RE = re.compile(r"setting cudagraph_mode=(\w+)")


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def _args_dict(text: str) -> dict[str, Any] | None:
    """vLLM's `non-default args: {...}` as a dict: each literal value as it is, a value that is
    not a literal (the repr of a config object, e.g. `ProfilerConfig(profiler='torch', ...)`
    for --profiler-config) as its text; None when the text is not a dict with literal keys."""
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    if not isinstance(node, ast.Dict):
        return None
    out: dict[str, Any] = {}
    for k, v in zip(node.keys, node.values, strict=True):
        try:
            key = ast.literal_eval(k) if k is not None else None
        except ValueError:
            return None
        if key is None:
            return None
        try:
            value: Any = ast.literal_eval(v)
        except ValueError:
            value = ast.get_source_segment(text, v)
        out[str(key)] = _jsonable(value)
    return out


def parse_capacity(log_text: str) -> dict[str, Any]:
    """Facts the server prints about itself at startup. Absent facts are None, never guessed.

    Handles the CPU form ("CPU KV cache size: N tokens, Maximum concurrency for L tokens per
    request: Xx" on one line) and the GPU form, which some versions print on two lines.
    """
    facts: dict[str, Any] = {
        "kv_cache_tokens": None,
        "kv_cache_device": None,
        "max_concurrency": None,
        "max_concurrency_tokens_per_request": None,
        "non_default_args": None,
        "version": None,
    }
    for m in _KV_RE.finditer(log_text):
        facts["kv_cache_tokens"] = int(_num(m.group(2)))
        facts["kv_cache_device"] = (m.group(1) or "").upper() or None
    for m in _MAXCONC_RE.finditer(log_text):
        facts["max_concurrency_tokens_per_request"] = int(_num(m.group(1)))
        facts["max_concurrency"] = _num(m.group(2))
    for m in _NONDEFAULT_RE.finditer(log_text):
        args = _args_dict(m.group(1))
        if args is not None:
            facts["non_default_args"] = args
    for m in _VERSION_RE.finditer(log_text):
        facts["version"] = m.group(1)
        break
    facts.update(parse_capture_sizes(log_text, facts["non_default_args"]))
    return facts


def _size_list(text: str) -> list[int] | None:
    if text in ("None", "null"):
        return None
    return sorted({int(x) for x in re.findall(r"\d+", text)})


def parse_capture_sizes(
    log_text: str, non_default_args: Mapping[str, Any] | None
) -> dict[str, Any]:
    """The CUDA graph capture sizes the engine used, ascending (`cudagraph_capture_sizes`;
    [] when it captured none, None when the log does not say), where they were read
    (`cudagraph_capture_sizes_source`: `compilation_config` from the engine's configuration,
    `cudagraph_metrics`, or `non_default_args`: only what was asked for), the cap a later
    warning applied (`cudagraph_capture_sizes_capped_to`) and `cudagraph_mode` (NONE,
    PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE, as a later warning left it; None
    when not printed)."""
    sizes: list[int] | None = None
    source: str | None = None
    mode: str | None = None
    for line in log_text.splitlines():
        start = _COMPILATION_RE.search(line)
        if start is None:
            continue
        rest = line[start.end() :]
        m = _CAPTURE_SIZES_RE.search(rest)
        if m is not None:
            sizes, source = _size_list(m.group(1)), "compilation_config"
        mm = _CUDAGRAPH_MODE_RE.search(rest)
        if mm is not None:
            mode = mm.group(1) or mm.group(2)
    if source is None:
        for m in _METRICS_SIZES_RE.finditer(log_text):
            sizes, source = _size_list(m.group(1)), "cudagraph_metrics"
        for m in _METRICS_MODE_RE.finditer(log_text):
            mode = mode or m.group(1)
    if source is None and non_default_args:
        asked = non_default_args.get("cudagraph_capture_sizes")
        cc = non_default_args.get("compilation_config")
        if asked is None and isinstance(cc, Mapping):
            asked = cc.get("cudagraph_capture_sizes")
        if isinstance(asked, list) and all(isinstance(x, int) for x in asked):
            sizes, source = sorted(set(asked)), "non_default_args"
    for m in _MODE_SET_RE.finditer(log_text):
        mode = m.group(1)
    capped: int | None = None
    for m in _CAPPING_RE.finditer(log_text):
        capped = int(m.group(2))
    if capped is not None and sizes is not None:
        sizes = [x for x in sizes if x <= capped]
    return {
        "cudagraph_capture_sizes": sizes,
        "cudagraph_capture_sizes_source": source,
        "cudagraph_capture_sizes_capped_to": capped,
        "cudagraph_mode": mode,
    }


def _jsonable(v: Any) -> Any:
    try:
        json.dumps(v)
        return v
    except TypeError:
        return repr(v)


# --- where a start goes: its phases, from the log ----------------------------------------

# A line in vLLM's log format: `(APIServer pid=1) INFO 12-02 07:52:14 [file.py:12] ...`, the
# process prefix only in V1. Its time has one-second resolution and no year.
_LOG_TIME_RE = re.compile(r"\b(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d-\d\d \d\d:\d\d:\d\d)\b")


@dataclass(frozen=True)
class StartPhase:
    """A phase of a server start: it begins at the first log line that matches `starts` (at
    the process start for the first) and lasts until the next phase begins."""

    name: str
    what: str  # what happens in it (docs/raw-data.md)
    starts: re.Pattern[str] | None


# In the order vLLM's V1 engine goes through them; the patterns are the lines of vLLM 0.8 to
# 0.32, CPU and GPU (vllm/v1/engine/core.py, vllm/v1/worker/gpu_model_runner.py,
# vllm/compilation/), the earliest matching line of a phase marking its start.
START_PHASES: tuple[StartPhase, ...] = (
    StartPhase("import", "Python starts and imports vLLM", None),
    StartPhase(
        "config",
        "vLLM's first log line (the API server's banner) until the model's configuration is "
        "resolved",
        _LOG_TIME_RE,
    ),
    StartPhase(
        "engine",
        "the engine configuration is completed and the engine core process starts",
        re.compile(r"Resolved architecture"),
    ),
    StartPhase(
        "workers",
        "the engine core starts its workers (processes, distributed init)",
        re.compile(r"Initializing a V\d LLM engine"),
    ),
    StartPhase("load", "the weights load", re.compile(r"Starting to load model")),
    StartPhase(
        "compile",
        "torch.compile (on a GPU within the profiling run that follows the load)",
        re.compile(
            r"Warming up model for the compilation|Model loading took|"
            r"Using cache directory: .* for vLLM's torch\.compile|Dynamo bytecode transform time"
        ),
    ),
    StartPhase(
        "kv",
        "memory profiling and the KV cache's allocation",
        re.compile(
            r"torch\.compile (?:takes|took|and initial profiling run took) [\d.]+ s in total|"
            r"Initial profiling/warmup run took|Warming up done|Available KV cache memory"
        ),
    ),
    StartPhase(
        "warmup",
        "CUDA graph capture (GPU) and the engine's warm-up",
        re.compile(r"KV cache size:"),
    ),
    StartPhase(
        "api",
        "the API server sets up serving (tokenizer, chat template, routes)",
        re.compile(r"init engine (?:\(profile, create kv cache, warmup model\) )?took"),
    ),
    StartPhase(
        "http",
        "the HTTP server starts until /health answered (within one poll, 0.5 s)",
        re.compile(r"Starting vLLM (?:API )?server (?:\d+ )?on"),
    ),
)
PHASE_NAMES = tuple(p.name for p in START_PHASES)

# The compile cache's outcome: a load that failed and compiled again, a hit, or a miss.
_CACHE_FAILED_RE = re.compile(
    r"Compiling model again due to a load failure from .*?, reason: (.*)$"
)
_CACHE_HIT_RE = re.compile(
    r"Directly load (?:the compiled graph|AOT compilation)|Directly lookup the graph"
)
_CACHE_MISS_RE = re.compile(
    r"saved AOT compiled function|Compiling a graph for|Cache the graph (?:of|for)"
)
# Durations vLLM reports itself (its own clock).
_REPORTED_RES: dict[str, re.Pattern[str]] = {
    "load_weights": re.compile(r"Loading weights took ([\d.]+) ?s"),
    "model_loading": re.compile(r"Model loading took .*? and ([\d.]+) ?s"),
    "compile": re.compile(
        r"torch\.compile (?:takes|took|and initial profiling run took) ([\d.]+) s in total"
    ),
    "cudagraph_capture": re.compile(r"Graph capturing finished in ([\d.]+) secs?"),
    "init_engine": re.compile(
        r"init engine (?:\(profile, create kv cache, warmup model\) )?took ([\d.]+) ?s"
    ),
}


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def start_phases(lines: Iterable[tuple[float, str]], ready_t_s: float | None) -> dict[str, Any]:
    """Where a server start went, from its log lines, each with the seconds since the process
    started at which servelab first saw it (`t_s`; lines are read while /health is polled, so
    to within one poll).

    `phases`: every phase of START_PHASES in order, with `t_s` (when its first line was seen;
    0 for `import`), `log_time` (that line's own `MM-DD HH:MM:SS`, when it has one) and
    `duration_s` (until the next phase that was seen, the last until `ready_t_s`, when /health
    first answered 200). A phase whose line never appeared has nulls: its time counts in the
    phase before it. Never raises on a log it does not know. `compile_cache`: `hit`, `miss`,
    `load_failed` (a cached graph failed to load and the model was compiled again;
    `compile_cache_reason` says why) or null (no compilation line, e.g. enforce-eager).
    `vllm_reported_s`: durations vLLM logs itself (null where it does not)."""
    seen = list(lines)
    found: list[tuple[float, str | None] | None] = [(0.0, None)]
    cursor = 0
    for phase in START_PHASES[1:]:
        assert phase.starts is not None
        hit = None
        for i in range(cursor, len(seen)):
            if phase.starts.search(seen[i][1]):
                hit = i
                break
        if hit is None:
            found.append(None)
            continue
        cursor = hit
        m = _LOG_TIME_RE.search(seen[hit][1])
        found.append((seen[hit][0], m.group(1) if m else None))
    phases: list[dict[str, Any]] = []
    for k, (phase, at) in enumerate(zip(START_PHASES, found, strict=True)):
        if at is None:
            phases.append({"phase": phase.name, "t_s": None, "log_time": None, "duration_s": None})
            continue
        later = [f[0] for f in found[k + 1 :] if f is not None]
        end = later[0] if later else ready_t_s
        phases.append(
            {
                "phase": phase.name,
                "t_s": _rounded(at[0]),
                "log_time": at[1],
                "duration_s": _rounded(None if end is None else max(0.0, end - at[0])),
            }
        )
    text = [line for _, line in seen]
    cache: str | None = None
    reason: str | None = None
    if any(_CACHE_MISS_RE.search(line) for line in text):
        cache = "miss"
    if any(_CACHE_HIT_RE.search(line) for line in text):
        cache = "hit"
    for line in text:
        m = _CACHE_FAILED_RE.search(line)
        if m is not None:
            cache, reason = "load_failed", m.group(1).strip()
            break
    reported: dict[str, float | None] = {}
    for name, rx in _REPORTED_RES.items():
        reported[name] = next(
            (float(m.group(1)) for line in text if (m := rx.search(line)) is not None), None
        )
    return {
        "phases": phases,
        "ready_t_s": _rounded(ready_t_s),
        "compile_cache": cache,
        "compile_cache_reason": reason,
        "vllm_reported_s": reported,
    }


def start_line(start: Mapping[str, Any]) -> str:
    """One line for a start record: `start 44.1 s: import 7.0, config 7.2, ..., compile 22.0
    (cache miss), ...`; the phases that were not seen are left out."""
    ready = start.get("ready_t_s")
    parts = []
    for p in start.get("phases") or []:
        if p.get("duration_s") is None:
            continue
        text = f"{p['phase']} {p['duration_s']:.1f}"
        if p["phase"] == "compile" and start.get("compile_cache"):
            text += f" (cache {str(start['compile_cache']).replace('_', ' ')})"
        parts.append(text)
    head = f"start {ready:.1f} s" if isinstance(ready, int | float) else "start (not ready)"
    return head + (": " + ", ".join(parts) if parts else "")


class StartWatch:
    """What a starting server adds to its log, line by line, each line with the seconds since
    the process started (`t0`, monotonic) at which `poll` first read it whole."""

    def __init__(self, log_path: Path, offset: int, t0: float) -> None:
        self.log_path = log_path
        self.offset = offset
        self.t0 = t0
        self.lines: list[tuple[float, str]] = []
        self._partial = b""

    def poll(self, final: bool = False) -> None:
        t = time.monotonic() - self.t0
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return
        self.offset += len(data)
        data = self._partial + data
        # a line ends at a newline, or at a carriage return (progress bars redraw with it)
        cut = len(data) if final else max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        whole, self._partial = data[:cut], data[cut:]
        for line in whole.decode("utf-8", errors="replace").splitlines():
            if line:
                self.lines.append((t, line))

    def phase_at(self, ready_t_s: float | None = None) -> str | None:
        """The last phase begun so far."""
        reached = [
            p["phase"]
            for p in start_phases(self.lines, ready_t_s)["phases"]
            if p["t_s"] is not None
        ]
        return reached[-1] if reached else None


# --- the process --------------------------------------------------------------------------


def raise_on_signals() -> None:
    """SIGTERM and SIGHUP (snakemake stopping a job) unwind like Ctrl-C, so every `finally`
    runs and the server is stopped."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
    # A job started from a non-interactive shell in the background inherits SIGINT ignored;
    # Ctrl-C, or `kill -INT`, must still stop it cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)


# vLLM's engine processes, by the names it gives them (setproctitle): the engine core, which
# schedules and waits on its workers, and the workers, which run the model.
ENGINE_PROCESS_NAMES = ("VLLM::EngineCore", "EngineCore", "VLLM::Worker", "VllmWorker")

# A point with failed requests waits this long to tell a server that died from one that failed
# some requests and is still up.
EXIT_GRACE_S = 2.0

_PR_SET_PDEATHSIG = 1


def _child_setup() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class ServerLaunch:
    """One server's command line. `wrapper` (nsys profile ...) goes in front of the server;
    in a container it runs inside, in front of the server, where the GPU work happens. `cli`:
    start it as `vllm serve MODEL` (python -m vllm.entrypoints.cli.main serve), which the
    runtime stage found in the runtime's vLLM (runtime.json "vllm_cli"); else as the older
    `python -m vllm.entrypoints.openai.api_server --model MODEL`."""

    python: str
    model_path: str
    served_name: str
    host: str
    port: int
    args: list[str]
    env: Mapping[str, str] = field(default_factory=dict)
    wrapper: list[str] = field(default_factory=list)
    container: ContainerRun | None = None
    cli: bool = False
    # the runtime's compile-cache folder (servelab.compilecache; runtime.compile_cache), whose
    # variables are in env and, in a container, whose folder is mounted
    compile_cache: CompileCache | None = None

    def process_env(self) -> dict[str, str]:
        """Variables set for the launched process (docker, podman: passed on by name;
        apptainer: as APPTAINERENV_*), on top of the job's own environment."""
        env = {**self.env, "PYTHONUNBUFFERED": "1"}
        return self.container.process_env(env) if self.container else env

    def command(self) -> list[str]:
        if self.container is not None:
            c = replace(self.container, env_names=tuple(sorted({*self.env, "PYTHONUNBUFFERED"})))
            # published port: vLLM listens on every interface of the container's own network
            bind = "0.0.0.0" if c.engine != "apptainer" and c.network == "publish" else self.host
            inner = server_inner_command(
                self.served_name, bind, self.port, self.args, self.wrapper, cli=self.cli
            )
            return c.run_command(inner, self.host, self.port)
        return [
            *self.wrapper,
            *vllm_server_command(self.python, self.model_path, cli=self.cli),
            "--served-model-name",
            self.served_name,
            "--host",
            self.host,
            "--port",
            str(self.port),
            *self.args,
        ]

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


class Server:
    """A running server; use as a context manager so it is always stopped."""

    def __init__(self, launch: ServerLaunch, log_path: Path, shutdown_timeout_s: float):
        self.launch = launch
        self.log_path = log_path
        self.shutdown_timeout_s = shutdown_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_epoch_ns = 0
        self.started_monotonic = 0.0
        self.ready_t_s: float | None = None  # seconds from the start until /health said 200
        self.watch: StartWatch | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.launch.process_env()}
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed in stop()
        self._log = log
        self.started_epoch_ns = time.time_ns()
        self.started_monotonic = time.monotonic()
        self.ready_t_s = None
        self.watch = StartWatch(
            self.log_path, os.fstat(log.fileno()).st_size, self.started_monotonic
        )
        self.proc = subprocess.Popen(
            self.launch.command(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_child_setup,
        )

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def telemetry_pid(self) -> int | None:
        """The root of the process tree whose CPU and memory telemetry samples."""
        return self.pid

    def alive(self, grace_s: float = 0.0) -> bool:
        """Whether the server process is running. With grace_s, wait that long for it to exit
        first: a killed server's sockets close before its exit can be reaped, so a client that
        just saw its connections fail may otherwise still find it "alive"."""
        if self.proc is None:
            return False
        if grace_s > 0:
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                return True
        return self.proc.poll() is None

    def alive_after(self, records: Iterable[RequestRecord]) -> bool:
        """Whether the server survived a point: when some of its requests failed, wait up to
        EXIT_GRACE_S for an exit, to tell a server that died from one that failed requests."""
        return self.alive(EXIT_GRACE_S if any(not r.ok for r in records) else 0.0)

    def lower_engine_priority(
        self, nice: int, say: Callable[[str], None] = print
    ) -> dict[str, Any]:
        """Give vLLM's engine processes (its engine core and workers, ENGINE_PROCESS_NAMES)
        the niceness `nice`, every thread of them, so that on a host with few cores the API
        server gets the CPU when it needs it: starved, it holds back a request's tokens and
        sends them in one burst (docs/analysis.md, the `streaming` check). The engine core
        waits on its workers by polling, so it is lowered with them: lowering the workers alone
        lets the poller take their core. What was done is returned for launch.json; 0 changes
        nothing."""
        record: dict[str, Any] = {"engine_nice": nice, "engine_pids": []}
        if nice == 0 or self.pid is None:
            return record
        import psutil

        try:
            tree = psutil.Process(self.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        for proc in tree:
            with contextlib.suppress(psutil.Error, OSError):
                name = proc.name()  # the kernel keeps 15 characters of a process name
                if not any(w in name or name == w[:15] for w in ENGINE_PROCESS_NAMES):
                    continue
                for tid in os.listdir(f"/proc/{proc.pid}/task"):
                    with contextlib.suppress(OSError):
                        os.setpriority(os.PRIO_PROCESS, int(tid), nice)
                record["engine_pids"].append(proc.pid)
        if not record["engine_pids"]:
            say(
                f"server: no vLLM engine process ({', '.join(ENGINE_PROCESS_NAMES)}) under "
                f"pid {self.pid}; server.engine_nice {nice} not applied"
            )
        return record

    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        try:
            lines = self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            return "(no server log)"
        return "\n".join(lines[-n:])

    def wait_ready(self, timeout_s: float, say: Callable[[str], None] = print) -> float:
        """Poll /health until it answers 200; return seconds waited. Meanwhile read what the
        server logs (`watch`), for its start's phases (`start_record`)."""
        t0 = time.monotonic()
        last_note = t0
        url = f"{self.launch.base_url}/health"
        watch = self.watch
        while True:
            if watch is not None:
                watch.poll()
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                raise ServelabError(
                    f"server exited with code {code} before it was ready{self._phase_note()}; "
                    f"last lines of {self.log_path}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(url, timeout=2) as resp:
                    if resp.status == 200:
                        ready = time.monotonic()
                        self.ready_t_s = ready - self.started_monotonic
                        if watch is not None:
                            watch.poll(final=True)
                        return ready - t0
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            now = time.monotonic()
            if now - t0 > timeout_s:
                self.stop()
                raise ServelabError(
                    f"server not ready after {timeout_s:g} s (server.startup_timeout_s)"
                    f"{self._phase_note()}; last lines of {self.log_path}:\n{self.log_tail()}"
                )
            if now - last_note >= 15:
                say(f"server: waiting for {url} ({now - t0:.0f} s{self._phase_note(', ')})")
                last_note = now
            time.sleep(0.5)

    def _phase_note(self, sep: str = " ") -> str:
        """`in its <phase> phase`, the last phase of its start begun (START_PHASES)."""
        phase = self.watch.phase_at() if self.watch is not None else None
        return f"{sep}in its {phase} phase" if phase else ""

    def start_record(self) -> dict[str, Any]:
        """Where this start went (`start_phases`); launch.json's `start`."""
        return start_phases(self.watch.lines if self.watch else [], self.ready_t_s)

    def get_json(self, path: str, timeout_s: float = 10.0) -> Any:
        with urllib.request.urlopen(f"{self.launch.base_url}{path}", timeout=timeout_s) as resp:
            return json.loads(resp.read())

    def post_json(self, path: str, body: Mapping[str, Any] | None, timeout_s: float = 30.0) -> Any:
        """POST a JSON body (None: an empty one) and return the decoded answer (None when the
        answer is empty, as vLLM's /start_profile and /stop_profile give)."""
        req = urllib.request.Request(
            f"{self.launch.base_url}{path}",
            data=json.dumps(body).encode("utf-8") if body is not None else b"",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            data = resp.read()
        return json.loads(data) if data else None

    def stop(self) -> int | None:
        """SIGTERM to the whole process group, then SIGKILL after the timeout. Idempotent."""
        if self.proc is None:
            return None
        pgid = self.proc.pid
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=self.shutdown_timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)
                self.proc.wait()
        # Children that outlived the leader still belong to the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self._log.close()
        return self.proc.returncode

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


Runner = Callable[..., "subprocess.CompletedProcess[str]"]


class ContainerServer(Server):
    """A server in a docker or podman container (apptainer needs nothing more than Server):
    a stale container of the same name is removed before the start, and stopping stops the
    container itself, not only the `docker run` client."""

    def __init__(
        self,
        launch: ServerLaunch,
        log_path: Path,
        shutdown_timeout_s: float,
        run: Runner = subprocess.run,
    ) -> None:
        super().__init__(launch, log_path, shutdown_timeout_s)
        if launch.container is None:
            raise ValueError("ContainerServer needs launch.container")
        self.container: ContainerRun = launch.container
        self._run = run
        self._stopped = False
        self._container_pid: int | None = None

    def _engine(self, cmd: list[str] | None, timeout_s: float = 60.0) -> str | None:
        """Run an engine command; None when it fails (a container already gone is fine)."""
        if cmd is None:
            return None
        try:
            proc = self._run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        return str(proc.stdout) if proc.returncode == 0 else None

    def start(self) -> None:
        self._engine(self.container.remove_command())
        self._stopped = False
        super().start()

    def telemetry_pid(self) -> int | None:
        """The container's init as the host sees it (its children are vLLM), else the client."""
        if self._container_pid is None and self.alive():
            out = self._engine(self.container.pid_command(), 20)
            with contextlib.suppress(ValueError):
                pid = int((out or "").strip() or 0)
                self._container_pid = pid if pid > 0 else None
        return self._container_pid or self.pid

    def stop(self) -> int | None:
        if self.proc is not None and not self._stopped:
            self._stopped = True
            if self.proc.poll() is None:
                self._engine(
                    self.container.stop_command(self.shutdown_timeout_s),
                    self.shutdown_timeout_s + 30,
                )
            code = super().stop()
            self._engine(self.container.remove_command())
            return code
        return super().stop()


def make_server(launch: ServerLaunch, log_path: Path, shutdown_timeout_s: float) -> Server:
    if launch.container is not None and launch.container.engine in ("docker", "podman"):
        return ContainerServer(launch, log_path, shutdown_timeout_s)
    return Server(launch, log_path, shutdown_timeout_s)
