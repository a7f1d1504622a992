"""GPU facts through NVML: each GPU's model, UUID, PCI bus id, memory, clocks, power limit,
modes, PCIe and NVLink, what its power and energy readings are, the driver and the newest CUDA
it supports, and the topology between GPUs; `list_gpus`, the host's GPUs for choosing a
container's; `cuda_compatibility`, the driver against an image's CUDA.

`gpu_facts` and `list_gpus` never raise: without pynvml, NVML or a GPU they say why, and one
query a GPU does not support loses that one fact (None).

What NVML's readings are (its documentation): nvmlDeviceGetPowerUsage is the power averaged
over the last second on Ampere GPUs other than GA100 and on every newer architecture (compute
capability 8.6 and up: A10, L4, L40, H100, H200, B200, ...), and the instantaneous power on
GA100 (A100, compute capability 8.0) and older GPUs; nvmlDeviceGetTotalEnergyConsumption
(Volta and newer) counts mJ since the driver loaded and is updated every 20-100 ms, so the
energy of a window is uncertain by up to about one update (0.1 s) of the GPU's power: about 2%
of a 5 s point.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar

from servelab.documents.declared import CudaCompatibility, GpuFacts, GpuPair
from servelab.hostfacts.gpuids import GpuListing, NvmlGpu

T = TypeVar("T")
TOPOLOGY = {0: "INTERNAL", 10: "SINGLE", 20: "MULTIPLE", 30: "HOSTBRIDGE", 40: "NODE", 50: "SYSTEM"}


def _text(v: object) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}"


# nvmlDeviceGetTotalEnergyConsumption's update period on the GPUs that have the counter
ENERGY_COUNTER_UPDATE_MS = (20, 100)
AVERAGE_1S = "average_1s"  # nvmlDeviceGetPowerUsage: power averaged over the last second
INSTANTANEOUS = "instantaneous"  # nvmlDeviceGetPowerUsage: the power now


def _capability(cc: str | None) -> tuple[int, int] | None:
    try:
        major, minor = str(cc).split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def power_reading(compute_capability: str | None) -> str | None:
    """What nvmlDeviceGetPowerUsage reads on a GPU of this compute capability ("9.0"):
    AVERAGE_1S from 8.6 up (Ampere other than GA100, Ada, Hopper, Blackwell), INSTANTANEOUS
    below (GA100/A100 is 8.0, Volta 7.0, Turing 7.5); None when unknown."""
    cc = _capability(compute_capability)
    if cc is None:
        return None
    return AVERAGE_1S if cc >= (8, 6) else INSTANTANEOUS


def energy_counter_update_ms(compute_capability: str | None) -> list[int] | None:
    """[20, 100]: how often NVML's total energy counter is updated, on Volta (7.0) and newer;
    None before Volta (no counter) or when the compute capability is unknown."""
    cc = _capability(compute_capability)
    if cc is None or cc < (7, 0):
        return None
    return list(ENERGY_COUNTER_UPDATE_MS)


class GpuReadings(TypedDict):
    """What a GPU's power and energy readings are (`reading_facts`)."""

    power_reading: str | None
    energy_counter_update_ms: list[int] | None


class HostGpus(TypedDict):
    """The host's GPUs (`gpu_facts`): every GPU, why there are none, the newest CUDA the driver
    supports and the topology per pair."""

    gpus: list[GpuFacts]
    gpu_reason: str | None
    cuda: str | None
    gpu_topology: list[GpuPair]


def reading_facts(compute_capability: str | None) -> GpuReadings:
    """A GPU's `power_reading` and `energy_counter_update_ms` (see the module's docstring)."""
    return {
        "power_reading": power_reading(compute_capability),
        "energy_counter_update_ms": energy_counter_update_ms(compute_capability),
    }


class _Query:
    """Calls into NVML where any failure is a None, so one unsupported query loses one fact.
    `nvml` is the pynvml module (untyped; a stand-in in tests): `convert` reads what it
    returns."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml

    def __call__(self, func: str, *args: object, convert: Callable[[Any], T]) -> T | None:
        try:
            return convert(getattr(self.nvml, func)(*args))
        except Exception:  # an NVMLError, a missing function, an odd value: the fact is unknown
            return None

    def const(self, name: str, default: int) -> int:
        return int(getattr(self.nvml, name, default))


def _mode(v: int | list[int] | tuple[int, ...]) -> bool:
    current = v[0] if isinstance(v, list | tuple) else v
    return bool(int(current))


def _nvlinks(q: _Query, h: object) -> int | None:
    active = 0
    for link in range(q.const("NVML_NVLINK_MAX_LINKS", 18)):
        state = q("nvmlDeviceGetNvLinkState", h, link, convert=bool)
        if state is None:
            return active or (None if link == 0 else 0)
        active += int(state)
    return active


def _gpu(q: _Query, h: object, index: int, driver: tuple[str | None, str | None]) -> GpuFacts:
    sm, mem = q.const("NVML_CLOCK_SM", 1), q.const("NVML_CLOCK_MEM", 2)
    total = q("nvmlDeviceGetMemoryInfo", h, convert=lambda m: int(m.total))
    cc = q("nvmlDeviceGetCudaComputeCapability", h, convert=lambda v: f"{v[0]}.{v[1]}")
    return {
        "index": index,
        "name": q("nvmlDeviceGetName", h, convert=_text),
        "uuid": q("nvmlDeviceGetUUID", h, convert=_text),
        "pci_bus_id": q("nvmlDeviceGetPciInfo", h, convert=lambda v: _text(v.busId)),
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
        **reading_facts(cc),
        "driver": driver[0],
        "cuda_driver": driver[1],
    }


def _topology(q: _Query, handles: list[object]) -> list[GpuPair]:
    nvlink_cap = q.const("NVML_P2P_CAPS_INDEX_NVLINK", 2)
    ok = q.const("NVML_P2P_STATUS_OK", 0)
    pairs: list[GpuPair] = []
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


def _with_nvml(nvml: Any, use: Callable[[_Query, list[object]], T]) -> T | str:
    """`use(query, handles)` with NVML initialized and shut down after; or why it cannot run:
    no pynvml, no NVML, no GPU. `nvml` replaces the pynvml module (tests)."""
    if nvml is None:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            return "nvidia-ml-py is not installed (no module pynvml)"
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return f"NVML unavailable: {_text(exc)}"
    try:
        try:
            count = int(nvml.nvmlDeviceGetCount())
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception as exc:
            return f"NVML could not list the GPUs: {_text(exc)}"
        if not handles:
            return "NVML found no GPU"
        return use(_Query(nvml), handles)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _driver(q: _Query) -> tuple[str | None, str | None]:
    """The driver's version and the newest CUDA it supports (nvmlSystemGetCudaDriverVersion)."""
    driver = q("nvmlSystemGetDriverVersion", convert=_text)
    return driver, q("nvmlSystemGetCudaDriverVersion", convert=lambda v: _cuda_version(int(v)))


def gpu_facts(nvml: Any = None) -> HostGpus:
    """{"gpus": [...], "gpu_reason": why there are none or None, "cuda": the newest CUDA the
    driver supports, "gpu_topology": [per pair of GPUs]}. `nvml` replaces the pynvml module
    (tests)."""

    def read(q: _Query, handles: list[object]) -> HostGpus:
        driver = _driver(q)
        return {
            "gpus": [_gpu(q, h, i, driver) for i, h in enumerate(handles)],
            "gpu_reason": None,
            "cuda": driver[1],
            "gpu_topology": _topology(q, handles),
        }

    got = _with_nvml(nvml, read)
    if isinstance(got, str):
        return {"gpus": [], "gpu_reason": got, "cuda": None, "gpu_topology": []}
    return got


def list_gpus(nvml: Any = None) -> GpuListing:
    """The host's GPUs as NVML lists them, each with its UUID, PCI bus id, name and the memory
    in use now, and the driver; `reason` says why there are none. Never raises."""

    def read(q: _Query, handles: list[object]) -> GpuListing:
        driver, cuda = _driver(q)
        gpus = tuple(
            NvmlGpu(
                i,
                q("nvmlDeviceGetUUID", h, convert=_text),
                q("nvmlDeviceGetPciInfo", h, convert=lambda v: _text(v.busId)),
                q("nvmlDeviceGetName", h, convert=_text) or "unknown GPU",
                q("nvmlDeviceGetMemoryInfo", h, convert=lambda m: int(m.used)),
            )
            for i, h in enumerate(handles)
        )
        return GpuListing(gpus, None, driver, cuda)

    got = _with_nvml(nvml, read)
    return GpuListing(reason=got) if isinstance(got, str) else got


# --- the driver against an image's CUDA ------------------------------------------------------

COMPAT_ENV = "VLLM_ENABLE_CUDA_COMPATIBILITY"  # vLLM: load the image's CUDA forward compatibility
NOT_NEEDED = "not_needed"  # the driver supports the image's CUDA
MINOR_VERSION = "minor_version"  # same major release, newer minor: minor version compatibility
NEEDED = "needed"  # a newer major release than the driver supports: forward compatibility
UNKNOWN = "unknown"


class _CudaVersions(TypedDict):
    driver: str | None
    driver_cuda: str | None
    image_cuda: str | None
    image_cuda_from: str | None
    vllm_enable_cuda_compatibility: bool  # COMPAT_ENV.lower()


def _major_minor(version: str | None) -> tuple[int, int] | None:
    parts = str(version or "").strip().split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def cuda_compatibility(
    driver: str | None,
    driver_cuda: str | None,
    image_cuda: str | None,
    image_cuda_from: str | None,
    enabled: bool,
) -> CudaCompatibility:
    """The driver (`driver`, and `driver_cuda`, the newest CUDA it supports) against the CUDA an
    image was built with (`image_cuda`, read from `image_cuda_from`), and whether the server
    needs CUDA forward compatibility (`forward_compatibility`: NOT_NEEDED, MINOR_VERSION, NEEDED
    or UNKNOWN); `enabled`: the launch sets VLLM_ENABLE_CUDA_COMPATIBILITY to 1 or true."""
    have, want = _major_minor(driver_cuda), _major_minor(image_cuda)
    out: _CudaVersions = {
        "driver": driver,
        "driver_cuda": driver_cuda,
        "image_cuda": image_cuda,
        "image_cuda_from": image_cuda_from,
        "vllm_enable_cuda_compatibility": enabled,  # COMPAT_ENV.lower()
    }
    if have is None or want is None:
        missing = "the driver's CUDA version" if have is None else "the image's CUDA version"
        return {**out, "forward_compatibility": UNKNOWN, "note": f"{missing} is not known"}
    if want <= have:
        note = f"driver {driver} supports CUDA {driver_cuda}, the image's CUDA {image_cuda} runs"
        return {**out, "forward_compatibility": NOT_NEEDED, "note": note}
    if want[0] == have[0]:
        note = (
            f"the image's CUDA {image_cuda} is newer than driver {driver} supports "
            f"({driver_cuda}) within CUDA {want[0]}: it runs under minor version compatibility, "
            "except code that needs the newer driver (PTX built by the newer toolkit); where "
            f'that fails, set runtime.env {COMPAT_ENV}: "1"'
        )
        return {**out, "forward_compatibility": MINOR_VERSION, "note": note}
    set_or_not = (
        f"runtime.env sets {COMPAT_ENV}"
        if enabled
        else f'set runtime.env {COMPAT_ENV}: "1", or use an image built for CUDA {have[0]}'
    )
    note = (
        f"the image's CUDA {image_cuda} is a newer major release than driver {driver} supports "
        f"({driver_cuda}): the server needs CUDA forward compatibility (data-center GPUs only; "
        f"the image's cuda-compat libraries, VLLM_CUDA_COMPATIBILITY_PATH): {set_or_not}"
    )
    return {**out, "forward_compatibility": NEEDED, "note": note}
