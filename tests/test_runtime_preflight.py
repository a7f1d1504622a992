"""The runtime stage's checks before any server starts, without docker, a GPU or vLLM: the GPU
pre-flight (servelab.env.runtime.gpu: NVML's compute capability per GPU against the image's
PyTorch build and each quantization's minimum) and the host's Nsight Systems run inside the
image (servelab.env.runtime.nsys.nsys_in_image). The engine is tests/fake_docker.py (the Engine
of tests/test_runtime_container.py); NVML is a fake module; the image's PyTorch and vLLM are
small packages in the fake image's site folder."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from test_runtime_container import (
    IMAGE,
    NSYS_STATUS,
    PINNED,
    REPO,
    Engine,
    config,
    host_install,
    no_host_nsys,
    runtime_stage,
)

from servelab.config import validate
from servelab.env.container import CONTAINER_NSYS_ROOT
from servelab.env.runtime.gpu import QUANT_MIN_CAPABILITY, arch_runs, quantizations
from servelab.errors import ServelabError
from servelab.experiment import Experiment

V100_CONFIG = REPO / "config" / "experiments" / "v100-awq-max-num-seqs.yaml"
CU129 = "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120"  # no Volta (PyTorch 2.11 on)
CU126 = "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90"  # PyTorch's CUDA 12.6 builds
V100 = ("Tesla V100-SXM2-32GB", (7, 0))
A100 = ("NVIDIA A100-SXM4-80GB", (8, 0))


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Engine:
    return Engine(tmp_path, monkeypatch)


class HostNVML:
    """pynvml on a host with these GPUs (name, compute capability), in NVML's index order,
    and a driver that supports CUDA `cuda` (as nvmlSystemGetCudaDriverVersion: 12080 = 12.8)."""

    def __init__(self, *gpus: tuple[str, tuple[int, int]], cuda: int = 12080) -> None:
        self.gpus, self.cuda = gpus, cuda

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> str:
        return self.gpus[h][0]

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return self.gpus[h][1]

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.211.01"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self.cuda


def image_site(engine: Engine) -> Path:
    return engine.bin.parent / "image-site"  # what the Engine puts on the image's PYTHONPATH


def image_torch(engine: Engine, version: str, cuda: str, arch: str) -> None:
    """A PyTorch in the fake image: its version, torch.version.cuda and the arch list the
    build holds (torch._C._cuda_getArchFlags, which torch.cuda.get_arch_list reads)."""
    pkg = image_site(engine) / "torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "from types import SimpleNamespace\n"
        f"__version__ = {version!r}\n"
        f"version = SimpleNamespace(cuda={cuda!r})\n"
        f"_C = SimpleNamespace(_cuda_getArchFlags=lambda: {arch!r})\n"
    )


def image_vllm_quantization(engine: Engine, body: str) -> None:
    """vllm.model_executor.layers.quantization in the fake image; body defines
    get_quantization_config(name) (vLLM's own function of that name)."""
    pkg = image_site(engine) / "vllm" / "model_executor" / "layers" / "quantization"
    pkg.mkdir(parents=True)
    for d in (pkg.parent.parent, pkg.parent):
        (d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(body)


def v100_study(tmp_path: Path) -> dict[str, Any]:
    """config/experiments/v100-awq-max-num-seqs.yaml with its model pinned, results here."""
    raw = yaml.safe_load(V100_CONFIG.read_text())
    raw["model"].update(repo="Qwen/Qwen2.5-7B-Instruct-AWQ", revision="a" * 40)
    raw["results_dir"] = str(tmp_path / "results")
    return validate(raw, str(V100_CONFIG)).to_dict()


def test_v100_study_with_its_pinned_image_is_refused_in_one_line_before_any_server(
    engine: Engine, tmp_path: Path
) -> None:
    """The pinned vLLM 0.27.1 image on two V100s: its PyTorch (CUDA 12.9) holds no sm_70
    kernels and vLLM's awq needs 7.5. The runtime stage stops, in one line, before the model,
    any server or the profiling pass."""
    image_torch(engine, "2.13.0+cu129", "12.9", CU129)
    cfg = v100_study(tmp_path)
    assert cfg["runtime"]["image"] == IMAGE and cfg["runtime"]["gpus"] == 2
    with pytest.raises(ServelabError) as err:
        runtime_stage(cfg, str, no_host_nsys, nvml=HostNVML(V100, V100))
    assert str(err.value) == (
        "runtime: GPU 0 (Tesla V100-SXM2-32GB) has compute capability 7.0: the image's "
        f"PyTorch 2.13.0+cu129 (CUDA 12.9) has no kernels for it (built for {CU129}); "
        "server.args.quantization awq needs 7.5 (servelab's table); pin runtime.image to an "
        "image whose PyTorch is built for sm_70, or set server.args.quantization to a method "
        "that runs on 7.0 (bitsandbytes, gguf, gptq), or run on GPUs of compute capability "
        "7.5 or newer"
    )
    runs = [c for c in engine.calls() if c[0] == "run"]
    assert len(runs) == 2  # the image's probe, then the GPU pre-flight's: no server
    assert runs[1][runs[1].index("--entrypoint") + 1] == "python3" and "awq" in runs[1]
    assert not [c for c in engine.calls() if "serve" in c or CONTAINER_NSYS_ROOT in " ".join(c)]


def test_a_volta_build_whose_vllm_runs_awq_there_passes_and_is_recorded(
    engine: Engine, tmp_path: Path
) -> None:
    """An image built for sm_70 whose vLLM says awq runs from 7.0 once runtime.env asks for
    its Volta kernels (as a V100 fork of vLLM does): the vLLM in the image decides, not the
    table; its PyTorch's CUDA version and arch list are recorded."""
    image_torch(engine, "2.9.1+cu128", "12.8", "sm_70 sm_75 sm_80 sm_86 sm_90 sm_100 sm_120")
    image_vllm_quantization(
        engine,
        "import os\n"
        "class AWQ:\n"
        "    @classmethod\n"
        "    def get_min_capability(cls):\n"
        "        return 70 if os.environ.get('VLLM_SM70_AWQ') == '1' else 75\n"
        "def get_quantization_config(name):\n"
        "    return {'awq': AWQ}[name]\n",
    )
    cfg = v100_study(tmp_path)
    cfg["runtime"]["env"] = {"VLLM_SM70_AWQ": "1"}
    said: list[str] = []
    rec = runtime_stage(cfg, said.append, no_host_nsys, nvml=HostNVML(V100, V100))
    assert "runtime: GPUs 0 (7.0), 1 (7.0) can run it" in said
    assert rec["torch_build"] == {
        "torch_version": "2.9.1+cu128",
        "cuda": "12.8",
        "arch_list": ["sm_70", "sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"],
        "error": None,
    }
    check = rec["gpu_check"]
    assert check["status"] == "ok" and check["reason"] is None
    assert check["gpus"] == [
        {"index": i, "name": V100[0], "compute_capability": "7.0", "arch_ok": True} for i in (0, 1)
    ]
    assert check["quantization"] == [
        {
            "method": "awq",
            "where": "server.args.quantization",
            "min_capability": "7.0",
            "source": "the image's vLLM 0.27.1",
        }
    ]
    # the CUDA its PyTorch is built with, for the launch to compare with the driver's
    assert rec["torch_cuda"] == "12.8"
    probe = [c for c in engine.calls() if c[0] == "run"][-1]
    assert probe[probe.index("-e") + 1] == "VLLM_SM70_AWQ"  # by name, as to the server
    schema = json.loads((REPO / "src/servelab/schemas/runtime.schema.json").read_text())
    jsonschema.validate(rec, schema)
    # without the variable the same vLLM says 7.5: refused, naming where that came from
    cfg["runtime"]["env"] = {}
    with pytest.raises(ServelabError, match=r"awq needs 7\.5 \(the image's vLLM 0\.27\.1\)"):
        runtime_stage(cfg, str, no_host_nsys, nvml=HostNVML(V100, V100))


def test_only_the_servers_gpus_are_checked_and_a_configs_own_quantization_is_named(
    engine: Engine, tmp_path: Path
) -> None:
    image_torch(engine, "2.9.1+cu126", "12.6", CU126)
    cfg = config(tmp_path, gpu_devices=["1"])
    cfg["server"]["configs"] = [{"name": "int4", "args": {"quantization": "awq"}}]
    nvml = HostNVML(V100, A100)  # GPU 0 is a V100 the server does not get
    rec = runtime_stage(cfg, str, nvml=nvml)
    assert [(g["index"], g["compute_capability"]) for g in rec["gpu_check"]["gpus"]] == [(1, "8.0")]
    cfg = config(tmp_path, gpu_devices=["0", "1"])
    cfg["server"]["configs"] = [{"name": "int4", "args": {"quantization": "awq"}}]
    with pytest.raises(ServelabError) as err:
        runtime_stage(cfg, str, nvml=nvml)
    assert str(err.value).startswith(
        "runtime: GPU 0 (Tesla V100-SXM2-32GB) has compute capability 7.0: "
        "server.configs[int4].args.quantization awq needs 7.5 (servelab's table); set "
        "server.configs[int4].args.quantization to a method that runs on 7.0"
    )


def test_without_nvml_nothing_is_compared_and_the_stage_goes_on(
    engine: Engine, tmp_path: Path
) -> None:
    image_torch(engine, "2.13.0+cu129", "12.9", CU129)
    said: list[str] = []
    rec = runtime_stage(v100_study(tmp_path), said.append, no_host_nsys)
    assert rec["gpu_check"]["status"] == "unchecked" and rec["gpu_check"]["gpus"] == []
    assert "runtime: GPUs not checked: NVML unavailable: NVML Shared Library Not Found" in said
    assert rec["torch_build"]["arch_list"] == CU129.split()  # recorded all the same


@pytest.mark.parametrize(
    ("cc", "arch", "runs"),
    [
        ((7, 0), CU129, False),  # no cubin for major 7 at minor 0, PTX only for 12.0
        ((7, 0), CU126, True),
        ((8, 6), "sm_80", True),  # a cubin runs at a higher minor of its major
        ((8, 0), "sm_86", False),  # not at a lower one
        ((9, 0), "sm_80", False),  # nor on another major
        ((9, 0), "compute_80", True),  # PTX is compiled for any newer GPU
        ((9, 0), "sm_90a", True),  # arch-specific: that capability only
        ((10, 3), "sm_100a", False),
        ((12, 0), "sm_120 compute_120", True),
        ((7, 0), "", False),
        ((7, 0), "gfx90a sm_x0", False),
    ],
)
def test_arch_runs_follows_cudas_binary_compatibility(
    cc: tuple[int, int], arch: str, runs: bool
) -> None:
    assert arch_runs(cc, arch.split()) is runs


def test_quantizations_are_read_where_vllm_takes_them(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    cfg["server"]["args"] = {"quantization": "awq"}
    cfg["server"]["configs"] = [
        {"name": "shared"},
        {"name": "gptq", "args": {"quantization": "gptq"}},
        {"name": "fp8", "args": {"quantization": "fp8"}},
        {"name": "again", "args": {"max-num-seqs": 2}},
    ]
    uses = quantizations(Experiment.from_dict(validate(cfg, "t").to_dict()).server)
    assert [(u.method, u.where) for u in uses] == [
        ("awq", "server.args.quantization"),
        ("gptq", "server.configs[gptq].args.quantization"),
        ("fp8", "server.configs[fp8].args.quantization"),
    ]
    assert quantizations(None) == []
    assert QUANT_MIN_CAPABILITY["awq"] == 75 and QUANT_MIN_CAPABILITY["gptq"] == 60


# --- the host's Nsight Systems, run inside the image --------------------------------------


def test_the_hosts_nsys_is_run_inside_the_image_in_the_runtime_stage(
    engine: Engine, tmp_path: Path
) -> None:
    cfg = config(tmp_path, nsys="/opt/none/nsys")
    nsys, globs = host_install(tmp_path / "host")
    rec = runtime_stage(cfg, str, no_host_nsys, globs)
    inside = f"{CONTAINER_NSYS_ROOT}/target-linux-x64/nsys"
    assert rec["host_nsys"]["path"] == str(nsys)
    assert rec["host_nsys_in_image"] == {
        "runs": True,
        "executable": inside,
        "mount": f"{nsys.parent.parent}:{CONTAINER_NSYS_ROOT}:ro",
        "version_text": "NVIDIA Nsight Systems version 2025.5.1.121-255136380782v0",
        "status_exit": 0,
        "status": list(NSYS_STATUS),
        "reason": None,
    }
    checks = [c for c in engine.calls() if c[0] == "run" and inside in c]
    assert [c[c.index(PINNED) :] for c in checks] == [
        [PINNED, "--version"],
        [PINNED, "status", "--environment"],
    ]
    assert all("--gpus" not in c for c in checks)
    schema = json.loads((REPO / "src/servelab/schemas/runtime.schema.json").read_text())
    jsonschema.validate(rec, schema)


def test_a_hosts_nsys_that_cannot_run_in_the_image_is_a_reason_or_stops_a_required_profile(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An nsys that runs on the host but not in the image (here: it needs a variable the
    container does not get, as an nsys built for a newer glibc needs the host's libraries)."""
    missing = "nsys: error while loading shared libraries: libstdc++.so.6: version not found"
    guard = f'[ -n "$ON_THE_HOST" ] || {{ echo "{missing}" >&2; exit 127; }}'
    monkeypatch.setenv("ON_THE_HOST", "1")
    nsys, globs = host_install(tmp_path / "host", guard=guard)
    cfg = config(tmp_path, nsys="/opt/none/nsys")
    said: list[str] = []
    rec = runtime_stage(cfg, said.append, no_host_nsys, globs)
    assert rec["host_nsys"]["path"] == str(nsys)  # it answers on the host
    ran = rec["host_nsys_in_image"]
    reason = (
        f"the host's Nsight Systems {nsys} does not run in {PINNED} (nsys --version: {missing})"
    )
    assert ran["runs"] is False and ran["reason"] == reason
    assert f"runtime: {reason}" in said
    cfg["profile"]["required"] = True
    with pytest.raises(ServelabError) as err:
        runtime_stage(cfg, str, no_host_nsys, globs)
    msg = str(err.value)
    assert msg.startswith(
        f"profile.required is true but /opt/none/nsys is not in {PINNED} and {reason}; "
    )
    assert "\n" not in msg
    assert not [c for c in engine.calls() if "serve" in c]
    assert re.search(r"servelab-nsys-check-\d+", " ".join(engine.calls()[-1]))


class UsedNVML(HostNVML):
    """HostNVML whose GPUs also have a UUID, a PCI bus id and memory in use (MiB, in order)."""

    def __init__(self, used_mib: tuple[int, ...], *gpus: tuple[str, tuple[int, int]]) -> None:
        super().__init__(*gpus)
        self.used = used_mib

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h:08d}-aaaa-bbbb-cccc-dddddddddddd"

    def nvmlDeviceGetPciInfo(self, h: int) -> Any:
        return type("Pci", (), {"busId": f"00000000:{h + 1:02X}:00.0"})()

    def nvmlDeviceGetMemoryInfo(self, h: int) -> Any:
        return type("Mem", (), {"used": self.used[h] << 20, "total": 32 << 30})()


def test_the_preflight_checks_the_gpus_the_container_launch_will_get() -> None:
    """In a container the pre-flight looks at the GPUs the launch will give the server: with
    none named, the runtime.gpus GPUs with the least memory in use, by UUID. A busy V100 beside
    an idle A100 is not what an AWQ server on one GPU gets, so it is not what is compared."""
    from types import SimpleNamespace

    from servelab.env.runtime.gpu import _selected, server_gpus
    from servelab.hostfacts.gpu import gpu_facts

    nvml = UsedNVML((20000, 10), V100, ("NVIDIA A100-SXM4-40GB", (8, 0)))
    rt = SimpleNamespace(kind="docker", gpus=1, gpu_devices=None)
    chosen = server_gpus(rt, {}, nvml)  # type: ignore[arg-type]
    assert chosen == ("GPU-00000001-aaaa-bbbb-cccc-dddddddddddd",)
    picked = _selected(list(gpu_facts(nvml)["gpus"]), chosen)
    assert [g["name"] for g in picked] == ["NVIDIA A100-SXM4-40GB"]
    # a venv server sees what CUDA_VISIBLE_DEVICES shows it
    venv = SimpleNamespace(kind="venv", gpus=1, gpu_devices=None)
    assert server_gpus(venv, {"CUDA_VISIBLE_DEVICES": "1"}, nvml) == ("1",)  # type: ignore[arg-type]
    assert server_gpus(venv, {}, nvml) == "all"  # type: ignore[arg-type]


def test_the_runtime_stage_records_the_gpus_every_launch_takes(
    engine: Engine, tmp_path: Path
) -> None:
    """The stage chooses the container's GPUs once for the run (none named: the least memory
    in use) and records them in runtime.json by UUID, with their NVML index and why; its probe
    ran with them."""
    image_torch(engine, "2.9.1+cu126", "12.6", CU126)
    said: list[str] = []
    nvml = UsedNVML((20000, 10), V100, A100)
    rec = runtime_stage(config(tmp_path), said.append, nvml=nvml)
    uuid = "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd"
    choice = rec["gpu_choice"]
    assert choice["ids"] == [uuid] and choice["indices"] == [1]
    assert choice["rule"] == "least_memory_used" and choice["chosen_by"] == [
        "NVML index 1, 10 MiB in use"
    ]
    assert any(line.startswith(f"runtime: GPUs {uuid} for every launch (") for line in said)
    probe = [c for c in engine.calls() if c[0] == "run"][-1]
    assert probe[probe.index("--gpus") + 1] == f'"device={uuid}"'
    schema = json.loads((REPO / "src/servelab/schemas/runtime.schema.json").read_text())
    jsonschema.validate(rec, schema)
