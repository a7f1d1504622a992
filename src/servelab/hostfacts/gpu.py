"""GPU facts through NVML: each GPU's model, memory, clocks, power limit, modes, PCIe and NVLink,
the driver and its CUDA version, and the topology between GPUs.

`gpu_facts` never raises: without pynvml, NVML or a GPU it says why in gpu_reason, and one
query a GPU does not support loses that one fact (None).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

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
