"""Host facts of recorded and constructed hosts, as provenance.json holds them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servelab import hostfacts as hf

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hostfacts"
AMD = (FIXTURES / "cpuinfo-amd-epyc-zen3-avx2.txt").read_text()
SPR = (FIXTURES / "cpuinfo-intel-sapphire-rapids-constructed.txt").read_text()
ONEDNN = {"AVX512": "Intel AVX-512 with AMX", "AVX2": "Intel AVX2"}


def host(cpuinfo: str = SPR, **cpu: Any) -> dict[str, Any]:
    """provenance.json's `host` for a CPU-only host; keyword arguments override cpu_facts keys
    or ISA flags (the ISA class follows the flags)."""
    facts = hf.parse_cpuinfo(cpuinfo)
    n = facts["logical_cpus"]
    facts.update(
        max_mhz=3800.0 if cpuinfo is SPR else None,
        numa_nodes=1,
        affinity=hf.cpu_list(range(n)),
        affinity_cpus=n,
        cgroup_cpu_quota=None,
        effective_cpus=n,
    )
    flags = dict(facts["flags"])
    for k in [k for k in cpu if k in flags]:
        flags[k] = cpu.pop(k)
    facts.update(flags=flags, isa_class=hf.isa_class(flags), **cpu)
    return {
        "cpu": facts["model_name"],
        "cores": n,
        "memory_bytes": 64 * 2**30,
        "os": "Ubuntu 24.04 LTS",
        "kernel": "6.8.0-45-generic",
        "machine": "x86_64",
        "python": "3.11.7",
        "cpu_facts": facts,
        "gpus": [],
        "gpu_reason": "NVML unavailable: NVML Shared Library Not Found",
        "cuda": None,
        "gpu_topology": [],
    }


def isa(capability: str | None = "AVX512", **env: str) -> dict[str, Any]:
    """runtime.json's `isa` as the runtime stage records it."""
    return {
        "cpu_capability": capability,
        "onednn_isa": ONEDNN.get(str(capability)),
        "onednn_version": "3.12.0",
        "torch_version": "2.13.0+cpu",
        "env": env,
        "error": None,
    }


def prov(h: dict[str, Any], capability: str | None = "AVX512") -> dict[str, Any]:
    return {"host": h, "runtime": {"kind": "venv", "isa": isa(capability)}}
