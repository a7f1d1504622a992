"""Telemetry samples the server's GPUs, not every GPU of the host: the selection read from the
launch (servelab.telemetry.gpus.server_gpus) and mapped to NVML devices by UUID or PCI bus id,
an index only where it is unambiguous; against a fake NVML whose GPUs CUDA numbers otherwise."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest
from telemetry_fakes import FakeNVML, device, fake_uuid, idle

from servelab.client import PointRun
from servelab.design.level import Level
from servelab.design.schedule import Slot
from servelab.env.container import ContainerRun
from servelab.experiment import TelemetrySection
from servelab.store.paths import ExperimentPaths
from servelab.store.request import RequestRecord
from servelab.telemetry import PointTelemetry, read_samples, telemetry_columns
from servelab.telemetry.gpus import (
    ALL,
    CUDA_IDS,
    LIST,
    NONE,
    NVML_IDS,
    GpuSelection,
    NvmlGpu,
    resolve,
    server_gpus,
)
from servelab.telemetry.nvml import GpuSource
from servelab.telemetry.sampling import HostAccess

REPO = Path(__file__).resolve().parent.parent
FAST = TelemetrySection(enabled=True, gpu_hz=50, cpu_hz=10, metrics_hz=1, metrics_timeout_s=1)


def four_gpus(busy: int | None = None) -> FakeNVML:
    """A 4-GPU host, every GPU idle but NVML index `busy`."""
    return FakeNVML([device() if i == busy else idle() for i in range(4)])


def mixed_host() -> FakeNVML:
    """NVML (PCI bus id order): 0 T4 @18, 1 H100 @3B, 2 L4 @5E, 3 H100 @86; CUDA (fastest
    first): 0 = NVML 1, 1 = NVML 3, 2 = NVML 2, 3 = NVML 0."""
    return FakeNVML(
        [
            device(name="Fake T4", speed=1, pci_bus_id="00000000:18:00.0"),
            device(name="Fake H100", speed=10, pci_bus_id="00000000:3B:00.0"),
            device(name="Fake L4", speed=5, pci_bus_id="00000000:5E:00.0"),
            device(name="Fake H100", speed=10, pci_bus_id="00000000:86:00.0"),
        ]
    )


def cuda(value: str, order: str | None = None) -> GpuSelection:
    env = {"CUDA_VISIBLE_DEVICES": value, **({"CUDA_DEVICE_ORDER": order} if order else {})}
    return server_gpus("gpu", None, {}, env)


def opened(nvml: FakeNVML, sel: GpuSelection) -> GpuSource:
    src = GpuSource(nvml, sel)
    assert src.open() is None
    return src


def sampled(src: GpuSource) -> list[int]:
    return [r["device"] for r in src.read()]


# --- the fake behaves as NVML does -------------------------------------------------------------


def test_fake_nvml_numbers_gpus_by_pci_bus_id_and_cuda_fastest_first() -> None:
    nvml = FakeNVML(
        [
            device(name="Fake H100", pci_bus_id="00000000:86:00.0"),
            device(name="Fake T4", speed=1, pci_bus_id="00000000:18:00.0"),
        ]
    )
    assert [nvml.nvmlDeviceGetName(i) for i in range(2)] == [b"Fake T4", b"Fake H100"]
    assert nvml.cuda_order() == [1, 0]  # CUDA's device 0 is NVML's device 1
    uuids = {nvml.nvmlDeviceGetUUID(i) for i in range(2)}
    assert len(uuids) == 2
    assert nvml.nvmlDeviceGetHandleByPciBusId("0000:86:00.0") == 1  # legacy 4-digit domain
    assert nvml.nvmlDeviceGetHandleByPciBusId("18:00.0") == 0
    assert nvml.nvmlDeviceGetHandleByUUID(nvml.nvmlDeviceGetUUID(1)) == 1
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetHandleByUUID(nvml.nvmlDeviceGetUUID(1)[:12])  # NVML takes no prefix
    assert nvml.nvmlDeviceGetPciInfo(0).busId == b"00000000:18:00.0"


# --- which GPUs the launch gives the server ----------------------------------------------------


def test_a_cpu_server_has_no_gpu() -> None:
    sel = server_gpus("cpu", None, {}, {"CUDA_VISIBLE_DEVICES": "0"})
    assert sel.how == NONE and sel.origin == "runtime.device: cpu"


def test_a_venv_server_sees_cuda_visible_devices() -> None:
    assert server_gpus("gpu", None, {}, {}).how == ALL
    sel = server_gpus("gpu", None, {}, {"CUDA_VISIBLE_DEVICES": " GPU-ab, 3 "})
    assert (sel.how, sel.ids, sel.namespace, sel.pci_bus_id_order) == (
        LIST,
        ("GPU-ab", "3"),
        CUDA_IDS,
        False,
    )
    assert sel.origin == "CUDA_VISIBLE_DEVICES= GPU-ab, 3  (the job's environment)"
    # runtime.env wins over the job's environment, as in the server's own environment
    sel = server_gpus(
        "gpu",
        None,
        {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        {"CUDA_VISIBLE_DEVICES": "0"},
    )
    assert sel.ids == ("1",) and sel.pci_bus_id_order and "runtime.env" in sel.origin
    assert server_gpus("gpu", None, {}, {"CUDA_VISIBLE_DEVICES": ""}).how == NONE


def _container(engine: str, gpus: str | tuple[str, ...] | None) -> ContainerRun:
    return ContainerRun(engine=engine, executable=engine, image="img", name="n", gpus=gpus)


def test_a_container_server_sees_its_device_list() -> None:
    # docker and podman: the container toolkit's ids, NVML indices among them
    devices = ("2", "GPU-x")
    sel = server_gpus("gpu", _container("docker", devices), {}, {"CUDA_VISIBLE_DEVICES": "0"})
    assert (sel.how, sel.ids, sel.namespace) == (LIST, ("2", "GPU-x"), NVML_IDS)
    assert sel.origin == "docker devices 2,GPU-x"
    assert server_gpus("gpu", _container("podman", "all"), {}, {}).how == ALL
    assert server_gpus("gpu", _container("docker", None), {}, {}).how == NONE
    # apptainer shows every GPU and hands the list on as CUDA_VISIBLE_DEVICES; --cleanenv
    # keeps the launch's CUDA_DEVICE_ORDER only
    sel = server_gpus(
        "gpu",
        _container("apptainer", ("1",)),
        {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"},
        {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"},
    )
    assert (sel.namespace, sel.ids, sel.pci_bus_id_order) == (CUDA_IDS, ("1",), True)
    sel = server_gpus(
        "gpu", _container("apptainer", ("1",)), {}, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    )
    assert not sel.pci_bus_id_order


# --- mapped to NVML devices --------------------------------------------------------------------


def test_only_the_servers_gpu_is_sampled(tmp_path: Path) -> None:
    """On a 4-GPU host serving on one GPU, utilization is that GPU's, not a quarter of it."""
    nvml = four_gpus(busy=2)
    tel = PointTelemetry(FAST, None, None, host=HostAccess(nvml), gpus=cuda(fake_uuid(2)))
    with tel:
        t0 = time.time_ns()
        time.sleep(0.2)
        t1 = time.time_ns()
    summary = tel.finish(tmp_path, t0, t1)
    (dev,) = summary["gpu"]["devices"]
    assert dev["device"] == 2 and dev["uuid"] == fake_uuid(2)
    assert dev["pci_bus_id"] == "00000000:5E:00.0" and dev["chosen_by"] == f"UUID {fake_uuid(2)}"
    cols = telemetry_columns(summary)
    assert cols["gpu_util_pct_mean"] == 97.0 and cols["utilization_pct"] == 97.0
    assert cols["gpu_devices"] == 1 and cols["gpu_indices"] == "2"
    assert cols["gpu_uuids"] == fake_uuid(2)
    assert cols["gpu_selection"] == f"CUDA_VISIBLE_DEVICES={fake_uuid(2)} (the job's environment)"
    sel = summary["gpu"]["selection"]
    assert sel["gpus_listed"] == 4 and sel["ambiguous"] is None and sel["unmatched"] == []
    assert [g["device"] for g in sel["gpus"]] == [2]


def test_several_gpus_are_reported_each(tmp_path: Path) -> None:
    nvml = FakeNVML([device(), idle(), device(util=50, power_mw=200_000), idle()])
    sel = server_gpus("gpu", _container("docker", ("0", "2")), {}, {})
    tel = PointTelemetry(FAST, None, None, host=HostAccess(nvml), gpus=sel)
    with tel:
        t0 = time.time_ns()
        time.sleep(0.2)
        t1 = time.time_ns()
    summary = tel.finish(tmp_path, t0, t1)
    assert [d["device"] for d in summary["gpu"]["devices"]] == [0, 2]
    cols = telemetry_columns(summary)
    assert cols["gpu_util_pct_mean"] == pytest.approx(73.5)  # the two, not the four
    assert cols["gpu_util_pct_mean_by_device"] == "97.0;50.0"
    assert cols["gpu_power_w_mean_by_device"] == "350.0;200.0"
    assert cols["gpu_indices"] == "0;2" and cols["gpu_selection_ambiguous"] is None
    gpu = [r for r in read_samples(tmp_path / "telemetry.jsonl") if r["source"] == "gpu"]
    assert "selection" in gpu[0] and {r.get("device") for r in gpu[1:]} == {0, 2}


def test_a_uuid_names_the_gpu_cuda_numbers_otherwise() -> None:
    nvml = mixed_host()
    cuda0 = nvml.cuda_order()[0]
    assert cuda0 == 1  # CUDA's device 0 is NVML's device 1
    src = opened(nvml, cuda(nvml.nvmlDeviceGetUUID(cuda0)))
    assert sampled(src) == [1]
    assert src.describe()["ambiguous"] is None


def test_a_cuda_index_is_the_nvml_index_in_pci_bus_id_order() -> None:
    src = opened(mixed_host(), cuda("0", order="PCI_BUS_ID"))
    assert sampled(src) == [0]
    d = src.describe()
    assert d["ambiguous"] is None and d["cuda_device_order"] == "PCI_BUS_ID"
    assert d["gpus"][0]["chosen_by"] == "CUDA index 0 = NVML index 0 (CUDA_DEVICE_ORDER=PCI_BUS_ID)"


def test_a_cuda_index_in_the_default_order_is_ambiguous_and_says_so() -> None:
    nvml = mixed_host()
    src = opened(nvml, cuda("0"))
    assert sampled(src) == [0]  # the guess; CUDA's device 0 is NVML's 1 here
    d = src.describe()
    assert d["cuda_device_order"] == "FASTEST_FIRST"
    assert d["ambiguous"].startswith("CUDA index 0 without CUDA_DEVICE_ORDER=PCI_BUS_ID")
    assert "in practice" not in d["ambiguous"]  # the GPUs differ: no tie to lean on
    assert d["gpus"][0]["chosen_by"] == "CUDA index 0, taken as NVML index 0 (ambiguous)"
    # on a host of one model CUDA's order ties, in practice PCI bus id order
    same = opened(four_gpus(), cuda("1,3")).describe()
    assert [g["device"] for g in same["gpus"]] == [1, 3]
    assert "all 4 GPUs are Fake H100" in same["ambiguous"]
    # and a host with one GPU has nothing to confuse
    one = opened(FakeNVML([device()]), cuda("0")).describe()
    assert one["ambiguous"] is None and one["gpus"][0]["chosen_by"].endswith("only GPU")


def test_ambiguity_reaches_the_columns(tmp_path: Path) -> None:
    tel = PointTelemetry(FAST, None, None, host=HostAccess(mixed_host()), gpus=cuda("0"))
    with tel:
        t0 = time.time_ns()
        time.sleep(0.1)
        t1 = time.time_ns()
    cols = telemetry_columns(tel.finish(tmp_path, t0, t1))
    assert cols["gpu_selection_ambiguous"].startswith("CUDA index 0 without")


def test_uuid_prefixes_mig_ids_and_pci_bus_ids() -> None:
    nvml = mixed_host()
    nvml.migs["MIG-4b0c5e0e-1111-2222-3333-444455556666"] = 3
    uuid3 = nvml.nvmlDeviceGetUUID(3)
    # CUDA takes a UUID's leading digits when they name one GPU
    src = opened(nvml, cuda(uuid3[:12] + "," + "MIG-4b0c5e0e-1111-2222-3333-444455556666"))
    assert sampled(src) == [3]  # the MIG device's GPU, once
    assert src.describe()["gpus"][0]["chosen_by"] == f"UUID prefix {uuid3[:12]} ({uuid3})"
    # the container toolkit's <gpu>:<mig> and a PCI bus id
    docker = GpuSelection(LIST, ("2:0", "3b:00.0"), NVML_IDS, origin="t")
    src = opened(mixed_host(), docker)
    assert sampled(src) == [2, 1]
    assert [g["chosen_by"] for g in src.describe()["gpus"]] == [
        "MIG device 2:0: its whole GPU, NVML index 2",
        "PCI bus id 3b:00.0",
    ]


def test_cuda_stops_at_the_first_id_it_does_not_know() -> None:
    nvml = mixed_host()
    sel = cuda(f"{nvml.nvmlDeviceGetUUID(2)},7,{nvml.nvmlDeviceGetUUID(3)}")
    src = opened(nvml, sel)
    assert sampled(src) == [2]
    assert src.describe()["unmatched"] == ["7", nvml.nvmlDeviceGetUUID(3)]
    # an ambiguous UUID prefix names no GPU
    src = GpuSource(four_gpus(), cuda("GPU-5e1ab"))
    assert src.open() == (
        "none of the server's GPUs (CUDA_VISIBLE_DEVICES=GPU-5e1ab (the job's environment)) is "
        "among the 4 NVML lists (unmatched: GPU-5e1ab)"
    )


def test_a_server_without_gpu_samples_none(tmp_path: Path) -> None:
    nvml = four_gpus(busy=0)
    tel = PointTelemetry(
        FAST, None, None, host=HostAccess(nvml), gpus=server_gpus("cpu", None, {}, {})
    )
    with tel:
        t0 = time.time_ns()
        time.sleep(0.1)
        t1 = time.time_ns()
    summary = tel.finish(tmp_path, t0, t1)
    assert summary["gpu"]["absent"] == "the server is given no GPU (runtime.device: cpu)"
    assert summary["gpu"]["selection"]["how"] == NONE
    assert nvml.inits == 1 and nvml.shutdowns == 1
    # the utilization is then the server's CPU's, not a GPU's
    assert telemetry_columns(summary)["gpu_util_pct_mean"] is None


def test_resolve_is_pure() -> None:
    gpus = [NvmlGpu(0, "GPU-a", None, "X"), NvmlGpu(1, "GPU-b", None, "X")]

    def lookup(kind: str, token: str) -> int | None:
        return {"GPU-a": 0, "GPU-b": 1}.get(token) if kind == "uuid" else None

    res = resolve(GpuSelection(LIST, ("GPU-b", "GPU-b", "1"), NVML_IDS), gpus, lookup)
    assert res.chosen == [(1, "UUID GPU-b")] and res.unmatched == [] and res.ambiguous is None
    assert resolve(GpuSelection(NONE), gpus, lookup).chosen == []
    assert [i for i, _ in resolve(GpuSelection(ALL), gpus, lookup).chosen] == [0, 1]


# --- the sweep hands the selection to every point's telemetry ----------------------------------


def test_a_sweep_point_samples_the_servers_gpu_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PointJob.measure with the real PointTelemetry, NVML replaced by a 4-GPU fake and the
    server's selection as the sweep computes it from a docker launch's device list."""
    import servelab.measure.point as sweep

    nvml = four_gpus(busy=3)
    monkeypatch.setitem(sys.modules, "pynvml", nvml)

    def fake_run_point(
        _c: Any, prompts: Any, conc: int, label: str, out: PointRun, **_opts: Any
    ) -> PointRun:
        out.started_epoch_ns = time.time_ns()
        time.sleep(0.2)
        out.records = [
            RequestRecord(
                f"{label}-{i}",
                out.started_epoch_ns,
                chunk_offsets_us=[1000, 2000],
                done_offset_us=2000,
                prompt_tokens=4,
                output_tokens=50,
                ok=True,
            )
            for i in range(conc)
        ]
        out.finished_epoch_ns = time.time_ns()
        return out

    monkeypatch.setattr(sweep, "run_point", fake_run_point)
    job = fake_point_job(tmp_path, server_gpus("gpu", _container("docker", ("3",)), {}, {}))
    job.measure(Slot(repeat=1, level=Level.at_concurrency(2), position=0, run_index=0), 0, "1/1")
    point = json.loads(
        (tmp_path / "exp" / "raw" / "fake" / "rep01" / "c0002" / "point.json").read_text()
    )
    schema = json.loads((REPO / "src" / "servelab" / "schemas" / "point.schema.json").read_text())
    jsonschema.validate(point, schema)
    tel = point["telemetry"]
    assert [d["device"] for d in tel["gpu"]["devices"]] == [3]
    assert (
        tel["gpu"]["devices"][0]["chosen_by"] == "NVML index 3 (the container toolkit's numbering)"
    )
    assert telemetry_columns(tel)["gpu_util_pct_mean"] == 97.0
    assert tel["energy"]["source"] == "nvml" and tel["energy"]["output_tokens"] == 100
    assert tel["energy"]["joules_per_output_token"] == pytest.approx(tel["energy"]["joules"] / 100)


# --- a container's launch: the GPUs it gives the server, then those sampled --------------------


def _container_launch(
    nvml: FakeNVML, environ: dict[str, str], monkeypatch: pytest.MonkeyPatch, gpus: int = 1
) -> ContainerRun:
    """The docker container of a runtime.gpus `gpus` server launched from `environ` on the host
    of `nvml`, as the sweep builds it."""
    from experiment_fixtures import measure_job
    from test_container import PINNED, gpu_cfg, runtime_record, with_choice

    from servelab.env.container import container_run_for

    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    cfg = gpu_cfg(gpus=gpus)
    recorded = with_choice(cfg, runtime_record(), environ, nvml)  # the runtime stage's choice
    job = measure_job(cfg, Path("/r/knee"), runtime=recorded)
    run = container_run_for(job, "tp1", purpose="sweep")
    assert run is not None and run.image == PINNED
    return run


def test_an_8_gpu_host_serving_on_one_gpu_samples_that_gpu_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """runtime.gpus 1, no GPU named, no CUDA_VISIBLE_DEVICES, 8 GPUs: the container gets one GPU
    by UUID and only it is sampled, so energy per token and utilization are that GPU's, not
    those of 7 idle ones besides (8x the energy, 1/8 the utilization)."""
    nvml = FakeNVML([device(mem_used=2**30)] + [idle(mem_used=2**31) for _ in range(7)])
    run = _container_launch(nvml, {}, monkeypatch)
    assert run.gpus == (fake_uuid(0),)
    sel = server_gpus("gpu", run, {}, {})
    tel = PointTelemetry(FAST, None, None, host=HostAccess(nvml), gpus=sel)
    with tel:
        t0 = time.time_ns()
        time.sleep(0.3)
        t1 = time.time_ns()
    summary = tel.finish(tmp_path, t0, t1, output_tokens=1000)
    cols = telemetry_columns(summary)
    assert cols["gpu_devices"] == 1 and cols["gpu_uuids"] == fake_uuid(0)
    assert cols["gpu_util_pct_mean"] == 97.0  # not (97 + 7 x 0) / 8
    window_s = (t1 - t0) / 1e9
    assert summary["energy"]["joules"] == pytest.approx(350.0 * window_s, rel=0.05)
    launch = summary["gpu"]["selection"]["launch"]
    assert launch["rule"] == "least_memory_used" and launch["ids"] == [fake_uuid(0)]
    assert launch["chosen_by"] == ["NVML index 0, 1024 MiB in use"]
    assert "least memory in use" in cols["gpu_selection"]


def test_a_cuda_index_the_launch_turned_into_a_uuid_stays_ambiguous(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CUDA_VISIBLE_DEVICES=0 in CUDA's default order on a host whose GPUs differ: docker gets
    NVML index 0's UUID; telemetry samples that GPU by UUID and still says the choice may not be
    the GPU the job was given."""
    run = _container_launch(mixed_host(), {"CUDA_VISIBLE_DEVICES": "0"}, monkeypatch)
    nvml = mixed_host()
    assert run.gpus == (nvml.nvmlDeviceGetUUID(0),)
    sel = server_gpus("gpu", run, {}, {})
    assert sel.ambiguous is not None and sel.namespace == NVML_IDS
    src = opened(nvml, sel)
    assert sampled(src) == [0]
    d = src.describe()
    assert d["gpus"][0]["chosen_by"] == f"UUID {nvml.nvmlDeviceGetUUID(0)}"
    assert d["ambiguous"].startswith("CUDA index 0 without CUDA_DEVICE_ORDER=PCI_BUS_ID")
    assert d["launch"]["rule"] == "CUDA_VISIBLE_DEVICES"
    tel = PointTelemetry(FAST, None, None, host=HostAccess(mixed_host()), gpus=sel)
    with tel:
        t0 = time.time_ns()
        time.sleep(0.1)
        t1 = time.time_ns()
    cols = telemetry_columns(tel.finish(tmp_path, t0, t1))
    assert cols["gpu_selection_ambiguous"].startswith("CUDA index 0 without")
    # with CUDA_DEVICE_ORDER=PCI_BUS_ID nothing is ambiguous
    env = {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    exact = server_gpus("gpu", _container_launch(mixed_host(), env, monkeypatch), {}, {})
    assert exact.ambiguous is None


def fake_point_job(tmp_path: Path, gpus: Any) -> Any:
    """A PointJob of a fake server configuration (no server: run_point is the test's), its
    points under tmp_path/exp."""
    import servelab.measure.point as sweep

    server = SimpleNamespace(telemetry_process=lambda: None, alive_after=lambda records: True)
    return sweep.PointJob(
        sc="fake",
        session=SimpleNamespace(server=server),
        client=SimpleNamespace(base_url=None),
        paths=ExperimentPaths(tmp_path / "exp"),
        workload=SimpleNamespace(
            waves=1,
            input_tokens=4,
            output_tokens=50,
            ignore_eos=True,
            unique_prompts=True,
            client_workers=1,
            dataset=None,
            shared_prefix=None,
            chat=None,
        ),
        sweep=SimpleNamespace(order="latin"),
        telemetry=FAST,
        prompts=["p"] * 4,
        launch_index=1,
        orders={1: [2]},
        say=lambda s: None,
        gpus=gpus,
    )


def test_ctrl_c_once_a_points_folder_exists_keeps_it_as_incomplete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A point's folder appears only where an interrupt is caught: Ctrl-C while its samplers
    start (the folder exists) keeps the point as <point>.incomplete/ with its point.json, and
    Ctrl-C before that (while its facts are gathered) leaves no folder, so nothing is half
    written. Before, the folder was made first, and Ctrl-C in between left a bare .partial."""
    import servelab.measure.point as sweep

    slot = Slot(repeat=1, level=Level.at_concurrency(2), position=0, run_index=0)
    rep = tmp_path / "exp" / "raw" / "fake" / "rep01"

    def interrupted(*_a: Any, **_k: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep.PointTelemetry, "start", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fake_point_job(tmp_path, None).measure(slot, 0, "1/1")
    kept = json.loads((rep / "c0002.incomplete" / "point.json").read_text())
    assert kept["status"] == "incomplete" and "interrupted" in kept["error"]
    assert not (rep / "c0002.partial").exists()

    monkeypatch.setattr(sweep.PointJob, "point_info", interrupted)
    with pytest.raises(KeyboardInterrupt):
        fake_point_job(tmp_path / "second", None).measure(slot, 0, "1/1")
    assert not (tmp_path / "second" / "exp" / "raw" / "fake" / "rep01").exists() or not any(
        (tmp_path / "second" / "exp" / "raw" / "fake" / "rep01").iterdir()
    )
