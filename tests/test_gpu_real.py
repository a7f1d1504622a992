"""servelab's telemetry against a real NVIDIA GPU: the sampler the sweep runs (PointTelemetry,
GpuSource over pynvml, the GPU chosen from CUDA_VISIBLE_DEVICES as for a server's launch) while
a PyTorch matrix-multiply loop keeps the GPU busy, and while it idles; the GPUs a container's
launch is given, named by UUID (servelab.env.container.gpus), and the host facts' UUIDs and PCI bus
ids.

Needs an NVIDIA GPU that NVML sees, nvidia-ml-py and PyTorch with CUDA; no vLLM, container
engine, Nsight Systems or network. Elsewhere every test is skipped with the reason.

    SERVELAB_SKIP_E2E=1 python -m pytest tests/test_gpu_real.py -m gpu -v -rs

The logic these checks rely on (the selection, the energy arithmetic) is covered without a GPU
by tests/test_telemetry_gpus.py, tests/test_telemetry_energy.py and tests/test_container.py.
"""

from __future__ import annotations

import importlib
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from servelab.experiment import TelemetrySection
from servelab.telemetry import PointTelemetry, server_gpus

pytestmark = pytest.mark.gpu

SETTINGS = TelemetrySection(enabled=True, gpu_hz=10, cpu_hz=2, metrics_hz=1, metrics_timeout_s=1)
LOAD_S = 14.0  # the load's length: READY, then 1 s to settle and an 8 s window inside it
SETTLE_S = 1.0
WINDOW_S = 8.0

# A matrix-multiply loop on the process's cuda:0 for argv[1] seconds: READY <uuid> <pci bus id>
# once the first products are done, DONE at the end.
LOAD = r"""
import sys, time, torch
seconds = float(sys.argv[1])
props = torch.cuda.get_device_properties(0)
uuid = str(getattr(props, "uuid", "")) or "-"
bus = "%04x:%02x:%02x.0" % tuple(getattr(props, k, 0) for k in
                                 ("pci_domain_id", "pci_bus_id", "pci_device_id"))
if seconds <= 0:
    print("READY", uuid, bus, flush=True)
    sys.exit(0)
a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.float16)
b = torch.randn(8192, 8192, device="cuda:0", dtype=torch.float16)
for _ in range(3):
    c = a @ b
torch.cuda.synchronize()
print("READY", uuid, bus, flush=True)
end = time.monotonic() + seconds
while time.monotonic() < end:
    for _ in range(10):
        c = a @ b
    torch.cuda.synchronize()
print("DONE", flush=True)
"""


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    pci_bus_id: str
    name: str
    max_sm_clock_mhz: int | None
    power_limit_w: float | None
    others: int  # compute processes already on it


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _first_gpu() -> Gpu | str:
    """NVML index 0, or why there is no GPU to test."""
    try:
        nvml = importlib.import_module("pynvml")
    except ImportError:
        return "no NVIDIA GPU visible: nvidia-ml-py is not installed"
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return f"no NVIDIA GPU visible: NVML unavailable: {_text(exc)}"
    try:
        if int(nvml.nvmlDeviceGetCount()) == 0:
            return "no NVIDIA GPU visible: NVML lists none"
        h = nvml.nvmlDeviceGetHandleByIndex(0)

        def opt(func: str, *args: Any) -> Any:
            try:
                return getattr(nvml, func)(h, *args)
            except nvml.NVMLError:
                return None

        limit = opt("nvmlDeviceGetEnforcedPowerLimit")
        procs = opt("nvmlDeviceGetComputeRunningProcesses") or []
        return Gpu(
            index=0,
            uuid=_text(nvml.nvmlDeviceGetUUID(h)),
            pci_bus_id=_text(nvml.nvmlDeviceGetPciInfo(h).busId),
            name=_text(nvml.nvmlDeviceGetName(h)),
            max_sm_clock_mhz=opt("nvmlDeviceGetMaxClockInfo", nvml.NVML_CLOCK_SM),
            power_limit_w=None if limit is None else int(limit) / 1000.0,
            others=len(procs),
        )
    finally:
        nvml.nvmlShutdown()


def _start_load(env: dict[str, str], seconds: float) -> tuple[subprocess.Popen[str], list[str]]:
    """The load process and its READY line's fields (uuid, pci bus id as torch sees them)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", LOAD, str(seconds)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60.0)
    line = proc.stdout.readline() if ready else ""
    if not line.startswith("READY"):
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"the PyTorch load did not start: {line!r} {err[-2000:]}")
    return proc, line.split()[1:]


@pytest.fixture(scope="module")
def gpu() -> Gpu:
    found = _first_gpu()
    if isinstance(found, str):
        pytest.skip(found)
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": found.uuid},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.stdout.strip() != "True":
        why = (probe.stderr.strip().splitlines() or ["torch.cuda.is_available() is False"])[-1]
        pytest.skip(f"torch.cuda is not available: {why}")
    return found


def _measure(gpu: Gpu, tmp: Path, settle_s: float, window_s: float) -> dict[str, Any]:
    """servelab's telemetry over [settle, settle + window], on the GPU named by its UUID, as a
    venv server's launch with CUDA_VISIBLE_DEVICES=GPU-<uuid> gives it."""
    sel = server_gpus("gpu", None, {}, {"CUDA_VISIBLE_DEVICES": gpu.uuid})
    tel = PointTelemetry(SETTINGS, os.getpid(), None, gpus=sel)
    with tel:
        time.sleep(settle_s)
        t0 = time.time_ns()
        time.sleep(window_s)
        t1 = time.time_ns()
    return tel.finish(tmp, t0, t1, output_tokens=1000)


@pytest.fixture(scope="module")
def busy(gpu: Gpu, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The summary of a window in which the load keeps the GPU busy (about 15 s in all)."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu.uuid}
    proc, seen = _start_load(env, LOAD_S)
    try:
        summary = _measure(gpu, tmp_path_factory.mktemp("busy"), SETTLE_S, WINDOW_S)
        assert proc.poll() is None, "the load ended before the window did"
    finally:  # the GPU idles again before the next test
        proc.kill()
        proc.wait()
    return {**summary, "torch_sees": seen}


def _device(summary: dict[str, Any]) -> dict[str, Any]:
    devices = summary["gpu"].get("devices")
    assert devices, summary["gpu"]
    assert len(devices) == 1, [d["device"] for d in devices]
    return dict(devices[0])


def test_the_gpu_is_chosen_by_uuid(gpu: Gpu, busy: dict[str, Any]) -> None:
    dev = _device(busy)
    assert dev["uuid"] == gpu.uuid and dev["chosen_by"] == f"UUID {gpu.uuid}"
    assert dev["pci_bus_id"] == gpu.pci_bus_id
    assert busy["gpu"]["selection"]["ambiguous"] is None
    uuid = busy["torch_sees"][0]
    if uuid != "-":  # PyTorch's own view of its cuda:0, where it reports one
        assert uuid.lower().removeprefix("gpu-") in gpu.uuid.lower()


def test_utilization_near_100_under_load(busy: dict[str, Any]) -> None:
    util = _device(busy)["util_pct"]
    assert util["mean"] is not None and util["mean"] >= 90.0, util


def test_power_and_sm_clock_within_the_devices_limits(gpu: Gpu, busy: dict[str, Any]) -> None:
    dev = _device(busy)
    power, clock = dev["power_w"], dev["sm_clock_mhz"]
    assert power["mean"] is not None and power["mean"] > 0
    if gpu.power_limit_w:
        assert power["mean"] <= gpu.power_limit_w * 1.05, (power, gpu.power_limit_w)
        assert power["max"] <= gpu.power_limit_w * 1.25, (power, gpu.power_limit_w)
    assert clock["mean"] is not None and clock["mean"] > 0
    if gpu.max_sm_clock_mhz:
        assert clock["max"] <= gpu.max_sm_clock_mhz, (clock, gpu.max_sm_clock_mhz)


def test_energy_counter_rises_by_mean_power_times_time(busy: dict[str, Any]) -> None:
    dev = _device(busy)
    if dev["energy_counter"] is not None:
        pytest.skip(f"{dev['name']}: total energy counter {dev['energy_counter']}")
    window_s = busy["energy"]["window_s"]
    assert window_s == pytest.approx(WINDOW_S, rel=0.05)
    assert dev["energy_j"] == pytest.approx(dev["power_w"]["mean"] * window_s, rel=0.15)
    energy = busy["energy"]
    assert energy["source"] == "nvml" and energy["joules"] == dev["energy_j"]
    assert energy["joules_per_output_token"] == pytest.approx(dev["energy_j"] / 1000)


def test_utilization_near_0_idle(gpu: Gpu, tmp_path: Path) -> None:
    if gpu.others:
        pytest.skip(f"{gpu.others} other compute process(es) on the GPU: it is not idle")
    summary = _measure(gpu, tmp_path, settle_s=2.0, window_s=3.0)
    util = _device(summary)["util_pct"]
    assert util["mean"] is not None and util["mean"] <= 10.0, util


def test_a_cuda_index_in_pci_bus_id_order_is_the_nvml_index(gpu: Gpu) -> None:
    """CUDA_VISIBLE_DEVICES=0 with CUDA_DEVICE_ORDER=PCI_BUS_ID: servelab samples NVML index 0,
    and that is the GPU PyTorch gets."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    proc, seen = _start_load(env, 0)
    proc.wait(timeout=60)
    from servelab.telemetry.nvml import GpuSource

    src = GpuSource(selection=server_gpus("gpu", None, {}, env))
    assert src.open() is None
    try:
        (chosen,) = src.describe()["gpus"]
    finally:
        src.close()
    assert chosen["device"] == 0 and chosen["uuid"] == gpu.uuid
    uuid, bus = seen
    if uuid != "-":
        assert uuid.lower().removeprefix("gpu-") in gpu.uuid.lower()
    if not bus.startswith("0000:00:00"):  # torch without the PCI fields prints zeros
        assert gpu.pci_bus_id.lower().endswith(bus.lower()), (bus, gpu.pci_bus_id)


# --- the GPUs a container's launch is given, by UUID --------------------------------------------


def test_a_container_launch_names_its_gpu_by_uuid(gpu: Gpu) -> None:
    """runtime.gpus 1, no GPU named: docker is given one of this host's GPUs by its UUID (the one
    with the least memory in use), and the telemetry samples exactly that GPU, unambiguously."""
    from servelab.env.container import ContainerRun
    from servelab.env.container.gpus import LEAST_MEMORY, choose_gpus
    from servelab.hostfacts.gpu import list_gpus
    from servelab.telemetry.nvml import GpuSource

    listing = list_gpus()
    assert listing.reason is None and listing.gpus, listing
    choice = choose_gpus(None, 1, {}, listing)
    least = min(listing.gpus, key=lambda g: (g.memory_used_bytes or 0, g.index))
    assert choice.rule == LEAST_MEMORY and choice.ids == (least.uuid,)
    run = ContainerRun("docker", "docker", "image", "n", choice.gpus, gpu_choice=choice)
    assert run.gpu_args() == ["--gpus", f'"device={least.uuid}"']
    src = GpuSource(selection=server_gpus("gpu", run, {}, {}))
    assert src.open() is None
    try:
        d = src.describe()
    finally:
        src.close()
    (sampled,) = d["gpus"]
    assert sampled["uuid"] == least.uuid and sampled["chosen_by"] == f"UUID {least.uuid}"
    assert sampled["pci_bus_id"] == least.pci_bus_id and d["ambiguous"] is None
    assert d["launch"]["rule"] == LEAST_MEMORY and d["driver"] and d["driver_cuda"]


def test_a_cuda_index_becomes_the_uuid_of_the_gpu_cuda_gives_it(gpu: Gpu) -> None:
    """CUDA_VISIBLE_DEVICES=0 with CUDA_DEVICE_ORDER=PCI_BUS_ID: the container is given the UUID
    of NVML index 0, the GPU PyTorch gets as cuda:0 in that environment; a UUID and a PCI bus id
    name the same GPU."""
    from servelab.env.container.gpus import choose_gpus
    from servelab.hostfacts.gpu import list_gpus

    listing = list_gpus()
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    choice = choose_gpus(None, 1, env, listing)
    assert choice.ids == (gpu.uuid,) and choice.ambiguous is None
    proc, seen = _start_load(env, 0)
    proc.wait(timeout=60)
    if seen[0] != "-":  # PyTorch's own view of its cuda:0, where it reports one
        assert seen[0].lower().removeprefix("gpu-") in gpu.uuid.lower()
    assert choose_gpus(None, 1, {"CUDA_VISIBLE_DEVICES": gpu.uuid}, listing).ids == (gpu.uuid,)
    assert choose_gpus([gpu.pci_bus_id], 1, {}, listing).ids == (gpu.uuid,)
    plain = choose_gpus(None, 1, {"CUDA_VISIBLE_DEVICES": "0"}, listing)
    assert plain.ids == (gpu.uuid,)
    # CUDA's default order only matters where there is more than one GPU
    assert (plain.ambiguous is None) == (len(listing.gpus) == 1), plain.ambiguous


def test_host_facts_name_the_gpu_by_uuid_and_say_what_its_readings_are(gpu: Gpu) -> None:
    from servelab.hostfacts.gpu import cuda_compatibility, gpu_facts

    facts = gpu_facts()
    g0 = facts["gpus"][0]
    assert g0["uuid"] == gpu.uuid and g0["pci_bus_id"] == gpu.pci_bus_id
    major, minor = (int(x) for x in g0["compute_capability"].split("."))
    expected = "average_1s" if (major, minor) >= (8, 6) else "instantaneous"
    assert g0["power_reading"] == expected
    assert g0["energy_counter_update_ms"] == ([20, 100] if major >= 7 else None)
    assert facts["cuda"] == g0["cuda_driver"] and facts["cuda"]
    # the driver runs this PyTorch's CUDA: forward compatibility is not what it needs
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.version.cuda)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    compat = cuda_compatibility(g0["driver"], facts["cuda"], probe.stdout.strip(), "torch", False)
    assert compat["forward_compatibility"] in ("not_needed", "minor_version"), compat
