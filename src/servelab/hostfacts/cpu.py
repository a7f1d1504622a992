"""CPU facts: identity, instruction-set flags, frequency, topology, affinity and the cgroup CPU
quota of this host.

The parsers are pure (they take the text of /proc/cpuinfo, a /sys file or a cgroup file) so
they can be checked on recorded hosts; `cpu_facts` is the thin IO wrapper. A fact that cannot
be read is None, never an error: provenance is written on any host.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypedDict

from servelab.documents.declared import CpuFacts

# Instruction-set extensions that decide which kernels inference code can use (/proc/cpuinfo
# names): AVX2/FMA for fp32 GEMMs, AVX-512 for wider vectors, *_bf16 / *_fp16 / AMX for native
# half-precision matrix work, VNNI for int8.
ISA_FLAGS = (
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)


class CpuInfo(TypedDict):
    """What /proc/cpuinfo says of the CPU (`parse_cpuinfo`)."""

    vendor: str | None
    family: int | None
    model: int | None
    stepping: int | None
    model_name: str | None
    flags: dict[str, bool]
    isa_class: str
    hypervisor: bool | None
    mhz: float | None
    logical_cpus: int | None
    cores_per_socket: int | None
    threads_per_core: int | None
    sockets: int | None


def isa_class(flags: Mapping[str, bool]) -> str:
    """One word for the instruction-set class: avx512_bf16+amx, avx512_bf16, avx512, avx2,
    other."""
    if flags.get("avx512_bf16") and flags.get("amx_bf16"):
        return "avx512_bf16+amx"
    if flags.get("avx512_bf16"):
        return "avx512_bf16"
    if flags.get("avx512f"):
        return "avx512"
    if flags.get("avx2") and flags.get("fma"):
        return "avx2"
    return "other"


def _int(text: str | None) -> int | None:
    t = str(text).strip()
    try:
        return int(t, 16) if t.lower().startswith("0x") else int(t)
    except ValueError:
        return None


def _float(text: str | None) -> float | None:
    try:
        value = float(str(text).strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _processors(text: str) -> list[dict[str, str]]:
    blocks: list[dict[str, str]] = []
    current: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if current:
                blocks.append(current)
                current = {}
            continue
        key, sep, value = line.partition(":")
        if sep:
            current.setdefault(key.strip(), value.strip())
    if current:
        blocks.append(current)
    return [b for b in blocks if "processor" in b] or blocks[:1]


def parse_cpuinfo(text: str) -> CpuInfo:
    """The facts /proc/cpuinfo holds: identity, ISA flags, MHz and topology."""
    procs = _processors(text)
    first = procs[0] if procs else {}
    words = set((first.get("flags") or first.get("Features") or "").split())
    flags = {f: f in words for f in ISA_FLAGS}
    siblings = _int(first.get("siblings"))
    cores = _int(first.get("cpu cores"))
    sockets = {p["physical id"] for p in procs if "physical id" in p}
    threads = siblings // cores if siblings and cores and siblings % cores == 0 else None
    return {
        "vendor": first.get("vendor_id") or first.get("CPU implementer"),
        "family": _int(first.get("cpu family")),
        "model": _int(first.get("model")),
        "stepping": _int(first.get("stepping")),
        "model_name": first.get("model name"),
        "flags": flags,
        "isa_class": isa_class(flags),
        "hypervisor": "hypervisor" in words if words else None,
        "mhz": _float(first.get("cpu MHz")),
        "logical_cpus": len([p for p in procs if "processor" in p]) or None,
        "cores_per_socket": cores,
        "threads_per_core": threads,
        "sockets": len(sockets) or None,
    }


def parse_khz(text: str | None) -> float | None:
    """A cpufreq file (kHz) as MHz."""
    khz = _float(text)
    return None if khz is None else khz / 1000.0


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 cpu.max ("QUOTA PERIOD" or "max PERIOD") as CPUs; None when unlimited."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    quota = _float(parts[0])
    period = _float(parts[1]) if len(parts) > 1 else 100000.0
    if quota is None or not period or quota <= 0:
        return None
    return round(quota / period, 3)


def parse_cfs(quota_text: str, period_text: str) -> float | None:
    """cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us as CPUs; None when unlimited (-1)."""
    quota, period = _float(quota_text), _float(period_text)
    if quota is None or quota <= 0 or not period:
        return None
    return round(quota / period, 3)


def cpu_list(cpus: Sequence[int]) -> str:
    """{0, 1, 2, 5} as "0-2,5" (the kernel's cpulist format)."""
    out: list[str] = []
    ids = sorted(set(cpus))
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(out)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def _cgroup_paths(proc_cgroup: str | None) -> tuple[str, str]:
    """(v2 path, v1 cpu controller path) of this process, "/" when unknown."""
    v2 = v1 = "/"
    for line in (proc_cgroup or "").splitlines():
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controllers == "":
            v2 = path or "/"
        elif "cpu" in controllers.split(","):
            v1 = path or "/"
    return v2, v1


def _ancestors(base: Path, path: str) -> list[Path]:
    """base/a/b/c, base/a/b, base/a, base: a quota set on any of them applies."""
    parts = [p for p in path.split("/") if p]
    return [base.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def cgroup_cpu_quota(root: Path = Path("/")) -> float | None:
    """The CPU quota of this process's cgroup and its ancestors (v2 cpu.max, else v1 CFS), as
    CPUs: the tightest one; None when unlimited or not readable."""
    fs = root / "sys" / "fs" / "cgroup"
    v2, v1 = _cgroup_paths(_read(root / "proc" / "self" / "cgroup"))
    found = False
    quotas: list[float | None] = []
    for d in _ancestors(fs, v2):
        text = _read(d / "cpu.max")
        if text is not None:
            found = True
            quotas.append(parse_cpu_max(text))
    if not found:
        for ctl in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
            for d in _ancestors(fs / ctl, v1):
                quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
                if quota is not None and period is not None:
                    quotas.append(parse_cfs(quota, period))
    limits = [q for q in quotas if q is not None]
    return min(limits) if limits else None


def numa_nodes(root: Path = Path("/")) -> int | None:
    nodes = [p for p in (root / "sys/devices/system/node").glob("node*") if p.name[4:].isdigit()]
    return len(nodes) or None


def cpu_facts(
    root: Path = Path("/"),
    affinity: Callable[[], set[int]] | None = None,
) -> CpuFacts:
    """This host's CPU facts (`root` replaces / in tests)."""
    info = parse_cpuinfo(_read(root / "proc" / "cpuinfo") or "")
    max_mhz = parse_khz(_read(root / "sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"))
    nodes = numa_nodes(root)
    cpus: set[int] | None
    try:
        cpus = set(affinity()) if affinity else set(os.sched_getaffinity(0))
    except (OSError, AttributeError):
        cpus = None
    affinity_cpus = len(cpus) if cpus else None
    quota = cgroup_cpu_quota(root)
    limits = [x for x in (affinity_cpus, quota) if x is not None]
    return {
        **info,
        "max_mhz": max_mhz,
        "numa_nodes": nodes,
        "affinity": cpu_list(sorted(cpus)) if cpus else None,
        "affinity_cpus": affinity_cpus,
        "cgroup_cpu_quota": quota,
        "effective_cpus": min(limits) if limits else None,
    }
