"""Energy per output token: the NVML total energy counter of the server's GPUs, or the CPU
packages' RAPL counters (a fake powercap tree), read at the point's ends; in point.json's
telemetry block and in points.csv."""

from __future__ import annotations

import csv
import time
from pathlib import Path
from typing import Any

import pytest
from telemetry_fakes import (
    FakeClock,
    FakeNVML,
    device,
    fake_powercap,
    fake_uuid,
    idle,
    set_rapl,
)

from servelab.experiment import TelemetrySection
from servelab.telemetry import (
    COLUMNS,
    ENERGY_COLUMNS,
    PointTelemetry,
    server_gpus,
    summarize,
    table_columns,
    telemetry_columns,
)
from servelab.telemetry.nvml import GpuSource
from servelab.telemetry.sampling import HostAccess
from servelab.telemetry.sources import RaplSource
from servelab.telemetry.summary import counter_at, counter_change

FAST = TelemetrySection(enabled=True, gpu_hz=50, cpu_hz=50, metrics_hz=1, metrics_timeout_s=1)
S = 10**9
T0 = 1_800_000_000 * S
CPU_SERVER = server_gpus("cpu", None, {}, {})


def cuda(value: str) -> Any:
    return server_gpus("gpu", None, {}, {"CUDA_VISIBLE_DEVICES": value})


# --- the NVML counter --------------------------------------------------------------------------


def test_fake_energy_counter_grows_with_power_times_time() -> None:
    clock = FakeClock()
    nvml = FakeNVML([device(power_mw=350_000)], clock=clock)
    e0 = nvml.nvmlDeviceGetTotalEnergyConsumption(0)
    clock.t += 2.0
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(0) - e0 == 700_000  # 350 W x 2 s, in mJ
    nvml.set_power(0, 100_000)
    clock.t += 1.0
    assert nvml.nvmlDeviceGetTotalEnergyConsumption(0) - e0 == 800_000
    old = FakeNVML([device(name="Tesla P100", arch="pascal")])
    with pytest.raises(old.NVMLError_NotSupported):
        old.nvmlDeviceGetTotalEnergyConsumption(0)


def test_gpu_samples_carry_the_energy_counter() -> None:
    clock = FakeClock()
    nvml = FakeNVML([device(), device(name="Tesla P100", arch="pascal")], clock=clock)
    src = GpuSource(nvml)
    assert src.open() is None
    first = src.read()
    clock.t += 0.5
    second = src.read()
    assert second[0]["energy_mj"] - first[0]["energy_mj"] == 175_000
    assert "energy_mj" not in first[1] and "error" not in first[1]  # no counter: not an error
    d = src.describe()["gpus"]
    assert d[0]["energy_counter"] is None
    assert d[1]["energy_counter"] == (
        "not supported (NVML counts total energy on Volta and newer GPUs)"
    )


def test_the_points_gpu_energy_and_joules_per_output_token(tmp_path: Path) -> None:
    """Only the server's GPU counts: 350 W over the point, per output token; its idle
    neighbours draw power too and are left out."""
    nvml = FakeNVML([idle(), idle(), device(power_mw=350_000), idle()])
    tel = PointTelemetry(FAST, None, None, host=HostAccess(nvml), gpus=cuda(fake_uuid(2)))
    with tel:
        t0 = time.time_ns()
        time.sleep(0.4)
        t1 = time.time_ns()
    summary = tel.finish(tmp_path, t0, t1, output_tokens=1000)
    window_s = (t1 - t0) / S
    (dev,) = summary["gpu"]["devices"]
    assert dev["energy_j"] == pytest.approx(350.0 * window_s, rel=0.05)
    energy = summary["energy"]
    assert energy["source"] == "nvml" and energy["absent"] is None
    assert energy["joules"] == pytest.approx(dev["energy_j"])
    assert energy["window_s"] == pytest.approx(window_s)
    assert energy["output_tokens"] == 1000
    assert energy["joules_per_output_token"] == pytest.approx(energy["joules"] / 1000)
    cols = telemetry_columns(summary)
    assert cols["energy_source"] == "nvml" and cols["energy_j"] == energy["joules"]
    assert cols["joules_per_output_token"] == energy["joules_per_output_token"]


def test_a_gpu_without_the_counter_leaves_energy_absent_with_the_reason(tmp_path: Path) -> None:
    nvml = FakeNVML([device(name="Tesla P100", arch="pascal"), device()])
    tel = PointTelemetry(FAST, None, None, host=HostAccess(nvml), gpus=cuda("0,1"))
    with tel:
        t0 = time.time_ns()
        time.sleep(0.1)
        t1 = time.time_ns()
    summary = tel.finish(tmp_path, t0, t1, output_tokens=10)
    p100, h100 = summary["gpu"]["devices"]
    assert p100["energy_j"] is None and h100["energy_j"] > 0
    assert summary["energy"]["joules"] is None
    assert summary["energy"]["joules_per_output_token"] is None
    assert summary["energy"]["absent"] == (
        "GPU 0 (Tesla P100) energy counter: not supported (NVML counts total energy on Volta "
        "and newer GPUs)"
    )
    assert telemetry_columns(summary)["energy_absent"] == summary["energy"]["absent"]


def test_energy_is_the_windows_own_interpolated_at_both_ends() -> None:
    samples = [
        {"source": "gpu", "epoch_ns": T0 + k * S, "device": 0, "energy_mj": 100_000 * k}
        for k in range(4)
    ]
    assert counter_at(samples, "energy_mj", T0 + S // 2) == 50_000
    assert counter_at(samples, "energy_mj", T0 - 1) is None  # before the first sample
    assert counter_change(samples, "energy_mj", T0 + S // 2, T0 + 5 * S // 2) == 200_000
    assert counter_change(samples, "energy_mj", T0, T0 + 4 * S) is None  # no closing sample
    reset = [*samples, {"source": "gpu", "epoch_ns": T0 + 4 * S, "device": 0, "energy_mj": 5}]
    assert counter_change(reset, "energy_mj", T0, T0 + 4 * S) is None  # the driver reloaded
    sel = {"source": "gpu", "epoch_ns": T0, "selection": {"how": "all", "gpus": []}}
    summary = summarize([sel, *samples], T0 + S // 2, T0 + 5 * S // 2, output_tokens=400)
    assert summary["gpu"]["devices"][0]["energy_j"] == 200.0
    assert summary["energy"]["joules_per_output_token"] == 0.5


# --- RAPL ---------------------------------------------------------------------------------------


def test_rapl_package_counters_with_wrap_around(tmp_path: Path) -> None:
    root = fake_powercap(tmp_path / "powercap", {0: 1_000_000, 1: 5_000_000}, max_uj=10_000_000)
    src = RaplSource(root)
    assert src.open() is None
    assert [z.name for z in src.zones] == ["package-0", "package-1"]  # not psys, not core
    (first,) = src.read()
    assert first["energy_j"] == 0.0 and first["zones"] == {"package-0": 0.0, "package-1": 0.0}
    set_rapl(root, 0, 3_500_000)  # +2.5 J
    set_rapl(root, 1, 1_000_000)  # wrapped: +5 J to the range's end, then +1 J
    (second,) = src.read()
    assert second["zones"] == {"package-0": 2.5, "package-1": 6.0}
    assert second["energy_j"] == 8.5 and "error" not in second


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda p: p / "nope", "no {root} (no powercap RAPL driver on this host)"),
        (lambda p: fake_powercap(p / "pc", {}), "no RAPL package zone"),
    ],
)
def test_rapl_absent_says_why(tmp_path: Path, make: Any, reason: str) -> None:
    root = make(tmp_path)
    assert RaplSource(root).open().startswith(reason.format(root=root))


def test_rapl_unreadable_counter_is_a_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """energy_uj is root-only on current kernels (0400); the test runs as root or not, so the
    refusal is made by hand."""
    root = fake_powercap(tmp_path / "pc", {0: 1}, mode=0o400)
    real = Path.read_text

    def read_text(self: Path, *a: Any, **kw: Any) -> str:
        if self.name == "energy_uj" and self.parent.name == "intel-rapl:0":
            raise PermissionError(13, "Permission denied")
        return real(self, *a, **kw)

    monkeypatch.setattr(Path, "read_text", read_text)
    reason = RaplSource(root).open()
    assert reason == (
        f"permission denied reading {root / 'intel-rapl:0' / 'energy_uj'} (the RAPL counters "
        "are readable by root only on most kernels since 2020)"
    )


def test_a_cpu_server_s_energy_is_the_cpu_packages(tmp_path: Path) -> None:
    root = fake_powercap(tmp_path / "pc", {0: 0})
    nvml = FakeNVML([device()])  # a GPU on the host, not the server's
    tel = PointTelemetry(FAST, None, None, host=HostAccess(nvml, root), gpus=CPU_SERVER)
    with tel:
        t0 = time.time_ns()
        for k in range(1, 6):  # 20 J every 40 ms
            time.sleep(0.04)
            set_rapl(root, 0, k * 20_000_000)
        t1 = time.time_ns()
    summary = tel.finish(tmp_path / "p", t0, t1, output_tokens=50)
    assert summary["rapl"]["zones"] == ["package-0"] and summary["rapl"]["samples"] >= 3
    energy = summary["energy"]
    assert energy["source"] == "rapl" and energy["absent"] is None
    assert 0 < energy["joules"] <= 100.0
    assert energy["joules_per_output_token"] == pytest.approx(energy["joules"] / 50)
    assert summary["gpu"]["absent"] == "the server is given no GPU (runtime.device: cpu)"


def test_a_cpu_server_without_rapl_records_the_reason(tmp_path: Path) -> None:
    tel = PointTelemetry(
        FAST, None, None, host=HostAccess(FakeNVML([]), tmp_path / "none"), gpus=CPU_SERVER
    )
    with tel:
        t0 = time.time_ns()
        time.sleep(0.05)
        t1 = time.time_ns()
    summary = tel.finish(tmp_path / "p", t0, t1, output_tokens=50)
    assert summary["rapl"] == {
        "absent": f"no {tmp_path / 'none'} (no powercap RAPL driver on this host)"
    }
    assert summary["energy"]["source"] == "rapl"
    assert summary["energy"]["absent"] == summary["rapl"]["absent"]
    assert summary["energy"]["joules"] is None


# --- the columns --------------------------------------------------------------------------------


def test_energy_columns_only_where_points_recorded_them() -> None:
    """A table of points summarized before energy was recorded keeps its columns."""
    old = summarize([{"source": "gpu", "epoch_ns": T0, "absent": "no NVML"}], T0, T0 + S)
    assert "energy" not in old and table_columns([old]) == COLUMNS
    new = summarize([{"source": "rapl", "epoch_ns": T0, "absent": "no powercap"}], T0, T0 + S)
    assert table_columns([old, new]) == (*COLUMNS, *ENERGY_COLUMNS)
    assert table_columns([]) == ()
    assert ENERGY_COLUMNS[-4:] == (
        "energy_source",
        "energy_j",
        "joules_per_output_token",
        "energy_absent",
    )


def test_points_csv_has_joules_per_output_token(tmp_path: Path) -> None:
    from analysis_fixtures import servelab_point

    from servelab.analysis.pipeline import analyze

    exp = tmp_path / "exp"
    sel = {"source": "gpu", "epoch_ns": T0, "selection": {"how": "all", "gpus": []}}
    for rep in (1, 2):
        samples = [
            sel,
            *(
                {"source": "gpu", "epoch_ns": T0 + k * S, "device": 0, "energy_mj": 300_000 * k}
                for k in range(3)
            ),
        ]
        block = summarize(samples, T0, T0 + 2 * S, output_tokens=400 * rep)
        servelab_point(exp, "a", rep, 1, 100.0, 10.0, telemetry=block)
    analyze(exp, tmp_path / "out", name="exp", figures=False)
    with (tmp_path / "out" / "points.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert list(rows[0])[-len(ENERGY_COLUMNS) :] == list(ENERGY_COLUMNS)
    assert [float(r["joules_per_output_token"]) for r in rows] == [1.5, 0.75]
    assert {r["energy_source"] for r in rows} == {"nvml"} and rows[0]["energy_j"] == "600"


def test_a_damaged_energy_value_is_named_on_read(tmp_path: Path) -> None:
    import json

    from analysis_fixtures import servelab_point

    from servelab.store.rawdata import DamagedRawData, load_points

    exp = tmp_path / "exp"
    block = {"format_version": 1, "energy": {"source": "nvml", "joules_per_output_token": "lots"}}
    servelab_point(exp, "a", 1, 1, 100.0, 10.0, telemetry=block)
    with pytest.raises(DamagedRawData) as err:
        load_points(exp)
    assert "$.telemetry.energy.joules_per_output_token: 'lots' is not of type" in str(err.value)
    assert "(the telemetry block, docs/raw-data.md)" in str(err.value)
    pj = next(exp.glob("raw/a/rep01/c0001/point.json"))
    point = json.loads(pj.read_text())
    point["telemetry"]["energy"]["joules_per_output_token"] = 0.5
    pj.write_text(json.dumps(point))
    assert len(load_points(exp)) == 1
