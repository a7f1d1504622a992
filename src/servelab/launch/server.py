"""vLLM server lifecycle: launch, readiness (where its start went, read from its log by
servelab.launch.serverlog), shutdown.

The server runs in its own process group (its own session) so that stopping it reaches every
process vLLM spawns. It also gets PR_SET_PDEATHSIG, so it dies with the job even when the job is
killed with SIGKILL and has no chance to clean up.

In a container (docker, podman) the server is not a child of the job: `docker run` is, and the
container lives in the engine. Stopping therefore stops the container by name (`docker stop`,
then `docker rm --force`, checked gone), and every start first removes a container of the same
name, which only a job killed outright (SIGKILL) can leave behind. apptainer runs the server as
a child, so the process group covers it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, ClassVar

from servelab.documents import JsonValue
from servelab.documents.declared import EndpointFacts, Placement, ServerProcess, StartRecord
from servelab.env.compilecache import CompileCache
from servelab.env.container import ContainerRun, server_inner_command, vllm_server_command
from servelab.errors import ServelabError
from servelab.launch.containers import Runner, container_exists, engine_call, remove_container
from servelab.launch.serverlog import start_phases

if TYPE_CHECKING:
    from servelab.client import RequestRecord

LOG_TAIL_LINES = 25


# --- where a start goes, read while it starts ----------------------------------------------


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
    # the runtime's compile-cache folder (servelab.env.compilecache; runtime.compile_cache), whose
    # variables are in env and, in a container, whose folder is mounted
    compile_cache: CompileCache | None = None
    # runtime.kind endpoint: the base URL of a running server; nothing is launched
    endpoint: str | None = None

    def process_env(self) -> dict[str, str]:
        """Variables set for the launched process (docker, podman: passed on by name;
        apptainer: as APPTAINERENV_*), on top of the job's own environment."""
        env = {**self.env, "PYTHONUNBUFFERED": "1"}
        return self.container.process_env(env) if self.container else env

    def command(self) -> list[str]:
        if self.endpoint is not None:
            return []  # a server servelab did not launch: no command line of servelab's
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
        return self.endpoint or f"http://{self.host}:{self.port}"


class Server:
    """A running server; use as a context manager so it is always stopped."""

    launched: ClassVar[bool] = True  # started (and stopped) by servelab

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

    def telemetry_process(self) -> int | str | None:
        """What the telemetry samples as the server (PointTelemetry's server_pid): the root of
        its process tree, or why there is none."""
        return self.telemetry_pid()

    def gone_text(self) -> str:
        """How the server went away, for the line a point cut short by it ends with."""
        return f"exited with code {self.proc.returncode if self.proc else None}"

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

    def lower_engine_priority(self, nice: int, say: Callable[[str], None] = print) -> Placement:
        """Give vLLM's engine processes (its engine core and workers, ENGINE_PROCESS_NAMES)
        the niceness `nice`, every thread of them, so that on a host with few cores the API
        server gets the CPU when it needs it: starved, it holds back a request's tokens and
        sends them in one burst (docs/analysis.md, the `streaming` check). The engine core
        waits on its workers by polling, so it is lowered with them: lowering the workers alone
        lets the poller take their core. What was done is returned for launch.json; 0 changes
        nothing."""
        record: Placement = {"engine_nice": nice, "engine_pids": []}
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
        return wait_all_ready([self], timeout_s, say)[0]

    def ready_now(self, t0: float, timeout_s: float) -> float | None:
        """One look at a starting server (`wait_all_ready`): what its log added, then whether
        /health answers 200; the seconds since `t0` once it does, else None. Raises when the
        server exited, or `timeout_s` after `t0` (the server stopped first)."""
        if self.watch is not None:
            self.watch.poll()
        if not self.alive():
            code = self.proc.returncode if self.proc else None
            raise ServelabError(
                f"server exited with code {code} before it was ready{self._phase_note()}; "
                f"last lines of {self.log_path}:\n{self.log_tail()}"
            )
        try:
            with urllib.request.urlopen(f"{self.launch.base_url}/health", timeout=2) as resp:
                if resp.status == 200:
                    ready = time.monotonic()
                    self.ready_t_s = ready - self.started_monotonic
                    if self.watch is not None:
                        self.watch.poll(final=True)
                    return ready - t0
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        if time.monotonic() - t0 > timeout_s:
            self.stop()
            raise ServelabError(
                f"server not ready after {timeout_s:g} s (server.startup_timeout_s)"
                f"{self._phase_note()}; last lines of {self.log_path}:\n{self.log_tail()}"
            )
        return None

    def _phase_note(self, sep: str = " ") -> str:
        """`in its <phase> phase`, the last phase of its start begun (START_PHASES)."""
        phase = self.watch.phase_at() if self.watch is not None else None
        return f"{sep}in its {phase} phase" if phase else ""

    def start_record(self) -> StartRecord | None:
        """Where this start went (`start_phases`); launch.json's `start`."""
        return start_phases(self.watch.lines if self.watch else [], self.ready_t_s)

    def get_json(self, path: str, timeout_s: float = 10.0) -> JsonValue:
        answer: JsonValue = json.loads(self.get_text(path, timeout_s))
        return answer

    def get_text(self, path: str, timeout_s: float = 10.0) -> str:
        with urllib.request.urlopen(f"{self.launch.base_url}{path}", timeout=timeout_s) as resp:
            return str(resp.read().decode("utf-8", errors="replace"))

    def post_json(
        self, path: str, body: Mapping[str, object] | None, timeout_s: float = 30.0
    ) -> Any:
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
        return engine_call(self._run, cmd, timeout_s)

    def start(self) -> None:
        self.remove()
        self._stopped = False
        super().start()

    def exists(self) -> bool:
        return container_exists(self.container, self._run)

    def remove(self) -> bool:
        """Remove the container, checked gone (`remove_container`)."""
        return remove_container(self.container, self._run)

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
            self.remove()
            return code
        return super().stop()


class EndpointServer(Server):
    """A server servelab did not launch (runtime.kind endpoint, servelab.env.endpoint): it starts
    and stops nothing and lowers no priority; `attach` checks that the server answers and
    serves the launch's model, and keeps what it says of itself (`facts`, launch.json's
    `endpoint`). Alive while /health (or any HTTP status) answers. The telemetry samples the
    process listening on its port when its URL is local; elsewhere the reason it cannot."""

    launched: ClassVar[bool] = False

    def __init__(self, launch: ServerLaunch, log_path: Path, shutdown_timeout_s: float = 0.0):
        super().__init__(launch, log_path, shutdown_timeout_s)
        self.facts: EndpointFacts | None = None  # `attach`
        self._process: int | str | None = None

    def start(self) -> None:
        """Nothing starts: the time servelab attached is the launch's start."""
        self.started_epoch_ns = time.time_ns()
        self.started_monotonic = time.monotonic()
        self.ready_t_s = 0.0

    def attach(self) -> EndpointFacts:
        """What the server says of itself (endpoint.attach_facts: one line naming runtime.url
        or runtime.served_model when it does not answer or serves another model) and, for a
        local URL, its process (pid and command line, redacted)."""
        from servelab.env.endpoint import attach_facts, server_process

        said = attach_facts(self.launch.base_url, self.launch.served_name)
        self._process = server_process(self.launch.base_url)
        process: ServerProcess | None = None
        reason = None
        if isinstance(self._process, int):
            process = {"pid": self._process, "command": _command_of(self._process)}
        else:
            reason = self._process
        facts: EndpointFacts = {**said, "process": process, "process_reason": reason}
        self.facts = facts
        return facts

    @property
    def pid(self) -> int | None:
        return self._process if isinstance(self._process, int) else None

    def telemetry_process(self) -> int | str | None:
        return self._process

    def alive(self, grace_s: float = 0.0) -> bool:
        """Whether the server still answers (/health, any HTTP status), trying for up to
        grace_s."""
        from servelab.env.endpoint import fetch

        t_end = time.monotonic() + grace_s
        while True:
            try:
                fetch(self.launch.base_url, "/health", 2.0)
                return True
            except urllib.error.HTTPError:
                return True
            except OSError:
                if time.monotonic() >= t_end:
                    return False
            time.sleep(0.2)

    def gone_text(self) -> str:
        return f"stopped answering at {self.launch.base_url}"

    def wait_ready(self, timeout_s: float, say: Callable[[str], None] = print) -> float:
        return 0.0

    def start_record(self) -> StartRecord | None:
        return None  # no start of servelab's to time

    def lower_engine_priority(self, nice: int, say: Callable[[str], None] = print) -> Placement:
        return {"engine_nice": 0, "engine_pids": []}  # not servelab's server to change

    def log_tail(self, n: int = LOG_TAIL_LINES) -> str:
        return f"(no server log: servelab did not launch the server at {self.launch.base_url})"

    def stop(self) -> int | None:
        return None


def _command_of(pid: int) -> list[str]:
    """A local process's command line, secrets redacted ([] when it cannot be read)."""
    import psutil

    from servelab.redact import redact_argv

    try:
        return redact_argv(psutil.Process(pid).cmdline())
    except psutil.Error:
        return []


def wait_all_ready(
    servers: Sequence[Server], timeout_s: float, say: Callable[[str], None] = print
) -> list[float]:
    """Wait until every one of `servers` (started, their starts overlapping) answers /health,
    each looked at in turn every half second, so that each one's start phases and ready time
    are its own; the seconds each was waited for. Every 15 s, which are still starting."""
    t0 = last_note = time.monotonic()
    waited: list[float | None] = [None] * len(servers)
    while True:
        for i, server in enumerate(servers):
            if waited[i] is None:
                waited[i] = server.ready_now(t0, timeout_s)
        if all(w is not None for w in waited):
            return [float(w or 0.0) for w in waited]
        now = time.monotonic()
        if now - last_note >= 15:
            for server, w in zip(servers, waited, strict=True):
                if w is None:
                    say(
                        f"server: waiting for {server.launch.base_url}/health "
                        f"({now - t0:.0f} s{server._phase_note(', ')})"
                    )
            last_note = now
        time.sleep(0.5)


def make_server(launch: ServerLaunch, log_path: Path, shutdown_timeout_s: float) -> Server:
    if launch.endpoint is not None:
        return EndpointServer(launch, log_path, shutdown_timeout_s)
    if launch.container is not None and launch.container.engine in ("docker", "podman"):
        return ContainerServer(launch, log_path, shutdown_timeout_s)
    return Server(launch, log_path, shutdown_timeout_s)
