"""The host as a whole: the provenance host block (`host_facts`) and the measuring node a
launch record names (`node_facts`)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from servelab.documents.declared import HostFacts, NodeFacts
from servelab.hostfacts.cpu import cpu_facts
from servelab.hostfacts.gpu import gpu_facts


def host_facts() -> HostFacts:
    """The host: the summary keys every bundle has (cpu, cores, memory_bytes, os, kernel,
    machine, python, gpus, gpu_reason, cuda), `cpu_facts` (docs/bundle.md) and, per GPU pair,
    `gpu_topology`."""
    import psutil

    cpu = cpu_facts()
    os_name = platform.system()
    try:
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return {
        "cpu": cpu["model_name"] or platform.processor() or "",
        "cores": os.cpu_count(),
        "memory_bytes": int(psutil.virtual_memory().total),
        "os": os_name,
        "kernel": platform.release(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpu_facts": cpu,
        **gpu_facts(),
    }


def node_facts() -> NodeFacts:
    """The node a job runs on, for launch.json's `node` (docs/raw-data.md): its hostname, the
    SLURM job id where SLURM started the job (else None) and `host_facts()`. No other
    environment variable: nothing secret."""
    return {
        "hostname": platform.node(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID") or None,
        "host": host_facts(),
    }
