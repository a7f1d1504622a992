"""The container path without docker, a GPU or vLLM: tests/fake_docker.py as `docker` on PATH,
tests/fake_vllm_server.py as the server inside, tests/fake_nsys.py as the image's nsys. The
runtime stage, a sweep and a profiling pass run against them."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from experiment_fixtures import measure_job
from nsys_fixture import model_config

from servelab.config import validate
from servelab.env.container import CONTAINER_NSYS_ROOT
from servelab.env.engine_shim import SHIM
from servelab.env.runtime import HostTools, ensure_container, ensure_runtime
from servelab.errors import ServelabError
from servelab.experiment import Experiment
from servelab.measure.sweep import run_sweep
from servelab.profile.capture import run_profile
from servelab.profile.report import analyze_capture
from servelab.store.jsonio import read_json

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
DIGEST = "sha256:6666717cd1cadf9adfff8abec9c3f2eca6e27e742de06fe7d7f129fa3d647732"
IMAGE = f"vllm/vllm-openai:v0.27.1-x86_64-cu129@{DIGEST}"
PINNED = f"vllm/vllm-openai@{DIGEST}"


class Engine:
    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bin = root / "bin"
        self.state = root / "docker-state"
        site = root / "image-site"  # what `import vllm` finds "inside the image"
        cli = site / "vllm" / "entrypoints" / "cli"
        for d in (
            self.bin,
            self.state,
            site / "vllm" / "config",
            site / "vllm-0.27.1.dist-info",
            cli,
        ):
            d.mkdir(parents=True)
        (site / "vllm" / "__init__.py").write_text("")
        (site / "vllm" / "config" / "__init__.py").write_text("")
        (site / "vllm" / "config" / "profiler.py").write_text("")
        (cli / "main.py").write_text("")  # `vllm serve`
        (site / "vllm-0.27.1.dist-info" / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: vllm\nVersion: 0.27.1\n"
        )
        py = sys.executable
        self.script("docker", f'exec {py} {TESTS / "fake_docker.py"} "$@"')
        self.script(
            "python3",
            # the server's start through servelab's shim (python3 -c SHIM MODULE ...) reaches
            # the fake as `-m MODULE ...`
            'if [ "$1" = "-c" ] && [ "${3#vllm.}" != "$3" ]; then shift 2; set -- -m "$@"; fi\n'
            'if [ "$1" = "-m" ] && [ "$2" = "vllm.entrypoints.cli.main" ] && [ "$3" = serve ]\n'
            "then\n"
            f'  exec {py} {TESTS / "fake_vllm_server.py"} "$@"\nfi\n'
            'if [ "$1" = "-m" ] && [ "$2" = "vllm.entrypoints.openai.api_server" ]; then\n'
            f'  exec {py} {TESTS / "fake_vllm_server.py"} "$@"\nfi\n'
            f'exec {py} "$@"',
        )
        self.nsys = self.script(
            "nsys",
            'if [ "$1" = "--version" ]; then echo "NVIDIA Nsight Systems version 2025.5.1.121-fake";'
            f' exit 0; fi\nexec {py} {TESTS / "fake_nsys.py"} "$@"',
        )
        monkeypatch.setenv("PATH", f"{self.bin}:{os.environ['PATH']}")
        monkeypatch.setenv("FAKE_DOCKER_STATE", str(self.state))
        monkeypatch.setenv("FAKE_DOCKER_REPO_DIGEST", f"docker.io/{PINNED}")
        monkeypatch.setenv(
            "PYTHONPATH", os.pathsep.join([str(site), str(REPO / "src"), str(TESTS)])
        )

    def script(self, name: str, body: str) -> Path:
        path = self.bin / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
        return path

    def running(self) -> list[str]:
        """Containers whose process still runs (one-shot `run --rm` leave a stale pid file)."""
        out = []
        for f in (self.state / "containers").glob("*"):
            try:
                os.kill(int(f.read_text()), 0)
            except ProcessLookupError:
                continue
            out.append(f.name)
        return out

    def calls(self) -> list[list[str]]:
        path = self.state / "calls.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Engine:
    return Engine(tmp_path, monkeypatch)


def config(tmp_path: Path, nsys: str = "nsys", **runtime: Any) -> dict[str, Any]:
    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    raw["experiment"] = "fake-gpu"
    raw["results_dir"] = str(tmp_path / "results")
    raw["runtime"] = {"kind": "docker", "image": IMAGE, "device": "gpu", "gpus": 1, "env": {}}
    raw["runtime"].update(runtime)
    raw["server"].update(
        startup_timeout_s=60, shutdown_timeout_s=10, args={}, configs=[{"name": "fake"}]
    )
    raw["workload"].update(
        input_tokens=4, output_tokens=6, waves=1, warmup={"requests": 2, "concurrency": 2}
    )
    raw["sweep"] = {"concurrency": [1, 2], "repeats": 1, "order": "latin"}
    raw["telemetry"] = {"enabled": False}
    raw["profile"] = {
        "tool": "nsys",
        "nsys": nsys,
        "concurrency": [1, 2],
        "warmup_requests": 2,
        "report_timeout_s": 60,
    }
    return validate(raw, "test").to_dict()


def no_host_nsys(name: str) -> str | None:
    """shutil.which on a host without nsys on PATH (the engine is still found)."""
    return None if name == "nsys" else shutil.which(name)


class NoNVML:
    """pynvml on a host without the NVIDIA driver: nvmlInit fails."""

    def nvmlInit(self) -> None:
        raise RuntimeError("NVML Shared Library Not Found")


def runtime_stage(
    cfg: dict[str, Any],
    say: Callable[[str], None],
    which: Callable[[str], str | None] = shutil.which,
    nsys_globs: tuple[str, ...] = (),
    nvml: Any = None,
) -> dict[str, Any]:
    """The runtime stage of this config (the host's install folders: nsys_globs only; NVML:
    nvml, by default one that finds no driver)."""
    exp = Experiment.from_dict(cfg)
    tools = HostTools(which=which, nsys_globs=nsys_globs, nvml=nvml or NoNVML())
    return ensure_runtime(exp.runtime, exp.profile, None, say, tools=tools, server=exp.server)


# What `nsys status --environment` prints (the Nsight Systems User Guide's example, shortened)
NSYS_STATUS = (
    "Timestamp counter supported: Yes",
    "",
    "CPU Profiling Environment Check",
    "Root privilege: disabled",
    "Linux Kernel Paranoid Level = 4",
    "CPU Profiling Environment (process-tree): Fail",
)


def host_install(
    root: Path, version: str = "2025.5.1", guard: str = ""
) -> tuple[Path, tuple[str, ...]]:
    """An Nsight Systems install folder under root, as NVIDIA's nsight-systems-cli package
    lays it out (its nsys: tests/fake_nsys.py, which `status --environment` answers as
    NSYS_STATUS), and the pattern that finds it. guard: shell lines run first (a test's way
    to make it fail where it runs)."""
    nsys = root / "opt/nvidia/nsight-systems-cli" / version / "target-linux-x64" / "nsys"
    nsys.parent.mkdir(parents=True)
    status = "".join(f"echo '{line}'; " for line in NSYS_STATUS)
    nsys.write_text(
        f"#!/bin/sh\n{guard}\n"
        f'if [ "$1" = status ]; then {status}exit 0; fi\n'
        f'exec {sys.executable} {TESTS / "fake_nsys.py"} "$@"\n'
    )
    nsys.chmod(0o755)
    return nsys, (str(root / "opt/nvidia/nsight-systems-cli/*/target-linux-x64/nsys"),)


def model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    model_config(model / "config.json", 2)
    vocab = {f"w{i}": i for i in range(1, 60)}
    (model / "tokenizer.json").write_text(json.dumps({"model": {"vocab": vocab}}))
    return model


def test_missing_engine_is_one_line(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    with pytest.raises(ServelabError) as err:
        exp = Experiment.from_dict(cfg)
        ensure_container(exp.runtime, exp.profile, str, HostTools(which=lambda name: None))
    msg = str(err.value)
    assert msg.startswith("runtime.kind docker: 'docker' is not on PATH; install docker")
    assert "\n" not in msg


def test_runtime_stage_pulls_checks_the_digest_and_probes(engine: Engine, tmp_path: Path) -> None:
    cfg = config(tmp_path, nsys=str(engine.nsys))
    said: list[str] = []
    rec = runtime_stage(cfg, said.append)
    assert rec["kind"] == "container" and rec["engine"] == "docker"
    assert rec["engine_executable"] == str(engine.bin / "docker")
    assert rec["image"] == IMAGE and rec["image_ref"] == PINNED
    assert rec["image_digest"] == DIGEST
    assert rec["repo_digests"] == [f"docker.io/{PINNED}"]
    assert rec["labels"] == {"dev.servelab.vllm.version": "0.27.1"}
    assert rec["vllm_version"] == "0.27.1" and rec["packages"]["vllm"] == "0.27.1"
    assert rec["profiler_config"] is True and rec["vllm_cli"] is True
    assert rec["nsys"] == str(engine.nsys) and "2025.5.1" in rec["nsys_version"]
    assert "host_nsys" not in rec  # the image has one: the host's is not looked for
    assert rec["lock_sha256"] is None and rec["python"] == "python3"
    verbs = [c[:2] for c in engine.calls()]
    assert verbs == [
        ["version", "--format"],
        ["image", "inspect"],
        ["pull", PINNED],
        ["image", "inspect"],
        ["run", "--rm"],
        ["run", "--rm"],
    ]
    probe, gpu_probe = engine.calls()[-2:]
    assert "--gpus" not in probe and probe[probe.index("--entrypoint") + 1] == "python3"
    # the GPU pre-flight's probe gets the GPUs the launch will give the server (runtime.gpus 1;
    # without NVML to list them, NVML index 0); without NVML nothing is compared
    assert gpu_probe[gpu_probe.index("--gpus") + 1] == '"device=0"'
    assert rec["gpu_check"]["status"] == "unchecked"
    assert rec["gpu_check"]["reason"] == "NVML unavailable: NVML Shared Library Not Found"
    assert any("pulling" in s for s in said)
    import jsonschema

    schema = json.loads((REPO / "src/servelab/schemas/runtime.schema.json").read_text())
    jsonschema.validate(rec, schema)
    # present now: no second pull
    again = runtime_stage(cfg, str)
    assert again["image_digest"] == DIGEST
    assert [c[0] for c in engine.calls()].count("pull") == 1


def test_another_digest_is_refused(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_DOCKER_PRESENT", "1")
    other = "sha256:" + "1" * 64
    monkeypatch.setenv("FAKE_DOCKER_REPO_DIGEST", f"vllm/vllm-openai@{other}")
    cfg = config(tmp_path)
    with pytest.raises(ServelabError) as err:
        runtime_stage(cfg, str)
    msg = str(err.value)
    assert msg.startswith(f"runtime.image: pinned {DIGEST} but the local image {PINNED} carries")
    assert other in msg and "\n" not in msg


def test_required_nsys_missing_from_the_image_and_the_host_stops_the_runtime_stage(
    engine: Engine, tmp_path: Path
) -> None:
    cfg = config(tmp_path, nsys="/opt/none/nsys")
    cfg["profile"]["required"] = True
    with pytest.raises(
        ServelabError, match="profile.required is true but /opt/none/nsys is not in .* and nsys"
    ):
        runtime_stage(cfg, str, no_host_nsys)
    # the host's Nsight Systems, in its install folder, will do: found, its version recorded
    nsys, globs = host_install(tmp_path)
    rec = runtime_stage(cfg, str, no_host_nsys, globs)
    assert rec["nsys"] is None
    assert rec["host_nsys"] == {
        "path": str(nsys),
        "found_by": "install folder",
        "version": "2025.5.1.121",
        "version_text": "NVIDIA Nsight Systems version 2025.5.1.121-255136380782v0",
        "install_dir": str(nsys.parent.parent),
    }
    import jsonschema

    schema = json.loads((REPO / "src/servelab/schemas/runtime.schema.json").read_text())
    jsonschema.validate(rec, schema)
    cfg["profile"]["required"] = False
    rec = runtime_stage(cfg, str, no_host_nsys)
    assert rec["nsys"] is None and rec["nsys_version"] is None and rec["host_nsys"] is None
    assert rec["host_nsys_reason"].startswith("nsys (/opt/none/nsys) not found on this host")


def test_sweep_runs_the_server_in_the_container_and_stops_it(
    engine: Engine, tmp_path: Path
) -> None:
    cfg = config(tmp_path, env={"SERVELAB_TEST_SECRET_TOKEN": "tok-123-secret"})
    runtime = runtime_stage(cfg, str)
    exp = tmp_path / "results" / "fake-gpu"
    model = model_dir(tmp_path)
    # a container left behind by a job killed outright: removed by name before the start
    key = hashlib.sha256(str(exp.resolve()).encode()).hexdigest()[:8]
    stale = subprocess.Popen(["sleep", "60"])
    (engine.state / "containers").mkdir(exist_ok=True)
    (engine.state / "containers" / f"servelab-fake-gpu-fake-sweep-{key}").write_text(str(stale.pid))
    run = run_sweep(measure_job(cfg, exp, model_dir=model, runtime=runtime), "fake")
    assert stale.wait(timeout=10) == -9
    assert run["status"] == "complete" and run["points"] == 2
    launch = read_json(exp / "server" / "fake" / "launch.json")
    name = launch["container"]
    cmd = launch["command"]
    assert cmd[:6] == [str(engine.bin / "docker"), "run", "--rm", "--init", "--name", name]
    assert f"{model.resolve()}:/model:ro" in cmd and PINNED in cmd
    assert "tok-123-secret" not in json.dumps(launch)
    assert launch["runtime_image_digest"] == DIGEST
    # which GPU the container got, and why, is in launch.json too (telemetry off or on)
    gpus = launch["gpus"]
    assert gpus["ids"] == [cmd[cmd.index("--gpus") + 1].strip('"').removeprefix("device=")]
    assert gpus["rule"] and gpus["origin"]
    assert gpus["ids"] == runtime["gpu_choice"]["ids"]  # the runtime stage's choice for the run
    calls = engine.calls()
    runs = [i for i, c in enumerate(calls) if c[0] == "run" and name in c]
    assert len(runs) == 1
    # before the start: a stale container of the name removed, and checked gone
    assert calls[runs[0] - 2 : runs[0]] == [
        ["rm", "--force", name],
        ["container", "inspect", "--format", "{{.Id}}", name],
    ]
    # the GPU canary: in the image with the server's GPU, before the start and after the stop
    box = f"{name}-canary"
    canary = [c for c in calls if c[0] == "run" and box in c]
    assert len(canary) == 2 and all(
        c[c.index("--gpus") + 1] == cmd[cmd.index("--gpus") + 1] for c in canary
    )
    # each timed only once what a killed job left on the GPU is gone: the stale container of
    # the server's name (removed before anything was timed), then one of the canary's
    first = calls.index(canary[0])
    assert calls[first - 4 : first] == [
        ["rm", "--force", name],
        ["container", "inspect", "--format", "{{.Id}}", name],
        ["rm", "--force", box],
        ["container", "inspect", "--format", "{{.Id}}", box],
    ]
    assert calls.index(["rm", "--force", name]) == first - 4
    after = [c for c in calls[runs[0] + 1 :] if box not in c]
    assert ["stop", "-t", "10", name] in after and after[-2] == ["rm", "--force", name]
    assert after[-1] == ["container", "inspect", "--format", "{{.Id}}", name]  # gone
    assert not any("--time" in c for c in calls)  # deprecated in docker's CLI
    # the fake image has no PyTorch: the canary is absent, with why, and the sweep went on
    gpu = run["canary"]["gpu"]
    assert gpu["present"] is False and "PyTorch is not importable" in gpu["reason"]
    assert cmd[cmd.index(PINNED) + 1 : cmd.index(PINNED) + 6] == [
        "-c",
        SHIM,
        "vllm.entrypoints.cli.main",
        "serve",
        "/model",
    ]
    assert not (engine.state / "containers" / name).exists()
    assert ["inspect", "--format", "{{.State.Pid}}", name] in after  # telemetry's process tree


def test_sweep_gives_each_point_its_own_prompts_also_when_resumed(
    engine: Engine, tmp_path: Path
) -> None:
    import gzip
    import shutil

    import jsonschema

    cfg = config(tmp_path)
    runtime = runtime_stage(cfg, str)
    exp = tmp_path / "results" / "fake-gpu"
    model = model_dir(tmp_path)
    run = run_sweep(measure_job(cfg, exp, model_dir=model, runtime=runtime), "fake")
    raw = exp / "raw" / "fake"
    schema = json.loads((REPO / "src/servelab/schemas/point.schema.json").read_text())
    points = {}
    for slot in run["plan"]:
        pj = read_json(
            raw / f"rep{slot['repeat']:02d}" / f"c{slot['concurrency']:04d}" / "point.json"
        )
        jsonschema.validate(pj, schema)
        assert pj["ignore_eos"] is True and pj["unique_prompts"] is True
        points[slot["run_index"]] = (slot["concurrency"], pj["prompt_offset"])
    warm = read_json(raw / "warmup" / "point.json")
    assert warm["prompt_offset"] == 0 and warm["num_prompts"] == 2
    # latin, one repeat, waves 1: the warm-up's 2 prompts, then c=1 and c=2 in plan order
    assert points == {0: (1, 2), 1: (2, 3)}
    prompts = gzip.decompress((raw / "prompts.jsonl.gz").read_bytes())
    assert len(prompts.splitlines()) == 5
    # a resumed run measures only the missing point, with the prompts a fresh run gives it
    shutil.rmtree(raw / "rep01" / "c0002")
    run_sweep(measure_job(cfg, exp, model_dir=model, runtime=runtime), "fake")
    again = read_json(raw / "rep01" / "c0002" / "point.json")
    assert again["launch"] == 2 and again["prompt_offset"] == 3
    assert gzip.decompress((raw / "prompts.jsonl.gz").read_bytes()) == prompts


def test_stop_reaches_a_running_container(engine: Engine, tmp_path: Path) -> None:
    """The `docker run` client is not the server: stopping must stop the container by name."""
    from servelab.env.container import container_run_for
    from servelab.launch.ports import free_port
    from servelab.launch.server import ServerLaunch, make_server

    cfg = config(tmp_path)
    runtime = runtime_stage(cfg, str)
    launch = ServerLaunch(
        python="python3",
        model_path=str(tmp_path),
        served_name="m",
        host="127.0.0.1",
        port=free_port(),
        args=[],
        container=container_run_for(
            measure_job(cfg, tmp_path, model_dir=tmp_path, runtime=runtime), "fake", purpose="sweep"
        ),
    )
    server = make_server(launch, tmp_path / "server.log", 10)
    with server:
        server.wait_ready(30, str)
        assert launch.container is not None
        pid = int((engine.state / "containers" / launch.container.name).read_text())
    t0 = time.monotonic()
    while time.monotonic() - t0 < 5:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the container's server still runs after stop")
    assert ["stop", "-t", "10", launch.container.name] in engine.calls()


A100_NSYS = "/opt/nvidia/nsight-systems-cli/2025.5.1/target-linux-x64/nsys"  # not on this host


def test_profiling_pass_runs_nsys_inside_the_container(engine: Engine, tmp_path: Path) -> None:
    """The A100 experiment's profile.nsys is not on this host nor in vLLM's image: the host's
    Nsight Systems, found in an install folder, is mounted into the profiling launch (and the
    export's helper), and nsys runs inside, in front of the server."""
    cfg = config(tmp_path, nsys=A100_NSYS)
    nsys, globs = host_install(tmp_path / "host")
    runtime = runtime_stage(cfg, str, no_host_nsys, globs)
    assert runtime["nsys"] is None and runtime["host_nsys"]["path"] == str(nsys)
    exp = tmp_path / "results" / "fake-gpu"
    model = model_dir(tmp_path)
    rec = run_profile(
        measure_job(cfg, exp, model_dir=model, runtime=runtime),
        "fake",
        which=no_host_nsys,
        nsys_globs=globs,
    )
    assert rec["status"] == "profiled" and rec["tool"] == "nsys", rec.get("reason")
    assert rec["traces"] == ["nsys/profile.nsys-rep", "nsys/profile.sqlite"]
    assert rec["nsys_report"]["generated"] == "range end"
    inside = f"{CONTAINER_NSYS_ROOT}/target-linux-x64/nsys"
    mount = f"{nsys.parent.parent}:{CONTAINER_NSYS_ROOT}:ro"
    assert rec["nsys"]["executable"] == inside and rec["nsys"]["mount"] == mount
    cmd = rec["command"]
    assert cmd[1] == "run" and cmd[cmd.index("--entrypoint") + 1] == inside
    assert cmd[cmd.index(PINNED) + 1] == "profile" and mount in cmd
    assert "--sample=none" in cmd and "--cpuctxsw=none" in cmd
    assert cmd[cmd.index("VLLM_WORKER_MULTIPROC_METHOD") - 1] == "-e"
    out = (exp / "profile" / "fake").resolve()
    assert f"{out}:{out}" in cmd
    exports = [c for c in engine.calls() if c[0] == "run" and "export" in c]
    assert len(exports) == 1 and "--gpus" not in exports[0] and mount in exports[0]
    sweeps = [c for c in engine.calls() if c[0] == "run" and "serve" in c and "profile" not in c]
    assert not sweeps  # only the profiling launch ran, and it alone carries the mount
    assert not any("--time" in c for c in engine.calls())
    job = measure_job(cfg, exp, model_dir=model)
    prof = analyze_capture(job.exp.profile, job.paths, "fake", model)
    assert prof["trace"]["kind"] == "nsys-sqlite"
    assert set(prof["windows"]) == {"c0001", "c0002"}
    assert engine.running() == []


def test_the_images_nsys_is_preferred(engine: Engine, tmp_path: Path) -> None:
    cfg = config(tmp_path, nsys=str(engine.nsys))
    _, globs = host_install(tmp_path / "host")
    runtime = runtime_stage(cfg, str, no_host_nsys, globs)
    rec = run_profile(
        measure_job(
            cfg, tmp_path / "results" / "fake-gpu", model_dir=model_dir(tmp_path), runtime=runtime
        ),
        "fake",
        which=no_host_nsys,
        nsys_globs=globs,
    )
    assert rec["status"] == "profiled" and rec["nsys"]["source"] == "image"
    assert rec["nsys"]["mount"] is None
    assert rec["command"][rec["command"].index("--entrypoint") + 1] == str(engine.nsys)
    assert not any(CONTAINER_NSYS_ROOT in a for a in rec["command"])


def test_a100_experiment_without_nsys_anywhere_is_not_profiled(
    engine: Engine, tmp_path: Path
) -> None:
    """config/experiments/a100-qwen2.5-3b-knee.yaml on a host with no Nsight Systems: the
    runtime stage succeeds (no mount of a missing folder stops it) and the profiling job
    writes a "not profiled" record that the analysis turns into its report."""
    raw = yaml.safe_load((REPO / "config/experiments/a100-qwen2.5-3b-knee.yaml").read_text())
    raw["results_dir"] = str(tmp_path / "results")
    cfg = validate(raw, "a100").to_dict()
    assert cfg["profile"]["required"] is False
    runtime = runtime_stage(cfg, str, no_host_nsys)
    assert runtime["nsys"] is None and runtime["host_nsys"] is None
    exp = Experiment.from_dict(cfg)
    job = measure_job(exp, tmp_path / "results" / exp.name, model_dir=tmp_path, runtime=runtime)
    rec = run_profile(job, "tp1-bf16", which=no_host_nsys, nsys_globs=())
    assert rec["status"] == "not profiled" and rec["tool"] is None
    assert rec["reason"].startswith(f"{A100_NSYS} is not in {PINNED} and nsys ({A100_NSYS}) not")
    prof = analyze_capture(job.exp.profile, job.paths, "tp1-bf16", tmp_path)
    assert prof["status"] == "not profiled" and prof["reason"] == rec["reason"]
    # the one container that got the GPUs is the runtime stage's pre-flight probe: no server
    gpu_runs = [c for c in engine.calls() if c[0] == "run" and "--gpus" in c]
    assert [c[c.index("--name") + 1].split("-")[:3] for c in gpu_runs] == [
        ["servelab", "gpu", "probe"]
    ]
    assert not [c for c in engine.calls() if "serve" in c]


def test_nsys_absent_from_the_image_is_an_explicit_record(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    runtime = {"kind": "container", "nsys": None, "image_ref": PINNED, "python": "python3"}
    rec = run_profile(
        measure_job(cfg, tmp_path, model_dir=tmp_path, runtime=runtime),
        "fake",
        which=lambda name: None,
        nsys_globs=(),
    )
    assert rec["status"] == "not profiled" and rec["tool"] is None
    assert rec["reason"] == (
        f"nsys is not in {PINNED} and nsys (nsys) not found on this host (PATH, no folders) "
        "(see containers/README.md)"
    )


def test_a_host_nsys_that_did_not_run_in_the_image_is_not_tried_again(tmp_path: Path) -> None:
    """The runtime stage ran the host's Nsight Systems in the image and it failed there
    (runtime.json host_nsys_in_image runs false): the profiling job does not start a server
    under it; the profile is "not profiled" with the stage's reason."""
    cfg = config(tmp_path, nsys=A100_NSYS)
    _, globs = host_install(tmp_path / "host")
    why = "the host's nsys does not run in the image (nsys --version: GLIBC_2.34 not found)"
    runtime = {
        "kind": "container",
        "nsys": None,
        "image_ref": PINNED,
        "python": "python3",
        "host_nsys_in_image": {"runs": False, "reason": why},
    }
    rec = run_profile(
        measure_job(cfg, tmp_path, model_dir=tmp_path, runtime=runtime),
        "fake",
        which=no_host_nsys,
        nsys_globs=globs,
    )
    assert rec["status"] == "not profiled" and rec["tool"] is None
    assert rec["reason"] == f"{A100_NSYS} is not in {PINNED} and {why} (see containers/README.md)"


def test_a_mount_missing_on_the_host_is_refused(engine: Engine, tmp_path: Path) -> None:
    missing = tmp_path / "no-nsight"
    cfg = config(tmp_path, mounts=[f"{missing}:/opt/nvidia/nsight-systems-cli/2025.5.1"])
    with pytest.raises(ServelabError) as err:
        runtime_stage(cfg, str)
    assert str(err.value).startswith(f"runtime.mounts[0]: {missing} is not on this host")
    missing.mkdir()
    runtime_stage(cfg, str)
    probe = engine.calls()[-1]
    assert f"{missing}:/opt/nvidia/nsight-systems-cli/2025.5.1:ro" in probe


def test_apptainer_pulls_by_digest_once_and_pins_a_sif(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "apptainer.jsonl"
    monkeypatch.setenv("FAKE_APPTAINER_LOG", str(log))
    engine.script("apptainer", f'exec {sys.executable} {TESTS / "fake_apptainer.py"} "$@"')
    cfg = config(tmp_path, kind="apptainer", image=f"docker://{IMAGE}", cache_dir=str(tmp_path))
    rec = runtime_stage(cfg, str)
    sif = tmp_path / "images" / "vllm_vllm-openai-6666717cd1cadf9a.sif"
    assert rec["engine"] == "apptainer" and rec["image_ref"] == str(sif)
    assert rec["image_digest"] == DIGEST and rec["vllm_version"] == "0.27.1"
    assert rec["image_sha256"] == hashlib.sha256(sif.read_bytes()).hexdigest()
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert calls[1] == ["pull", f"{sif}.partial", f"docker://{PINNED}"]
    assert calls[2][:2] == ["exec", "--cleanenv"] and calls[2][2] == str(sif)
    runtime_stage(cfg, str)
    assert [c[0] for c in map(json.loads, log.read_text().splitlines())].count("pull") == 1
    # a .sif file is pinned by its sha256
    cfg = config(tmp_path, kind="apptainer", image=str(sif), image_sha256="0" * 64)
    with pytest.raises(ServelabError) as err:
        runtime_stage(cfg, str)
    assert str(err.value).startswith(f"runtime.image_sha256: {sif} has sha256 ")
    cfg = config(tmp_path, kind="apptainer", image=str(sif), image_sha256=rec["image_sha256"])
    pinned = runtime_stage(cfg, str)
    assert pinned["image_digest"] is None and pinned["image_sha256"] == rec["image_sha256"]
    import jsonschema

    schema = json.loads((REPO / "src/servelab/schemas/runtime.schema.json").read_text())
    jsonschema.validate(pinned, schema)
    # a sweep: apptainer runs the server as the job's child, listening on server.host
    exp = tmp_path / "results" / "fake-gpu"
    run = run_sweep(measure_job(cfg, exp, model_dir=model_dir(tmp_path), runtime=pinned), "fake")
    assert run["status"] == "complete"
    cmd = read_json(exp / "server" / "fake" / "launch.json")["command"]
    assert cmd[:3] == [str(engine.bin / "apptainer"), "exec", "--cleanenv"]
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"


def test_the_hosts_nsys_is_looked_for_in_order_newest_first(tmp_path: Path) -> None:
    """profile.nsys, then nsys on PATH, then the install folders, newest version first; the
    version is what `nsys --version` says; the install folder is what a container mounts."""
    from servelab.env.runtime import find_host_nsys, nsys_candidates, nsys_install_dir

    old, _ = host_install(tmp_path, "2024.6.1")
    new, globs = host_install(tmp_path, "2025.5.1")
    cuda = tmp_path / "cuda-12.4" / "bin" / "nsys"
    cuda.parent.mkdir(parents=True)
    cuda.symlink_to(new)  # one install under two names is tried once
    globs = (*globs, str(tmp_path / "cuda-*" / "bin" / "nsys"))
    on_path = tmp_path / "path" / "nsys"
    on_path.parent.mkdir()
    on_path.symlink_to(old)
    none = lambda name: None  # noqa: E731
    assert nsys_candidates("/opt/absent/nsys", none, globs) == [
        (str(new), "install folder"),
        (str(old), "install folder"),
    ]
    found = find_host_nsys("/opt/absent/nsys", none, globs)
    assert not isinstance(found, str)
    assert (found.path, found.found_by, found.version) == (
        str(new),
        "install folder",
        "2025.5.1.121",
    )
    assert found.install_dir == str(new.parent.parent)
    path_first = find_host_nsys("/opt/absent/nsys", lambda n: str(on_path), globs)
    assert not isinstance(path_first, str)
    assert (path_first.path, path_first.found_by) == (str(on_path), "PATH")
    assert path_first.install_dir == str(old.parent.parent)  # the link's target's folder
    configured = find_host_nsys(str(old), lambda n: str(on_path), globs)
    assert not isinstance(configured, str) and configured.found_by == "profile.nsys"
    assert find_host_nsys("nsys", none, ()) == (
        "nsys (nsys) not found on this host (PATH, no folders)"
    )
    broken = tmp_path / "broken" / "bin" / "nsys"
    broken.parent.mkdir(parents=True)
    broken.write_text("#!/bin/sh\nexit 3\n")
    broken.chmod(0o755)
    reason = find_host_nsys(str(broken), none, ())
    assert isinstance(reason, str) and "--version: exit 3" in reason
    assert nsys_install_dir("/usr/bin/nsys") is None  # a system folder is never mounted
