"""The NVML path, against an injected fake NVML module."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from telemetry_fakes import FakeNVML, device, fake_uuid

from servelab.experiment import TelemetrySection
from servelab.telemetry import PointTelemetry, read_samples
from servelab.telemetry.nvml import GpuSource
from servelab.telemetry.sampling import HostAccess


def test_values_of_every_device() -> None:
    nvml = FakeNVML([device(), device(util=12, power_mw=80_500, name="Fake L4")])
    src = GpuSource(nvml)
    assert src.open() is None
    recs = src.read()
    assert [r["device"] for r in recs] == [0, 1]
    a, b = recs
    assert a["source"] == "gpu" and isinstance(a["epoch_ns"], int)
    assert (a["util_pct"], a["mem_util_pct"], a["sm_clock_mhz"]) == (97, 40, 1980)
    assert a["mem_used_bytes"] == 70 * 2**30 and a["mem_total_bytes"] == 80 * 2**30
    assert a["power_w"] == pytest.approx(350.0) and a["temp_c"] == 61
    assert a["name"] == "Fake H100" and a["uuid"] == fake_uuid(0) and "error" not in a
    assert b["util_pct"] == 12 and b["power_w"] == pytest.approx(80.5) and b["name"] == "Fake L4"
    src.close()
    assert nvml.shutdowns == 1


def test_a_device_that_disappears_is_recorded_once_and_then_skipped() -> None:
    nvml = FakeNVML([device(), device()])
    src = GpuSource(nvml)
    assert src.open() is None
    assert len(src.read()) == 2
    nvml.devices[1]["lost"] = True
    recs = src.read()
    assert [r["device"] for r in recs] == [0, 1]
    assert recs[0]["util_pct"] == 97
    assert recs[1]["error"] == "device lost: GPU is lost" and "util_pct" not in recs[1]
    later = src.read()
    assert [r["device"] for r in later] == [0]


def test_nvml_errors_per_field() -> None:
    nvml = FakeNVML([device(raise_power=3, raise_temp=999)])
    src = GpuSource(nvml)
    assert src.open() is None
    (rec,) = src.read()
    assert rec["power_w"] is None and rec["temp_c"] is None
    assert rec["util_pct"] == 97
    # not supported is silent; any other NVML error is kept with the sample
    assert rec["error"] == "temp_c: Unknown Error"


@pytest.mark.parametrize(
    ("nvml", "reason"),
    [
        (FakeNVML([], init_error=9), "NVML unavailable: Driver Not Loaded"),
        (FakeNVML([]), "NVML found no GPU (nvmlDeviceGetCount() = 0)"),
    ],
)
def test_no_gpu_is_a_reason(nvml: FakeNVML, reason: str) -> None:
    assert GpuSource(nvml).open() == reason


def test_missing_nvidia_ml_py_is_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml now raises ImportError
    assert GpuSource().open() == "nvidia-ml-py is not installed (no module pynvml)"


def test_point_records_gpu_absent_with_reason(tmp_path: Path) -> None:
    cfg = TelemetrySection(enabled=True, gpu_hz=20, cpu_hz=20, metrics_hz=1, metrics_timeout_s=1)
    tel = PointTelemetry(cfg, None, None, host=HostAccess(FakeNVML([], init_error=12)))
    with tel:
        t0 = time.time_ns()
        time.sleep(0.1)
        t1 = time.time_ns()
    summary = tel.finish(tmp_path, t0, t1)
    assert summary["gpu"]["absent"] == "NVML unavailable: NVML Shared Library Not Found"
    assert summary["gpu"]["selection"]["how"] == "all" and summary["gpu"]["selection"]["gpus"] == []
    assert summary["server"] == {"absent": "no server URL given"}
    assert summary["cpu"]["client_cpu_s"] is not None  # CPU is still collected
    # every GPU was the server's (no selection given), and none could be read
    assert summary["energy"]["source"] is None and summary["energy"]["joules"] is None
    assert summary["energy"]["absent"] == (
        "the server's GPUs were not sampled: NVML unavailable: NVML Shared Library Not Found"
    )
    rows = read_samples(tmp_path / "telemetry.jsonl")
    gpu = [r for r in rows if r["source"] == "gpu"]
    assert gpu == [
        {
            "source": "gpu",
            "epoch_ns": gpu[0]["epoch_ns"],
            "absent": summary["gpu"]["absent"],
            "selection": summary["gpu"]["selection"],
        }
    ]
    assert sum(r["source"] == "cpu" for r in rows) >= 2


def test_device_lost_mid_point_keeps_sampling_the_others(tmp_path: Path) -> None:
    nvml = FakeNVML([device(), device(util=50)])
    cfg = TelemetrySection(enabled=True, gpu_hz=50, cpu_hz=5, metrics_hz=1, metrics_timeout_s=1)
    tel = PointTelemetry(cfg, None, None, host=HostAccess(nvml))
    with tel:
        t0 = time.time_ns()
        time.sleep(0.2)
        with nvml.lock:
            nvml.devices[1]["lost"] = True
        lost_after = time.time_ns()
        time.sleep(0.2)
        t1 = time.time_ns()
    summary = tel.finish(tmp_path, t0, t1)
    dev0, dev1 = summary["gpu"]["devices"]
    assert dev0["lost_epoch_ns"] is None and dev0["util_pct"]["max"] == 97
    assert dev1["lost_epoch_ns"] is not None and dev1["lost_epoch_ns"] >= lost_after - 10**9
    assert dev1["util_pct"]["max"] == 50 and dev1["errors"] == 1
    assert dev0["samples"] > dev1["samples"]
    assert nvml.inits == 1 and nvml.shutdowns == 1


def test_each_gpu_records_what_its_power_and_energy_readings_are() -> None:
    """nvmlDeviceGetPowerUsage is a 1 s average from Ampere GA10x (8.6) on, the instantaneous
    power on GA100 (A100) and older; the energy counter (Volta and newer) is updated every
    20-100 ms. The selection record says so per GPU, with the driver."""
    nvml = FakeNVML(
        [
            device(name="Fake H100", arch="hopper"),
            device(name="Fake A100", arch="ampere"),
            device(name="Fake A10", arch="ga102"),
            device(name="Tesla P100", arch="pascal"),
        ],
        driver="550.54.15",
        driver_cuda=12040,
    )
    src = GpuSource(nvml)
    assert src.open() is None
    d = src.describe()
    src.close()
    assert (d["driver"], d["driver_cuda"]) == ("550.54.15", "12.4")
    got = [
        (g["name"], g["compute_capability"], g["power_reading"], g["energy_counter_update_ms"])
        for g in d["gpus"]
    ]
    assert got == [
        ("Fake H100", "9.0", "average_1s", [20, 100]),
        ("Fake A100", "8.0", "instantaneous", [20, 100]),
        ("Fake A10", "8.6", "average_1s", [20, 100]),
        ("Tesla P100", "6.0", "instantaneous", None),
    ]
