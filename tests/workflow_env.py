"""The environment of a `snakemake` that a test runs here, on this host, not on a cluster.

snakemake-executor-plugin-slurm (installed with the tests, for tests/test_slurm_e2e.py and the
SLURM profile) runs `scontrol show config` when it is loaded, to word the help of its
--slurm-status-command, and every `snakemake` loads it, whatever its executor. On a host with
SLURM's tools and no controller answering (.ci/run installs slurm-wlm; the test cluster runs
only while the SLURM tests do), scontrol waits for one: about 10 s a `snakemake`, idle, which
the plugin cuts off at 10 s. With SLURM_CONF=/dev/null (an empty SLURM configuration) scontrol
fails at once and the plugin finds no MinJobAge, which words that help differently and changes
nothing else: the local runs and dry runs of these tests are the same.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

# an empty SLURM configuration: scontrol fails at once
NO_SLURM = {"SLURM_CONF": "/dev/null"}


def snakemake_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (this process's environment when None) for a `snakemake` run here: NO_SLURM."""
    return {**(os.environ if env is None else env), **NO_SLURM}


def snakemake_here(args: Sequence[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """`snakemake ARGS` in the repository, with snakemake_env(); asserts it exits 0 (the ends of
    its output as the message)."""
    proc = subprocess.run(
        ["snakemake", *args],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        env=snakemake_env(),
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc


def config_errors(config_file: Path) -> list[str]:
    """The `config error` lines of `snakemake --cores 1 --configfile CONFIG_FILE` run in the
    repository with snakemake_env(); asserts it exits non-zero (a refused config)."""
    proc = subprocess.run(
        ["snakemake", "--cores", "1", "--configfile", str(config_file)],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        env=snakemake_env(),
        timeout=120,
    )
    assert proc.returncode != 0
    return [line for line in proc.stderr.splitlines() if "config error" in line]
