"""One server session, the same for the sweep and the profile capture: the launch of one
server configuration, built from its measuring job (servelab.job.MeasureJob: the experiment,
its folders, the model, the runtime record), and the context manager that serves it.

`build_launch` assembles the vLLM command line (the configuration's arguments), its
environment (HF_HUB_OFFLINE: the model is always local, then runtime.env) and, for a container
runtime, the container it runs in. The profile capture adds its profiler to the same launch as
`LaunchAdditions`: server arguments, environment, a wrapper command in front of the server
(`nsys profile ...`), folders the server writes into and, in a container, read-only mounts
(the host's Nsight Systems). The server starts as `vllm serve MODEL` when the runtime's vLLM
has that entry point (runtime.json "vllm_cli"), else with the older api_server module.
`serve` takes the host's measuring-server lock (`MeasuringLock`, servelab.launch.hostlock: one
measuring server per host), or is handed it held, starts the server, waits until it is ready,
lowers its engine's priority and always stops it; the `Session` it yields gives the client
settings, the server's max-model-len, the lines this launch added to the server log, where its
start went (`start`) and what the lock made it wait (`lock`). The prompts a launch sends are
built by servelab.workload.promptset.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from servelab import hostfacts
from servelab.client import RequestSettings
from servelab.config import args_to_cli
from servelab.documents.declared import (
    CapacityJson,
    CompileCacheState,
    EngineJson,
    LaunchJson,
    LockRecord,
    Placement,
    StartRecord,
)
from servelab.env.compilecache import compile_cache_for
from servelab.env.container import ContainerRun, Mount, container_run_for
from servelab.env.endpoint import NOT_LAUNCHED, capacity_facts, parse_url
from servelab.env.runtime import cache_dir_of
from servelab.errors import ServelabError
from servelab.experiment import ServerSection, WorkloadSection
from servelab.job import MeasureJob, Say
from servelab.launch import engine_config
from servelab.launch.hostlock import MeasuringLock
from servelab.launch.server import EndpointServer, Server, ServerLaunch, make_server, wait_all_ready
from servelab.launch.serverlog import parse_capacity, start_line
from servelab.redact import redact_argv, redact_env
from servelab.store.jsonio import as_object
from servelab.store.records import RuntimeRecord


@dataclass(frozen=True)
class LaunchAdditions:
    """What the profile capture adds to a server's launch."""

    args: tuple[str, ...] = ()  # after the configuration's vLLM arguments
    env: Mapping[str, str] = field(default_factory=dict)  # after runtime.env
    wrapper: tuple[str, ...] = ()  # in front of the server (in a container: inside it)
    writable: tuple[Path, ...] = ()  # folders it writes into (mounted at their own path)
    mounts: tuple[Mount, ...] = ()  # in a container: more read-only mounts (e.g. nsys)


def server_container(
    job: MeasureJob,
    sc: str,
    *,
    purpose: str,
    writable: tuple[Path, ...] = (),
    mounts: tuple[Mount, ...] = (),
    gpus: bool = True,
) -> ContainerRun | None:
    """The container a server of `sc` runs in (or, without GPUs, a helper that works on its
    folders): each writable folder mounted at its own path, then `mounts`; None for a venv
    runtime. Its name is the same for the same job of the same results folder."""
    return container_run_for(
        job,
        sc,
        purpose=purpose,
        mounts=(*(Mount(str(p.resolve()), str(p.resolve()), False) for p in writable), *mounts),
        gpus=gpus,
    )


def build_launch(
    job: MeasureJob,
    sc: str,
    *,
    port: int,
    purpose: str = "sweep",
    additions: LaunchAdditions | None = None,
) -> ServerLaunch:
    """The launch of server configuration `sc`: command line, environment, container (with
    the runtime's compile-cache folder, runtime.compile_cache)."""
    exp = job.exp
    if exp.runtime.endpoint:
        return endpoint_launch(job, additions)
    add = additions or LaunchAdditions()
    runtime = job.runtime_of(sc)
    cache = (
        compile_cache_for(runtime.doc, cache_dir_of(exp.runtime))
        if exp.runtime.compile_cache
        else None
    )
    cache_env = cache.env(container=runtime.in_container) if cache is not None else {}
    cache_mounts = (cache.mount(),) if cache is not None and runtime.in_container else ()
    return ServerLaunch(
        python=runtime.python,
        model_path=str(job.model_dir.resolve()),
        served_name=exp.model.served_name,
        host=exp.server.host,
        port=port,
        args=args_to_cli(exp.server.args_of(sc)) + list(add.args),
        # The model is always local: the server must never reach for a hub.
        # runtime.env may move a compile cache elsewhere: it comes after
        env={"HF_HUB_OFFLINE": "1", **cache_env, **exp.runtime.env, **add.env},
        wrapper=list(add.wrapper),
        container=server_container(
            job,
            sc,
            purpose=purpose,
            writable=add.writable,
            mounts=(*add.mounts, *cache_mounts),
        ),
        cli=runtime.vllm_cli,
        compile_cache=cache,
    )


def endpoint_launch(job: MeasureJob, additions: LaunchAdditions | None = None) -> ServerLaunch:
    """The "launch" of a server servelab did not launch (runtime.kind endpoint): its URL and
    served model, no command, no arguments, no environment; nothing can be added to it (the
    profiling pass is refused for an endpoint)."""
    rt = job.exp.runtime
    if additions is not None and additions != LaunchAdditions():
        raise ServelabError(
            "profile.enabled: the profiling pass cannot change a server servelab did not "
            "launch (runtime.kind endpoint); set profile.enabled: false"
        )
    assert rt.url is not None and rt.served_model is not None  # config.validate requires both
    where = parse_url(rt.url)
    return ServerLaunch(
        python="",
        model_path="",
        served_name=rt.served_model,
        host=where.host,
        port=where.port,
        args=[],
        endpoint=where.base,
    )


@dataclass(frozen=True)
class Session:
    """A server that is up and ready (inside `serve`)."""

    server: Server
    launch: ServerLaunch
    ready_s: float  # from the start until /health answered
    placement: Placement  # what lowering the engine's priority did (launch.json)
    log_offset: int  # where this launch's lines start in the server log
    # where the start went (serverlog.start_phases; launch.json `start`)
    start: StartRecord | None = None
    # what the host's measuring-server lock made it wait (MeasuringLock.record; `lock`)
    lock: LockRecord = field(kw_only=True)
    # the compile caches before the start (CompileCache.state; `compile_cache`), None: not kept
    compile_cache: CompileCacheState | None = None

    def startup_log(self) -> str:
        """What this launch has written to the server log so far ("" for a server servelab
        did not launch: it has no log of servelab's)."""
        if not self.server.launched:
            return ""
        data = self.server.log_path.read_bytes()[self.log_offset :]
        return data.decode("utf-8", errors="replace")

    def client(self, wl: WorkloadSection) -> RequestSettings:
        """The client's settings for this server."""
        return RequestSettings(
            base_url=self.launch.base_url,
            model=self.launch.served_name,
            # None: every prompt carries its own (client.Prompt: drawn lengths, a dataset)
            max_tokens=wl.output_tokens if isinstance(wl.output_tokens, int) else None,
            ignore_eos=wl.ignore_eos,
            request_timeout_s=wl.request_timeout_s,
            # a conversation's pause between a reply's end and its next turn (workload.chat)
            think_time_s=wl.chat.think_time_s if wl.chat is not None else 0.0,
            # each request's generated token ids, for comparing answers (output_ids)
            record_output_ids=wl.record_output_ids,
        )

    def max_model_len(self) -> int | None:
        """The longest sequence (prompt + output) this server takes, as it says on /v1/models;
        None when it does not say."""
        data = as_object(self.server.get_json("/v1/models")).get("data")
        models = [m for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        # the served model's entry first (a running server may serve several)
        models.sort(key=lambda m: m.get("id") != self.launch.served_name)
        for m in models:
            length = m.get("max_model_len")
            if isinstance(length, int):
                return int(length)
        return None

    def capacity(self, args: Mapping[str, object]) -> CapacityJson:
        """capacity.json's facts of this launch: from its startup log, /version and its
        arguments (`args`: --max-num-seqs); for a server servelab did not launch, from what it
        exposes (endpoint.capacity_facts: its arguments unknown)."""
        if isinstance(self.server, EndpointServer):
            return capacity_facts(self.server.facts or self.server.attach())
        log = parse_capacity(self.startup_log())
        version = as_object(self.server.get_json("/version")).get("version")
        seqs = args.get("max-num-seqs")
        return {
            "kv_cache_tokens": log["kv_cache_tokens"],
            "kv_cache_device": log["kv_cache_device"],
            "max_concurrency": log["max_concurrency"],
            "max_concurrency_tokens_per_request": log["max_concurrency_tokens_per_request"],
            "non_default_args": log["non_default_args"],
            "version": log["version"],
            "cudagraph_capture_sizes": log["cudagraph_capture_sizes"],
            "cudagraph_capture_sizes_source": log["cudagraph_capture_sizes_source"],
            "cudagraph_capture_sizes_capped_to": log["cudagraph_capture_sizes_capped_to"],
            "cudagraph_mode": log["cudagraph_mode"],
            "version_endpoint": version if isinstance(version, str) else None,
            "max_num_seqs": seqs if isinstance(seqs, int) else None,
        }

    def engine(self, args: Mapping[str, object]) -> EngineJson:
        """launch.json `engine` (engine_config.record): from this launch's log and /metrics."""
        if not self.server.launched:
            return engine_config.record(None, "", args)
        try:
            scrape = self.server.get_text("/metrics")
        except (OSError, ValueError):
            scrape = ""
        return engine_config.record(self.startup_log(), scrape, args)

    def launch_record(
        self, launch_index: int, sc: str, args: Mapping[str, object], runtime: RuntimeRecord
    ) -> LaunchJson:
        """launch.json of this launch (index `launch_index` of configuration `sc`, its vLLM
        arguments `args`, the runtime it ran in). A server servelab did not launch: no
        command, environment or arguments of servelab's, `launched` false and what it said
        of itself (`endpoint`); its start is when servelab attached."""
        server, launch = self.server, self.launch
        node = hostfacts.node_facts()
        record: LaunchJson = {
            "launch": launch_index,
            "server_config": sc,
            "launched": server.launched,
            "command": redact_argv(launch.command()),
            "env": redact_env(launch.env),
            "args": dict(args),
            "host": launch.host,
            "port": launch.port,
            "pid": server.pid,
            "started_epoch_ns": server.started_epoch_ns,
            "ready_s": round(self.ready_s, 3),
            # the host's measuring-server lock: the file, the wait, who held it
            "lock": self.lock,
            # the compile caches before the start (servelab.env.compilecache)
            "compile_cache": self.compile_cache,
            "placement": self.placement,
            # the measuring host, beside the measurement (the report's Host section)
            "cpu_facts": node["host"]["cpu_facts"],
            # the node as a whole: the analysis flags comparisons across nodes
            "node": node,
            "runtime_lock_sha256": runtime.get("lock_sha256"),
            "runtime_image_digest": runtime.get("image_digest"),
            "container": launch.container.name if launch.container else None,
        }
        if self.start is not None:  # where the start went: its phases from the log
            record["start"] = self.start
        record["engine"] = self.engine(args)
        choice = launch.container.gpu_choice if launch.container else None
        if choice is not None:  # the container's GPUs: which, why (servelab.env.container.gpus)
            record["gpus"] = choice.to_json()
        if isinstance(server, EndpointServer):
            record["endpoint"] = server.facts or server.attach()
        return record


@contextmanager
def serve(
    launch: ServerLaunch,
    log_path: Path,
    settings: ServerSection,
    say: Say,
    *,
    fresh_log: bool = False,
    lock: MeasuringLock | None = None,
) -> Iterator[Session]:
    """Take the host's measuring-server lock (MeasuringLock, server.lock_timeout_s), start the
    server (its output appended to log_path, or in a fresh log), wait until it is ready, lower
    its engine's priority (server.engine_nice), and stop it on the way out, whatever happens
    inside; the lock is released once the server has stopped. `lock`: the lock, already held
    by the caller, who releases it (a sweep job's, held over its host-speed canary too)."""
    if launch.endpoint is not None:
        with _attach(launch, log_path, settings, say, lock) as session:
            yield session
        return
    together = serve_together([(launch, log_path)], settings, say, fresh_log=fresh_log, lock=lock)
    with together as sessions:
        yield sessions[0]


@contextmanager
def measuring_lock(
    settings: ServerSection, say: Say, held: MeasuringLock | None = None
) -> Iterator[MeasuringLock]:
    """`held` where the caller holds the lock already (and releases it), else the host's
    measuring-server lock, taken here (server.lock_timeout_s) and released on the way out."""
    if held is not None:
        if not held.held:
            raise ValueError(f"the measuring-server lock {held.path} handed over is not held")
        yield held
        return
    with MeasuringLock(settings.lock_timeout_s, say) as lock:
        yield lock


@contextmanager
def serve_together(
    starts: Sequence[tuple[ServerLaunch, Path]],
    settings: ServerSection,
    say: Say,
    *,
    fresh_log: bool = False,
    lock: MeasuringLock | None = None,
) -> Iterator[list[Session]]:
    """`serve` for several servers at once (a side-by-side round, sweep.repeats.side_by_side):
    one measuring-server lock for all of them (`lock`, held by the caller, or taken here),
    every server started before any is waited for (their starts overlap), each waited until
    ready and its engine's priority lowered, and every one stopped on the way out, whatever
    happens inside. A Session's `ready_s` is its own server's time from start to ready. Servers
    servelab did not launch are refused."""
    for launch, _ in starts:
        if launch.endpoint is not None:
            raise ServelabError(
                f"{launch.base_url}: a server servelab did not launch (runtime.kind endpoint) "
                "cannot be started beside another; set sweep.repeats.side_by_side: false"
            )
    with measuring_lock(settings, say, lock) as held, contextlib.ExitStack() as stack:
        begun: list[tuple[ServerLaunch, Server, int, CompileCacheState | None]] = []
        for launch, log_path in starts:
            if fresh_log:
                log_path.unlink(missing_ok=True)
            log_offset = log_path.stat().st_size if log_path.exists() else 0
            cache_state = None
            if launch.compile_cache is not None:
                launch.compile_cache.prepare()
                cache_state = launch.compile_cache.state()
            server = stack.enter_context(make_server(launch, log_path, settings.shutdown_timeout_s))
            begun.append((launch, server, log_offset, cache_state))
        waited = wait_all_ready([b[1] for b in begun], settings.startup_timeout_s, say)
        sessions: list[Session] = []
        for (launch, server, log_offset, cache_state), w in zip(begun, waited, strict=True):
            # overlapping starts: each server's own time since it started, not this wait's
            ready_s = w if len(begun) == 1 else float(server.ready_t_s or w)
            start = server.start_record()
            say(f"server ready in {ready_s:.1f} s ({start_line(start or {})})")
            placement = server.lower_engine_priority(settings.engine_nice, say)
            sessions.append(
                Session(
                    server,
                    launch,
                    ready_s,
                    placement,
                    log_offset,
                    start=start,
                    lock=held.record(),
                    compile_cache=cache_state,
                )
            )
        yield sessions


@contextmanager
def _attach(
    launch: ServerLaunch,
    log_path: Path,
    settings: ServerSection,
    say: Say,
    lock: MeasuringLock | None = None,
) -> Iterator[Session]:
    """`serve` for a server servelab did not launch (runtime.kind endpoint): the host's
    measuring-server lock as for any measurement (the client measures on this host), then
    nothing started: the server must answer and serve the launch's model (one line naming
    runtime.url or runtime.served_model otherwise); nothing is stopped on the way out."""
    with measuring_lock(settings, say, lock) as held:
        server = EndpointServer(launch, log_path)
        server.start()
        facts = server.attach()
        process = facts.get("process")
        where = f"its process: pid {process['pid']}" if process else facts.get("process_reason")
        say(
            f"endpoint {launch.base_url} ({NOT_LAUNCHED}) serves {launch.served_name}, vLLM "
            f"{facts.get('vllm_version') or 'version unknown'}; {where}"
        )
        placement = server.lower_engine_priority(0, say)
        yield Session(server, launch, 0.0, placement, 0, lock=held.record())
