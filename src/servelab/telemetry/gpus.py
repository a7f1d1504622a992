"""Which GPUs the server was given, and which NVML devices they are.

The server sees the GPUs of its launch: a docker or podman container's device list (`--gpus
"device=..."`, CDI names `nvidia.com/gpu=...`), whose ids the NVIDIA container toolkit reads as
NVML indices, GPU UUIDs or MIG ids; or CUDA_VISIBLE_DEVICES (a venv, or apptainer, whose `--nv`
shows every GPU and which servelab hands the device list as CUDA_VISIBLE_DEVICES), whose ids are
CUDA indices, GPU UUIDs (`GPU-<uuid>`, or a prefix that names one GPU) or MIG UUIDs. Telemetry
samples those GPUs and no other.

A UUID (or a PCI bus id) names one device everywhere. An index does not: NVML numbers GPUs in
PCI bus id order, CUDA (CUDA_DEVICE_ORDER=FASTEST_FIRST, its default) fastest first. A CUDA index
is the NVML index under CUDA_DEVICE_ORDER=PCI_BUS_ID, or on a host with one GPU; otherwise the
GPU at that NVML index is sampled and the selection says the mapping is ambiguous.

`server_gpus` reads the selection from a launch (no NVML needed); `resolve` maps it to NVML
devices (a pure function of the devices NVML lists and a lookup for UUIDs and PCI bus ids).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

ALL = "all"  # every GPU the host has (nothing narrows the server's view)
NONE = "none"  # the server has no GPU (a CPU runtime, an empty CUDA_VISIBLE_DEVICES)
LIST = "list"  # the ids in `ids`

NVML_IDS = "nvml"  # the container toolkit's ids: NVML indices, UUIDs, MIG ids
CUDA_IDS = "cuda"  # CUDA_VISIBLE_DEVICES: CUDA indices, UUIDs or their prefixes, MIG UUIDs

_INDEX = re.compile(r"^\d+$")
_MIG_BY_INDEX = re.compile(r"^(\d+):(\d+)$")  # the container toolkit's <gpu index>:<mig index>
_LEGACY_MIG = re.compile(r"^MIG-(GPU-[^/]+)/\d+/\d+$", re.IGNORECASE)  # MIG-GPU-<uuid>/<gi>/<ci>
_PCI_BUS_ID = re.compile(r"^(?:[0-9a-fA-F]{1,8}:)?[0-9a-fA-F]{1,2}:[0-9a-fA-F]{1,2}\.[0-7]$")


@dataclass(frozen=True)
class GpuSelection:
    """The GPUs a server was given: `how` is ALL, NONE or LIST (then `ids`, as given, in the
    `namespace` NVML_IDS or CUDA_IDS); `pci_bus_id_order`: CUDA_DEVICE_ORDER=PCI_BUS_ID (CUDA
    indices are then NVML indices); `origin`: where the selection came from, in words."""

    how: str
    ids: tuple[str, ...] = ()
    namespace: str = NVML_IDS
    pci_bus_id_order: bool = False
    origin: str = ""

    def to_json(self) -> dict[str, Any]:
        order = None
        if self.how == LIST and self.namespace == CUDA_IDS:
            order = "PCI_BUS_ID" if self.pci_bus_id_order else "FASTEST_FIRST"
        return {
            "how": self.how,
            "requested": list(self.ids),
            "namespace": self.namespace if self.how == LIST else None,
            "cuda_device_order": order,
            "origin": self.origin,
        }


EVERY_GPU = GpuSelection(ALL, origin="no selection given: every GPU NVML lists")


class ContainerLike(Protocol):
    """What `server_gpus` reads of a servelab.container.ContainerRun."""

    @property
    def engine(self) -> str: ...

    @property
    def gpus(self) -> str | tuple[str, ...] | None: ...


def cuda_visible(value: str | None, order: str | None, origin: str) -> GpuSelection:
    """The selection of a CUDA_VISIBLE_DEVICES value (None: unset, every GPU)."""
    pci = (order or "").strip().upper() == "PCI_BUS_ID"
    if value is None:
        return GpuSelection(ALL, origin=f"CUDA_VISIBLE_DEVICES is not set ({origin})")
    ids = tuple(t.strip() for t in value.split(",") if t.strip())
    where = f"CUDA_VISIBLE_DEVICES={value} ({origin})"
    if not ids:
        return GpuSelection(NONE, origin=where)
    return GpuSelection(LIST, ids, CUDA_IDS, pci, where)


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
    gpus, engine = container.gpus, container.engine
    if gpus is None:
        return GpuSelection(NONE, origin=f"the {engine} container is given no GPU")
    if engine == "apptainer":
        # --nv shows every GPU; --cleanenv keeps only the launch's own variables, and the device
        # list reaches the server as CUDA_VISIBLE_DEVICES
        if isinstance(gpus, tuple):
            value: str | None = ",".join(gpus)
            where = "apptainer --nv, the configured devices"
        else:
            value = launch_env.get("CUDA_VISIBLE_DEVICES")
            where = "apptainer --nv, runtime.env"
        return cuda_visible(value, launch_env.get("CUDA_DEVICE_ORDER"), where)
    nested = ""
    if "CUDA_VISIBLE_DEVICES" in launch_env:
        nested = (
            f"; runtime.env also sets CUDA_VISIBLE_DEVICES={launch_env['CUDA_VISIBLE_DEVICES']} "
            "inside the container: every GPU of the container is sampled"
        )
    if gpus == ALL:
        return GpuSelection(ALL, origin=f"{engine}: every GPU{nested}")
    ids = tuple(str(g) for g in gpus)
    return GpuSelection(LIST, ids, NVML_IDS, False, f"{engine} devices {','.join(ids)}{nested}")


@dataclass(frozen=True)
class NvmlGpu:
    """A GPU as NVML lists it."""

    index: int
    uuid: str | None
    pci_bus_id: str | None
    name: str


@dataclass
class Resolution:
    """The NVML devices of a selection: (NVML index, how it was chosen) in the selection's
    order; `ambiguous` says why an index may not name the server's GPU; `unmatched` lists the
    ids no device answers to."""

    chosen: list[tuple[int, str]] = field(default_factory=list)
    ambiguous: str | None = None
    unmatched: list[str] = field(default_factory=list)


# lookup(kind, id) -> the NVML index of the (parent) GPU that NVML finds for a UUID ("uuid",
# a GPU's or a MIG device's) or a PCI bus id ("pci"), or None
Lookup = Callable[[str, str], int | None]


def resolve(sel: GpuSelection, gpus: Sequence[NvmlGpu], lookup: Lookup) -> Resolution:
    """The NVML devices a selection names (see the module's docstring)."""
    out = Resolution()
    if sel.how == NONE:
        return out
    if sel.how == ALL:
        out.chosen = [(g.index, "every GPU") for g in gpus]
        return out
    by_index = {g.index: g for g in gpus}
    cuda = sel.namespace == CUDA_IDS
    index_guessed: list[str] = []
    for pos, token in enumerate(sel.ids):
        found: tuple[int, str] | None = None
        if _INDEX.match(token):
            i = int(token)
            if i in by_index:
                if not cuda:
                    found = (i, f"NVML index {i} (the container toolkit's numbering)")
                elif sel.pci_bus_id_order:
                    found = (i, f"CUDA index {i} = NVML index {i} (CUDA_DEVICE_ORDER=PCI_BUS_ID)")
                elif len(gpus) == 1:
                    found = (i, f"CUDA index {i}, the host's only GPU")
                else:
                    found = (i, f"CUDA index {i}, taken as NVML index {i} (ambiguous)")
                    index_guessed.append(token)
        elif token.upper().startswith("GPU-"):
            found = _by_uuid(token, gpus, lookup, allow_prefix=cuda)
        elif token.upper().startswith("MIG-"):
            i_parent = lookup("uuid", token)
            if i_parent is None and (legacy := _LEGACY_MIG.match(token)):
                i_parent = lookup("uuid", legacy.group(1))
            if i_parent is not None and i_parent in by_index:
                found = (i_parent, f"MIG device {token}: its whole GPU")
        elif not cuda and (m := _MIG_BY_INDEX.match(token)):
            i = int(m.group(1))
            if i in by_index:
                found = (i, f"MIG device {token}: its whole GPU, NVML index {i}")
        elif _PCI_BUS_ID.match(token):
            i_pci = lookup("pci", token)
            if i_pci is not None and i_pci in by_index:
                found = (i_pci, f"PCI bus id {token}")
        if found is None:
            out.unmatched.append(token)
            if cuda:  # CUDA ignores an invalid id and every id after it
                out.unmatched += list(sel.ids[pos + 1 :])
                break
            continue
        if found[0] not in {i for i, _ in out.chosen}:
            out.chosen.append(found)
    if index_guessed:
        names = {g.name for g in gpus}
        same = (
            f"; all {len(gpus)} GPUs are {next(iter(names))}, which CUDA then in practice orders "
            "by PCI bus id as NVML does"
            if len(names) == 1
            else ""
        )
        out.ambiguous = (
            f"CUDA index {','.join(index_guessed)} without CUDA_DEVICE_ORDER=PCI_BUS_ID: CUDA "
            "numbers GPUs fastest first, NVML by PCI bus id, so the GPU sampled at that NVML "
            f"index may not be the server's{same}; name GPUs by UUID (GPU-...) or set "
            "CUDA_DEVICE_ORDER=PCI_BUS_ID"
        )
    return out


def _by_uuid(
    token: str, gpus: Sequence[NvmlGpu], lookup: Lookup, allow_prefix: bool
) -> tuple[int, str] | None:
    i = lookup("uuid", token)
    if i is not None:
        return i, f"UUID {token}"
    if allow_prefix:  # CUDA takes a UUID's leading digits when they name one GPU
        hits = [g for g in gpus if g.uuid and g.uuid.lower().startswith(token.lower())]
        if len(hits) == 1:
            return hits[0].index, f"UUID prefix {token} ({hits[0].uuid})"
    return None
