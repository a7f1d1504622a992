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
from collections.abc import Mapping

# an empty SLURM configuration: scontrol fails at once
NO_SLURM = {"SLURM_CONF": "/dev/null"}


def snakemake_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """`env` (this process's environment when None) for a `snakemake` run here: NO_SLURM."""
    return {**(os.environ if env is None else env), **NO_SLURM}
