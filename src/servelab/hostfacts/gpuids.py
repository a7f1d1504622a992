"""Which NVML device a GPU id names: NVML indices, CUDA indices, GPU UUIDs, MIG ids, PCI bus ids.

A server sees the GPUs of its launch: a docker or podman container's device list (`--gpus
"device=..."`, CDI names `nvidia.com/gpu=...`), whose ids the NVIDIA container toolkit reads as
NVML indices, GPU UUIDs or MIG ids; or CUDA_VISIBLE_DEVICES (a venv, or apptainer, whose `--nv`
shows every GPU and which servelab hands the device list as CUDA_VISIBLE_DEVICES), whose ids are
CUDA indices, GPU UUIDs (`GPU-<uuid>`, or a prefix that names one GPU) or MIG UUIDs.

A UUID (or a PCI bus id) names one device everywhere. An index does not: NVML numbers GPUs in
PCI bus id order, CUDA (CUDA_DEVICE_ORDER=FASTEST_FIRST, its default) fastest first, and a
cluster scheduler may number a job's GPUs from 0. A CUDA index is the NVML index under
CUDA_DEVICE_ORDER=PCI_BUS_ID, or on a host with one GPU; otherwise the GPU at that NVML index is
taken and the resolution says the mapping is ambiguous.

Pure: `resolve` maps a selection to NVML devices from the devices NVML lists (`NvmlGpu`) and a
lookup for UUIDs and PCI bus ids; the container's launch (servelab.env.container) and the telemetry
(servelab.telemetry.gpus) both use it. `GpuListing` is what servelab.hostfacts.gpu.list_gpus
read of the host's GPUs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from servelab.documents.declared import GpuChoiceJson

ALL = "all"  # every GPU the host has (nothing narrows the server's view)
NONE = "none"  # the server has no GPU (a CPU runtime, an empty CUDA_VISIBLE_DEVICES)
LIST = "list"  # the ids in `ids`

NVML_IDS = "nvml"  # the container toolkit's ids: NVML indices, UUIDs, MIG ids
CUDA_IDS = "cuda"  # CUDA_VISIBLE_DEVICES: CUDA indices, UUIDs or their prefixes, MIG UUIDs

INDEX = re.compile(r"^\d+$")
MIG_BY_INDEX = re.compile(r"^(\d+):(\d+)$")  # the container toolkit's <gpu index>:<mig index>
_LEGACY_MIG = re.compile(r"^MIG-(GPU-[^/]+)/\d+/\d+$", re.IGNORECASE)  # MIG-GPU-<uuid>/<gi>/<ci>
_PCI_BUS_ID = re.compile(
    r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$"
)


class GpuSelectionJson(TypedDict):
    """The GPUs a server was given, as the telemetry records them (`GpuSelection.to_json`)."""

    how: str
    requested: list[str]
    namespace: str | None
    cuda_device_order: str | None
    origin: str
    launch: GpuChoiceJson | None


@dataclass(frozen=True)
class GpuSelection:
    """The GPUs a server was given: `how` is ALL, NONE or LIST (then `ids`, as given, in the
    `namespace` NVML_IDS or CUDA_IDS); `pci_bus_id_order`: CUDA_DEVICE_ORDER=PCI_BUS_ID (CUDA
    indices are then NVML indices); `origin`: where the selection came from, in words;
    `ambiguous`: why an id may not name the GPU meant, known before NVML is asked (a container's
    launch that turned a CUDA index into a UUID); `launch`: how a container's launch chose its
    GPUs (servelab.env.container.GpuChoice.to_json), or None."""

    how: str
    ids: tuple[str, ...] = ()
    namespace: str = NVML_IDS
    pci_bus_id_order: bool = False
    origin: str = ""
    ambiguous: str | None = None
    launch: GpuChoiceJson | None = None

    def to_json(self) -> GpuSelectionJson:
        order = None
        if self.how == LIST and self.namespace == CUDA_IDS:
            order = "PCI_BUS_ID" if self.pci_bus_id_order else "FASTEST_FIRST"
        return {
            "how": self.how,
            "requested": list(self.ids),
            "namespace": self.namespace if self.how == LIST else None,
            "cuda_device_order": order,
            "origin": self.origin,
            "launch": self.launch.copy() if self.launch is not None else None,
        }


EVERY_GPU = GpuSelection(ALL, origin="no selection given: every GPU NVML lists")


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


@dataclass(frozen=True)
class NvmlGpu:
    """A GPU as NVML lists it; `memory_used_bytes` where the listing read it."""

    index: int
    uuid: str | None
    pci_bus_id: str | None
    name: str
    memory_used_bytes: int | None = None


@dataclass(frozen=True)
class GpuListing:
    """The host's GPUs as NVML lists them (servelab.hostfacts.gpu.list_gpus), or why NVML
    could not list them (`reason`); the driver's version and the newest CUDA it supports."""

    gpus: tuple[NvmlGpu, ...] = ()
    reason: str | None = None
    driver: str | None = None
    driver_cuda: str | None = None


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


def pci_key(text: str) -> tuple[int, int, int, int] | None:
    """A PCI bus id in any form NVML takes (domain:bus:device.function, bus:device.function)."""
    m = _PCI_BUS_ID.match(text)
    if m is None:
        return None
    return (int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16), int(m.group(4)))


def listing_lookup(gpus: Sequence[NvmlGpu]) -> Lookup:
    """A lookup from a listing alone: a whole GPU UUID (any case) or a PCI bus id; MIG device
    UUIDs need NVML itself (None here)."""

    def lookup(kind: str, token: str) -> int | None:
        for g in gpus:
            if kind == "uuid" and g.uuid and g.uuid.lower() == token.lower():
                return g.index
            if kind == "pci" and g.pci_bus_id and pci_key(g.pci_bus_id) == pci_key(token):
                return g.index
        return None

    return lookup


def _index_token(i: int, sel: GpuSelection, gpus: Sequence[NvmlGpu]) -> tuple[str, bool]:
    """How an index token in range was chosen, and whether that is a guess."""
    if sel.namespace != CUDA_IDS:
        return f"NVML index {i} (the container toolkit's numbering)", False
    if sel.pci_bus_id_order:
        return f"CUDA index {i} = NVML index {i} (CUDA_DEVICE_ORDER=PCI_BUS_ID)", False
    if len(gpus) == 1:
        return f"CUDA index {i}, the host's only GPU", False
    return f"CUDA index {i}, taken as NVML index {i} (ambiguous)", True


def _find(
    token: str, sel: GpuSelection, gpus: Sequence[NvmlGpu], lookup: Lookup
) -> tuple[int, str, bool] | None:
    """The NVML index an id names, how, and whether it is a guess; None when none answers."""
    by_index = {g.index for g in gpus}
    cuda = sel.namespace == CUDA_IDS
    if INDEX.match(token):
        i = int(token)
        return (i, *_index_token(i, sel, gpus)) if i in by_index else None
    if token.upper().startswith("GPU-"):
        hit = _by_uuid(token, gpus, lookup, allow_prefix=cuda)
        return None if hit is None else (*hit, False)
    if token.upper().startswith("MIG-"):
        parent = lookup("uuid", token)
        if parent is None and (legacy := _LEGACY_MIG.match(token)):
            parent = lookup("uuid", legacy.group(1))
        if parent is None or parent not in by_index:
            return None
        return parent, f"MIG device {token}: its whole GPU", False
    if not cuda and (m := MIG_BY_INDEX.match(token)):
        i = int(m.group(1))
        if i not in by_index:
            return None
        return i, f"MIG device {token}: its whole GPU, NVML index {i}", False
    if _PCI_BUS_ID.match(token):
        i_pci = lookup("pci", token)
        if i_pci is None or i_pci not in by_index:
            return None
        return i_pci, f"PCI bus id {token}", False
    return None


def resolve(sel: GpuSelection, gpus: Sequence[NvmlGpu], lookup: Lookup) -> Resolution:
    """The NVML devices a selection names (see the module's docstring)."""
    out = Resolution()
    if sel.how == NONE:
        return out
    if sel.how == ALL:
        out.chosen = [(g.index, "every GPU") for g in gpus]
        return out
    guessed: list[str] = []
    for pos, token in enumerate(sel.ids):
        found = _find(token, sel, gpus, lookup)
        if found is None:
            out.unmatched.append(token)
            if sel.namespace == CUDA_IDS:  # CUDA ignores an invalid id and every id after it
                out.unmatched += list(sel.ids[pos + 1 :])
                break
            continue
        index, how, guess = found
        if guess:
            guessed.append(token)
        if index not in {i for i, _ in out.chosen}:
            out.chosen.append((index, how))
    if guessed:
        out.ambiguous = ambiguity(guessed, gpus)
    return out


SAMPLED = "the GPU sampled at that NVML index may not be the server's"


def ambiguity(indices: Sequence[str], gpus: Sequence[NvmlGpu], consequence: str = SAMPLED) -> str:
    """Why CUDA indices taken as NVML indices may not name the GPUs meant; `consequence`: what
    may then be wrong."""
    names = {g.name for g in gpus}
    same = (
        f"; all {len(gpus)} GPUs are {next(iter(names))}, which CUDA then in practice orders "
        "by PCI bus id as NVML does"
        if len(names) == 1
        else ""
    )
    return (
        f"CUDA index {','.join(indices)} without CUDA_DEVICE_ORDER=PCI_BUS_ID: CUDA "
        f"numbers GPUs fastest first, NVML by PCI bus id, so {consequence}{same}; name GPUs "
        "by UUID (GPU-...) or set "
        "CUDA_DEVICE_ORDER=PCI_BUS_ID"
    )


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
