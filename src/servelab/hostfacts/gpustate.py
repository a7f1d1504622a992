"""The GPU's state while the GPU canary (hostfacts.gpucanary) runs: its SM clock, temperature,
power draw and why its clocks are held down, as NVML reports them.

A canary timed on a GPU that is throttling (a hot GPU slowing itself, a power cap) reads slower
than the host is; without the state beside the timing the two cannot be told apart. The canary's
script reads the state in the runtime, through the runtime's pynvml (the nvidia-ml-py package;
`NVML_STATE_SCRIPT` is the part of the script that does it), while the canary's matmuls run:
once after the warm-up and once after the timed repeats. Where pynvml is not importable there
(an image without nvidia-ml-py), NVML does not start, or the GPU PyTorch uses cannot be found
among NVML's, the canary records why instead and is timed all the same.

The clock event reasons are NVML's bitmask (nvmlDeviceGetCurrentClocksEventReasons, in older
pynvml nvmlDeviceGetCurrentClocksThrottleReasons), kept raw and decoded by `CLOCK_EVENTS`;
`THROTTLING` are those that slow the GPU below what its clocks allow (power and thermal limits,
hardware slowdowns, a sync-boost group), not an idle GPU or clocks set by an administrator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

# NVML's clock event (throttle) reason bits, nvml.h's nvmlClocksEventReason* and
# nvmlClocksThrottleReason*, by the names the records use
CLOCK_EVENTS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
THROTTLING = frozenset(
    {
        "sw_power_cap",
        "hw_slowdown",
        "sync_boost",
        "sw_thermal_slowdown",
        "hw_thermal_slowdown",
        "hw_power_brake_slowdown",
    }
)

# Part of the GPU canary's script (hostfacts.gpucanary.GPU_CANARY_SCRIPT), run in the runtime's
# Python: `nvml_open(torch, dev)` finds the NVML device of PyTorch's `dev` (by its UUID, else its
# PCI bus id, else the only GPU NVML lists) and returns (pynvml, handle), or (None, why not);
# `gpu_state(nvml, handle, at)` reads the state, each reading None where NVML refuses it (and
# why, in `errors`). Never raises.
NVML_STATE_SCRIPT = r"""
def nvml_open(torch, dev):
    try:
        import pynvml as nvml
    except Exception as exc:
        return None, "pynvml (nvidia-ml-py) is not importable in the runtime: " + str(exc)[:200]
    try:
        nvml.nvmlInit()
    except Exception as exc:
        return None, "NVML did not start: " + str(exc)[:200]
    try:
        props = torch.cuda.get_device_properties(dev)
    except Exception:
        props = None
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        text = str(uuid)
        text = text if text.startswith(("GPU-", "MIG-")) else "GPU-" + text
        for arg in (text, text.encode()):
            try:
                return nvml, nvml.nvmlDeviceGetHandleByUUID(arg)
            except Exception:
                pass
    pci = [getattr(props, k, None) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
    if None not in pci:
        try:
            return nvml, nvml.nvmlDeviceGetHandleByPciBusId("%08X:%02X:%02X.0" % tuple(pci))
        except Exception:
            pass
    try:
        if nvml.nvmlDeviceGetCount() == 1:
            return nvml, nvml.nvmlDeviceGetHandleByIndex(0)
    except Exception as exc:
        return None, "NVML could not list the GPUs: " + str(exc)[:200]
    return None, ("NVML lists several GPUs and PyTorch names neither the UUID nor the PCI bus id "
                  "of the one it uses")
def gpu_state(nvml, handle, at):
    out = {"at": at, "sm_clock_mhz": None, "temperature_c": None, "power_w": None,
           "clock_event_reasons": None}
    errors = {}
    def read(key, call, *args):
        try:
            return call(*args)
        except Exception as exc:
            errors[key] = (type(exc).__name__ + ": " + str(exc))[:120]
            return None
    sm = getattr(nvml, "NVML_CLOCK_SM", 1)
    out["sm_clock_mhz"] = read("sm_clock_mhz", nvml.nvmlDeviceGetClockInfo, handle, sm)
    temp = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
    out["temperature_c"] = read("temperature_c", nvml.nvmlDeviceGetTemperature, handle, temp)
    mw = read("power_w", nvml.nvmlDeviceGetPowerUsage, handle)
    out["power_w"] = None if mw is None else mw / 1000.0
    reasons = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
               or getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None))
    if reasons is None:
        errors["clock_event_reasons"] = ("this pynvml has neither "
            "nvmlDeviceGetCurrentClocksEventReasons nor nvmlDeviceGetCurrentClocksThrottleReasons")
    else:
        out["clock_event_reasons"] = read("clock_event_reasons", reasons, handle)
    if errors:
        out["errors"] = errors
    return out
"""


class GpuStateJson(TypedDict):
    """One reading of the GPU's state (`GpuState.to_json`)."""

    at: str
    sm_clock_mhz: int | None
    temperature_c: int | None
    power_w: float | None
    clock_event_reasons: int | None
    clock_events: list[str]
    errors: NotRequired[dict[str, str]]


def clock_events(mask: int | None) -> list[str]:
    """The names of the bits set in an NVML clock event reasons mask (an unnamed bit as
    `bit_0x...`); [] for None."""
    if mask is None:
        return []
    bits = [1 << i for i in range(mask.bit_length()) if mask >> i & 1]
    return [CLOCK_EVENTS.get(bit, f"bit_{bit:#x}") for bit in bits]


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


@dataclass(frozen=True)
class GpuState:
    """The GPU's state at one moment of the canary (`at`: after_warmup, after_repeats): SM
    clock (MHz), temperature (°C), power draw (W) and NVML's clock event reasons (the raw mask);
    each None where NVML did not give it, and why in `errors`."""

    at: str
    sm_clock_mhz: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    clock_event_reasons: int | None = None
    errors: Mapping[str, str] = field(default_factory=dict)

    @property
    def clock_events(self) -> list[str]:
        """Every reason NVML gives for the clocks (decoded from the mask)."""
        return clock_events(self.clock_event_reasons)

    @property
    def throttled(self) -> list[str]:
        """The reasons that slow the GPU (THROTTLING); [] when none or unknown."""
        return [n for n in self.clock_events if n in THROTTLING]

    def to_json(self) -> GpuStateJson:
        out: GpuStateJson = {
            "at": self.at,
            "sm_clock_mhz": self.sm_clock_mhz,
            "temperature_c": self.temperature_c,
            "power_w": self.power_w,
            "clock_event_reasons": self.clock_event_reasons,
            "clock_events": self.clock_events,
        }
        if self.errors:
            out["errors"] = dict(self.errors)
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> GpuState:
        """A reading as the script prints it or a record keeps it; a value of the wrong type
        reads as not given."""
        sm, temp = _number(doc.get("sm_clock_mhz")), _number(doc.get("temperature_c"))
        mask = doc.get("clock_event_reasons")
        errors = doc.get("errors")
        return cls(
            str(doc.get("at") or "?"),
            None if sm is None else int(sm),
            None if temp is None else int(temp),
            _number(doc.get("power_w")),
            mask if isinstance(mask, int) and not isinstance(mask, bool) else None,
            {str(k): str(v) for k, v in errors.items()} if isinstance(errors, Mapping) else {},
        )

    def line(self) -> str:
        """SM clock 1410 MHz, 62 °C, 300 W, throttled: sw_thermal_slowdown (or `not throttled`,
        `throttling unknown`); a reading NVML did not give is `?`."""

        def said(value: float | None, unit: str) -> str:
            return "?" if value is None else f"{value:.0f} {unit}"

        if self.clock_event_reasons is None:
            held = "throttling unknown"
        elif self.throttled:
            held = f"throttled: {', '.join(self.throttled)}"
        else:
            held = "not throttled"
        return (
            f"SM clock {said(self.sm_clock_mhz, 'MHz')}, {said(self.temperature_c, '°C')}, "
            f"{said(self.power_w, 'W')}, {held}"
        )
