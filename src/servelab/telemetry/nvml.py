"""The server's GPUs through NVML, as the telemetry samples them (`GpuSource`).

Each reading is one sample record per GPU (a plain dict, as servelab.telemetry.sources'):
`source` gpu, `epoch_ns`, the device and its values. The source's `describe()` is the GPU
selection record: which GPUs were sampled, how they were chosen, the driver, and per GPU what
its readings are (servelab.hostfacts.gpu.reading_facts: nvmlDeviceGetPowerUsage a 1 s average
or instantaneous, the total energy counter's 20-100 ms update period).
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass
from typing import Any

from servelab.documents.declared import GpuSamplingRecord
from servelab.hostfacts.gpu import reading_facts
from servelab.telemetry.gpus import (
    EVERY_GPU,
    NONE,
    GpuSelection,
    NvmlGpu,
    Resolution,
    resolve,
)

# a sample record: what one reading of a GPU gave, written as one line of telemetry.jsonl
Sample = dict[str, object]

# NVML's error codes (nvml.h); the module's own constants win when it has them.
_NVML_ERROR_NOT_SUPPORTED = 3
_NVML_ERROR_NOT_FOUND = 6
_NVML_ERROR_GPU_IS_LOST = 15


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass
class _Device:
    index: int
    handle: object  # NVML's handle of the GPU
    name: str
    uuid: str | None
    pci_bus_id: str | None = None
    chosen_by: str = ""
    energy: str | None = None  # why the total energy counter cannot be read; None: it can
    lost: bool = False
    compute_capability: str | None = None


class GpuSource:
    """Per GPU of the server: utilization, SM clock, memory used, power, temperature and the
    total energy counter.

    `selection` names the server's GPUs (servelab.telemetry.gpus; None: every GPU NVML lists);
    they are found by UUID or PCI bus id (an index is read as NVML's, and recorded as ambiguous
    where CUDA may number the GPUs otherwise), and `describe()` records which were sampled, how
    they were chosen, the driver and what each GPU's power and energy readings are. `nvml` is
    the pynvml module; tests inject a fake. It is imported only when a sampler opens, so
    servelab runs where nvidia-ml-py or the driver is missing and records why.
    """

    name = "gpu"

    def __init__(self, nvml: Any = None, selection: GpuSelection | None = None) -> None:
        self._nvml = nvml
        self.selection = selection if selection is not None else EVERY_GPU
        self.devices: list[_Device] = []
        self.chosen: list[_Device] = []
        self.resolution: Resolution | None = None
        self._listed: list[_Device] = []
        self.driver: str | None = None
        self.driver_cuda: str | None = None

    def open(self) -> str | None:
        if self._nvml is None:
            try:
                self._nvml = importlib.import_module("pynvml")
            except ImportError:
                return "nvidia-ml-py is not installed (no module pynvml)"
        nvml = self._nvml
        self._listed, self.chosen, self.resolution = [], [], None
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            return f"NVML unavailable: {_text(exc)}"
        try:
            count = int(nvml.nvmlDeviceGetCount())
            for i in range(count):
                h = nvml.nvmlDeviceGetHandleByIndex(i)
                self._listed.append(
                    _Device(
                        i,
                        h,
                        _text(nvml.nvmlDeviceGetName(h)),
                        self._optional("nvmlDeviceGetUUID", h),
                        self._optional("nvmlDeviceGetPciInfo", h, "busId"),
                    )
                )
        except nvml.NVMLError as exc:
            self.close()
            return f"NVML could not list the GPUs: {_text(exc)}"
        if not self._listed:
            self.close()
            return "NVML found no GPU (nvmlDeviceGetCount() = 0)"
        sel = self.selection
        if sel.how == NONE:
            self.close()
            return f"the server is given no GPU ({sel.origin})"
        listed = [NvmlGpu(d.index, d.uuid, d.pci_bus_id, d.name) for d in self._listed]
        self.resolution = resolve(sel, listed, self._lookup)
        for index, how in self.resolution.chosen:
            dev = self._listed[index]
            dev.chosen_by = how
            dev.energy = self._energy_counter(dev.handle)
            dev.compute_capability = self._capability(dev.handle)
            self.chosen.append(dev)
        self._read_driver()
        self.devices = list(self.chosen)
        if not self.devices:
            self.close()
            return (
                f"none of the server's GPUs ({sel.origin}) is among the {len(listed)} "
                f"NVML lists (unmatched: {', '.join(self.resolution.unmatched)})"
            )
        return None

    def _optional(self, func: str, handle: object, attr: str | None = None) -> str | None:
        """A text NVML may not give (a UUID, a PCI bus id): None when it does not."""
        try:
            value = getattr(self._nvml, func)(handle)
        except self._nvml.NVMLError:
            return None
        return _text(getattr(value, attr) if attr else value)

    def _capability(self, handle: object) -> str | None:
        try:
            major, minor = self._nvml.nvmlDeviceGetCudaComputeCapability(handle)
        except (self._nvml.NVMLError, AttributeError, TypeError, ValueError):
            return None
        return f"{major}.{minor}"

    def _read_driver(self) -> None:
        """The driver's version and the newest CUDA it supports, where NVML says."""
        nvml = self._nvml
        try:
            self.driver = _text(nvml.nvmlSystemGetDriverVersion())
        except (nvml.NVMLError, AttributeError):
            self.driver = None
        try:
            v = int(nvml.nvmlSystemGetCudaDriverVersion())
            self.driver_cuda = f"{v // 1000}.{(v % 1000) // 10}"
        except (nvml.NVMLError, AttributeError, TypeError, ValueError):
            self.driver_cuda = None

    def _lookup(self, kind: str, token: str) -> int | None:
        """The NVML index of the GPU NVML finds for a UUID (a MIG device's: its parent GPU)
        or a PCI bus id."""
        nvml = self._nvml
        try:
            if kind == "pci":
                h = nvml.nvmlDeviceGetHandleByPciBusId(token)
            else:
                h = nvml.nvmlDeviceGetHandleByUUID(token)
                if token.upper().startswith("MIG-"):
                    h = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h)
            uuid = _text(nvml.nvmlDeviceGetUUID(h))
        except (nvml.NVMLError, AttributeError):
            return None
        return next((d.index for d in self._listed if d.uuid == uuid), None)

    def _energy_counter(self, handle: object) -> str | None:
        nvml = self._nvml
        try:
            nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except AttributeError:
            return "this nvidia-ml-py has no nvmlDeviceGetTotalEnergyConsumption"
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) == self._code(
                "NVML_ERROR_NOT_SUPPORTED", _NVML_ERROR_NOT_SUPPORTED
            ):
                return "not supported (NVML counts total energy on Volta and newer GPUs)"
            return f"nvmlDeviceGetTotalEnergyConsumption: {_text(exc)}"
        return None

    def describe(self) -> GpuSamplingRecord:
        """The selection (`how`, `requested`, `origin`, `launch`, ...), what NVML made of it
        (`ambiguous`: the launch's and NVML's reasons, `unmatched`), the driver (`driver`,
        `driver_cuda`) and the GPUs sampled: NVML index (`device`), `uuid`, `pci_bus_id`,
        `name`, `chosen_by`, `energy_counter` (why the total energy counter cannot be read, or
        null), `compute_capability`, `power_reading` and `energy_counter_update_ms`."""
        res = self.resolution
        reasons = [r for r in (self.selection.ambiguous, res.ambiguous if res else None) if r]
        return {
            **self.selection.to_json(),
            "gpus_listed": len(self._listed),
            "ambiguous": "; ".join(dict.fromkeys(reasons)) or None,
            "unmatched": list(res.unmatched) if res else [],
            "driver": self.driver,
            "driver_cuda": self.driver_cuda,
            "gpus": [
                {
                    "device": d.index,
                    "uuid": d.uuid,
                    "pci_bus_id": d.pci_bus_id,
                    "name": d.name,
                    "chosen_by": d.chosen_by,
                    "energy_counter": d.energy,
                    "compute_capability": d.compute_capability,
                    **reading_facts(d.compute_capability),
                }
                for d in self.chosen
            ],
        }

    def _code(self, name: str, default: int) -> int:
        return int(getattr(self._nvml, name, default))

    def read(self) -> list[Sample]:
        nvml = self._nvml
        lost_codes = {
            self._code("NVML_ERROR_GPU_IS_LOST", _NVML_ERROR_GPU_IS_LOST),
            self._code("NVML_ERROR_NOT_FOUND", _NVML_ERROR_NOT_FOUND),
        }
        unsupported = self._code("NVML_ERROR_NOT_SUPPORTED", _NVML_ERROR_NOT_SUPPORTED)
        clock_sm = self._code("NVML_CLOCK_SM", 1)
        temp_gpu = self._code("NVML_TEMPERATURE_GPU", 0)
        out: list[Sample] = []
        for dev in self.devices:
            if dev.lost:
                continue
            h = dev.handle
            rec: Sample = {
                "source": "gpu",
                "epoch_ns": time.time_ns(),
                "device": dev.index,
                "name": dev.name,
                "uuid": dev.uuid,
            }
            readers: list[tuple[str, str, tuple[int, ...]]] = [
                ("util", "nvmlDeviceGetUtilizationRates", ()),
                ("sm_clock_mhz", "nvmlDeviceGetClockInfo", (clock_sm,)),
                ("mem", "nvmlDeviceGetMemoryInfo", ()),
                ("power_mw", "nvmlDeviceGetPowerUsage", ()),
                ("temp_c", "nvmlDeviceGetTemperature", (temp_gpu,)),
            ]
            if dev.energy is None:
                readers.append(("energy_mj", "nvmlDeviceGetTotalEnergyConsumption", ()))
            values: dict[str, Any] = {}
            errors: list[str] = []
            for key, func, args in readers:
                try:
                    values[key] = getattr(nvml, func)(h, *args)
                except nvml.NVMLError as exc:
                    code = getattr(exc, "value", None)
                    if code in lost_codes:
                        dev.lost = True
                        errors = [f"device lost: {_text(exc)}"]
                        break
                    values[key] = None
                    if code != unsupported:
                        errors.append(f"{key}: {_text(exc)}")
            if dev.lost:
                out.append({**rec, "error": errors[0]})
                continue
            util, mem = values.get("util"), values.get("mem")
            power = values.get("power_mw")
            rec.update(
                {
                    "util_pct": _num(util.gpu) if util is not None else None,
                    "mem_util_pct": _num(util.memory) if util is not None else None,
                    "sm_clock_mhz": _num(values.get("sm_clock_mhz")),
                    "mem_used_bytes": _num(mem.used) if mem is not None else None,
                    "mem_total_bytes": _num(mem.total) if mem is not None else None,
                    "power_w": float(power) / 1000.0 if power is not None else None,
                    "temp_c": _num(values.get("temp_c")),
                }
            )
            if dev.energy is None:
                energy = values.get("energy_mj")
                rec["energy_mj"] = int(energy) if energy is not None else None
            if errors:
                rec["error"] = "; ".join(errors)
            out.append(rec)
        return out

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: S110 - already shut down or never initialized
                pass
        self.devices = []


def _num(value: int | float | None) -> int | float | None:
    return value if value is None else (int(value) if isinstance(value, int) else float(value))
