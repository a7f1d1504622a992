"""Which GPUs the server was given, and which NVML devices they are.

The server sees the GPUs of its launch: a docker or podman container's device list (`--gpus
"device=..."`, CDI names `nvidia.com/gpu=...`), which servelab names by GPU UUID where NVML
lists the host's GPUs (servelab.env.container.gpus.choose_gpus); or CUDA_VISIBLE_DEVICES (a venv, or
apptainer, whose `--nv` shows every GPU and which servelab hands the device list as
CUDA_VISIBLE_DEVICES). Telemetry samples those GPUs and no other.

`server_gpus` reads the selection from a launch (no NVML needed), with what the container's
launch recorded of its choice (why these GPUs, and whether a CUDA index it turned into a UUID
may name another GPU); `resolve` (servelab.hostfacts.gpuids, where the ids and their
ambiguities are explained) maps it to NVML devices.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from servelab.documents.declared import GpuChoiceJson
from servelab.hostfacts.gpuids import (
    ALL,
    CUDA_IDS,
    EVERY_GPU,
    LIST,
    NONE,
    NVML_IDS,
    GpuSelection,
    Lookup,
    NvmlGpu,
    Resolution,
    cuda_visible,
    resolve,
)

__all__ = [
    "ALL",
    "CUDA_IDS",
    "EVERY_GPU",
    "LIST",
    "NONE",
    "NVML_IDS",
    "ContainerLike",
    "GpuSelection",
    "Lookup",
    "NvmlGpu",
    "Resolution",
    "cuda_visible",
    "resolve",
    "server_gpus",
]


class ChoiceLike(Protocol):
    """What `server_gpus` reads of a servelab.env.container.GpuChoice."""

    @property
    def origin(self) -> str: ...

    @property
    def ambiguous(self) -> str | None: ...

    def to_json(self) -> GpuChoiceJson: ...


class ContainerLike(Protocol):
    """What `server_gpus` reads of a servelab.env.container.ContainerRun."""

    @property
    def engine(self) -> str: ...

    @property
    def gpus(self) -> str | tuple[str, ...] | None: ...

    @property
    def gpu_choice(self) -> ChoiceLike | None: ...


def server_gpus(
    device: str,
    container: ContainerLike | None,
    launch_env: Mapping[str, str],
    environ: Mapping[str, str],
) -> GpuSelection:
    """The GPUs a server sees, from its launch: `device` is runtime.device, `container` the
    launch's container (None for a venv), `launch_env` the variables the launch sets
    (runtime.env and what a capture adds), `environ` the job's own environment (a venv's server
    inherits it; CUDA_VISIBLE_DEVICES there is what a cluster scheduler sets)."""
    if device != "gpu":
        return GpuSelection(NONE, origin=f"runtime.device: {device}")
    if container is None:
        env = {**environ, **launch_env}
        where = "runtime.env" if "CUDA_VISIBLE_DEVICES" in launch_env else "the job's environment"
        return cuda_visible(env.get("CUDA_VISIBLE_DEVICES"), env.get("CUDA_DEVICE_ORDER"), where)
    gpus, engine, choice = container.gpus, container.engine, container.gpu_choice
    if gpus is None:
        return GpuSelection(NONE, origin=f"the {engine} container is given no GPU")
    why = f" ({choice.origin})" if choice is not None else ""
    launch = choice.to_json() if choice is not None else None
    ambiguous = choice.ambiguous if choice is not None else None
    if engine == "apptainer":
        # --nv shows every GPU; --cleanenv keeps only the launch's own variables, and the device
        # list reaches the server as CUDA_VISIBLE_DEVICES
        if isinstance(gpus, tuple):
            value: str | None = ",".join(gpus)
            where = f"apptainer --nv, the devices of its launch{why}"
        else:
            value = launch_env.get("CUDA_VISIBLE_DEVICES")
            where = f"apptainer --nv, runtime.env{why}"
        sel = cuda_visible(value, launch_env.get("CUDA_DEVICE_ORDER"), where)
        return GpuSelection(
            sel.how, sel.ids, sel.namespace, sel.pci_bus_id_order, sel.origin, ambiguous, launch
        )
    nested = ""
    if "CUDA_VISIBLE_DEVICES" in launch_env:
        nested = (
            f"; runtime.env also sets CUDA_VISIBLE_DEVICES={launch_env['CUDA_VISIBLE_DEVICES']} "
            "inside the container: every GPU of the container is sampled"
        )
    if gpus == ALL:
        return GpuSelection(
            ALL, origin=f"{engine}: every GPU{why}{nested}", ambiguous=ambiguous, launch=launch
        )
    ids = tuple(str(g) for g in gpus)
    origin = f"{engine} devices {','.join(ids)}{why}{nested}"
    return GpuSelection(LIST, ids, NVML_IDS, False, origin, ambiguous, launch)
