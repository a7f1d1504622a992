"""One server session, the same for the sweep and the profile capture: the launch of one
server configuration, built from the experiment, and the context manager that serves it.

`build_launch` assembles the vLLM command line (the configuration's arguments), its
environment (HF_HUB_OFFLINE: the model is always local, then runtime.env) and, for a container
runtime, the container it runs in. The profile capture adds its profiler to the same launch as
`LaunchAdditions`: server arguments, environment, a wrapper command in front of the server
(`nsys profile ...`), folders the server writes into and, in a container, read-only mounts
(the host's Nsight Systems). The server starts as `vllm serve MODEL` when the runtime's vLLM
has that entry point (runtime.json "vllm_cli"), else with the older api_server module.
`serve` starts the server, waits until it is ready, lowers its engine's priority and always
stops it; the `Session` it yields gives the client settings, the prompts and the lines this
launch added to the server log.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.client import Workload
from servelab.config import args_to_cli
from servelab.container import ContainerRun, Mount, container_run_for
from servelab.experiment import Experiment, ServerSection, WorkloadSection
from servelab.paths import ExperimentPaths
from servelab.server import Server, ServerLaunch, make_server
from servelab.workload import build_prompts, vocab_ids

Say = Callable[[str], None]


@dataclass(frozen=True)
class LaunchAdditions:
    """What the profile capture adds to a server's launch."""

    args: tuple[str, ...] = ()  # after the configuration's vLLM arguments
    env: Mapping[str, str] = field(default_factory=dict)  # after runtime.env
    wrapper: tuple[str, ...] = ()  # in front of the server (in a container: inside it)
    writable: tuple[Path, ...] = ()  # folders it writes into (mounted at their own path)
    mounts: tuple[Mount, ...] = ()  # in a container: more read-only mounts (e.g. nsys)


def server_container(
    exp: Experiment,
    paths: ExperimentPaths,
    sc: str,
    *,
    model_dir: Path,
    runtime: Mapping[str, Any],
    purpose: str,
    writable: tuple[Path, ...] = (),
    mounts: tuple[Mount, ...] = (),
    gpus: bool = True,
) -> ContainerRun | None:
    """The container a server of `sc` runs in (or, without GPUs, a helper that works on its
    folders); None for a venv runtime. Its name is the same for the same job of the same
    results folder."""
    return container_run_for(
        exp,
        runtime,
        model_dir=str(model_dir.resolve()),
        server_config=sc,
        purpose=purpose,
        exp_dir=str(paths.root.resolve()),
        writable=[str(p.resolve()) for p in writable],
        mounts=mounts,
        cuda_visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
        gpus=gpus,
    )


def build_launch(
    exp: Experiment,
    paths: ExperimentPaths,
    sc: str,
    *,
    model_dir: Path,
    runtime: Mapping[str, Any],
    port: int,
    purpose: str = "sweep",
    additions: LaunchAdditions | None = None,
) -> ServerLaunch:
    """The launch of server configuration `sc`: command line, environment, container."""
    add = additions or LaunchAdditions()
    return ServerLaunch(
        python=runtime["python"],
        model_path=str(model_dir.resolve()),
        served_name=exp.model.served_name,
        host=exp.server.host,
        port=port,
        args=args_to_cli(exp.server.args_of(sc)) + list(add.args),
        # The model is always local: the server must never reach for a hub.
        env={"HF_HUB_OFFLINE": "1", **exp.runtime.env, **add.env},
        wrapper=list(add.wrapper),
        container=server_container(
            exp,
            paths,
            sc,
            model_dir=model_dir,
            runtime=runtime,
            purpose=purpose,
            writable=add.writable,
            mounts=add.mounts,
        ),
        cli=bool(runtime.get("vllm_cli")),
    )


@dataclass(frozen=True)
class Session:
    """A server that is up and ready (inside `serve`)."""

    server: Server
    launch: ServerLaunch
    ready_s: float  # from the start until /health answered
    placement: dict[str, Any]  # what lowering the engine's priority did (launch.json)
    log_offset: int  # where this launch's lines start in the server log

    def startup_log(self) -> str:
        """What this launch has written to the server log so far."""
        data = self.server.log_path.read_bytes()[self.log_offset :]
        return data.decode("utf-8", errors="replace")

    def client(self, wl: WorkloadSection) -> Workload:
        """The client's settings for this server."""
        return Workload(
            base_url=self.launch.base_url,
            model=self.launch.served_name,
            max_tokens=wl.output_tokens,
            ignore_eos=wl.ignore_eos,
            request_timeout_s=wl.request_timeout_s,
        )

    def prompts(self, wl: WorkloadSection, count: int, model_dir: Path) -> list[str]:
        """`count` prompts of workload.input_tokens tokens (workload.seed), built with the
        model's vocabulary and checked by this server's tokenizer."""
        return build_prompts(
            self.server,
            self.launch.served_name,
            count,
            vocab_ids(model_dir),
            seed=wl.seed,
            input_tokens=wl.input_tokens,
        )


@contextmanager
def serve(
    launch: ServerLaunch,
    log_path: Path,
    settings: ServerSection,
    say: Say,
    *,
    fresh_log: bool = False,
) -> Iterator[Session]:
    """Start the server (its output appended to log_path, or in a fresh log), wait until it
    is ready, lower its engine's priority (server.engine_nice), and stop it on the way out,
    whatever happens inside."""
    if fresh_log:
        log_path.unlink(missing_ok=True)
    log_offset = log_path.stat().st_size if log_path.exists() else 0
    with make_server(launch, log_path, settings.shutdown_timeout_s) as server:
        ready_s = server.wait_ready(settings.startup_timeout_s, say)
        say(f"server ready in {ready_s:.1f} s")
        placement = server.lower_engine_priority(settings.engine_nice, say)
        yield Session(server, launch, ready_s, placement, log_offset)
