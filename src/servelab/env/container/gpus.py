"""The GPUs a GPU server's container is given, named by UUID where NVML lists the host's GPUs.

- runtime.gpu_devices: those ids (NVML indices, UUIDs, PCI bus ids, MIG ids, as the NVIDIA
  container toolkit reads them), each index or PCI bus id turned into its GPU's UUID;
- else the job's CUDA_VISIBLE_DEVICES (a cluster scheduler's), its first runtime.gpus ids, each
  turned into the UUID of the GPU it names: a CUDA index is NVML's under
  CUDA_DEVICE_ORDER=PCI_BUS_ID or on a host of one GPU; otherwise the UUID of the GPU at that
  NVML index is given and the choice is marked `ambiguous` (servelab.hostfacts.gpuids); GPU
  UUIDs and MIG ids pass through;
- else runtime.gpus of the host's GPUs, those with the least memory in use now (ties: the
  lowest NVML index), so that a GPU another process holds is not measured; runtime.gpus 0:
  every GPU.

Where NVML cannot list the GPUs the ids go as given (CUDA indices marked ambiguous), and with
none named, NVML indices 0 to runtime.gpus - 1. Pure: the host's GPUs come in as a GpuListing
(servelab.hostfacts.gpu.list_gpus).

The choice is made once per run, by the runtime stage (servelab.env.runtime.gpu), and kept in
runtime.json's `gpu_choice` with each GPU's NVML index at the time (`with_indices`); every launch
of the run, its host-speed canary and its profiling pass take that record (`recorded_choice`),
which refuses a UUID the host no longer has, rather than choosing again: the least-used GPUs of
one moment are not those of the next, and a run's launches must all measure the same GPUs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from servelab.documents.declared import CudaCompatibility, GpuChoiceJson
from servelab.errors import ServelabError
from servelab.hostfacts.gpuids import (
    CUDA_IDS,
    INDEX,
    LIST,
    MIG_BY_INDEX,
    NVML_IDS,
    GpuListing,
    GpuSelection,
    NvmlGpu,
    ambiguity,
    cuda_visible,
    listing_lookup,
    resolve,
)

# GpuChoice.rule: where the container's GPUs came from
CONFIGURED = "runtime.gpu_devices"
CUDA_VISIBLE = "CUDA_VISIBLE_DEVICES"
LEAST_MEMORY = "least_memory_used"  # runtime.gpus of the host's GPUs, least memory in use first
FIRST_INDICES = "first_nvml_indices"  # NVML could not list the GPUs: NVML indices 0..gpus-1
EVERY_GPU = "every_gpu"  # runtime.gpus is 0 and nothing names a GPU
_LAUNCH = (
    "the GPU given to the container (the UUID of that NVML index) may not be the one "
    "CUDA_VISIBLE_DEVICES meant (a scheduler may also number a job's GPUs from 0)"
)


@dataclass(frozen=True)
class GpuChoice:
    """The GPUs a launch gives its container: `ids` (what the engine is given: UUIDs where NVML
    lists the host's GPUs; empty: every GPU), `rule` (CONFIGURED, CUDA_VISIBLE, LEAST_MEMORY,
    FIRST_INDICES, EVERY_GPU), `origin` (why these, in words), `chosen_by` (per id, how it was
    found), `ambiguous` (why an id may not be the GPU meant), `cuda` (the driver against the
    image's CUDA: servelab.hostfacts.gpu.cuda_compatibility) and `indices` (each id's NVML index
    when it was chosen, None where NVML did not list it; empty: not looked up)."""

    ids: tuple[str, ...]
    rule: str
    origin: str
    chosen_by: tuple[str, ...] = ()
    ambiguous: str | None = None
    cuda: CudaCompatibility | None = None
    indices: tuple[int | None, ...] = ()

    @property
    def gpus(self) -> str | tuple[str, ...]:
        """ContainerRun.gpus: the ids, or "all"."""
        return self.ids if self.ids else "all"

    def to_json(self) -> GpuChoiceJson:
        out: GpuChoiceJson = {
            "rule": self.rule,
            "ids": list(self.ids),
            "origin": self.origin,
            "chosen_by": list(self.chosen_by),
            "ambiguous": self.ambiguous,
            "cuda": self.cuda.copy() if self.cuda is not None else None,
        }
        if self.indices:
            out["indices"] = list(self.indices)
        return out

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> GpuChoice:
        """A recorded choice (runtime.json's `gpu_choice`, launch.json's `gpus`)."""
        cuda = doc.get("cuda")
        return cls(
            tuple(str(i) for i in doc["ids"]),
            str(doc["rule"]),
            str(doc["origin"]),
            tuple(str(c) for c in doc.get("chosen_by") or ()),
            None if doc.get("ambiguous") is None else str(doc["ambiguous"]),
            cast(CudaCompatibility, dict(cuda)) if isinstance(cuda, Mapping) else None,
            tuple(None if i is None else int(i) for i in doc.get("indices") or ()),
        )


def with_indices(choice: GpuChoice, listing: GpuListing) -> GpuChoice:
    """The choice with each id's NVML index in `listing` (None for an id it does not list: a
    MIG id, an id given as written where NVML could not list the GPUs)."""
    by_uuid = {g.uuid: g.index for g in listing.gpus if g.uuid}
    return replace(choice, indices=tuple(by_uuid.get(i) for i in choice.ids))


def recorded_choice(doc: Any, listing: GpuListing, where: str) -> GpuChoice:
    """The runtime stage's choice (`doc`, runtime.json's `gpu_choice`; `where` names that file)
    checked against the host's GPUs now: every UUID it names must still be listed (where NVML
    lists the GPUs). Raises one line when the record holds no choice or names a GPU the host
    does not have: re-run the runtime stage."""
    if not isinstance(doc, Mapping) or not isinstance(doc.get("ids"), list):
        raise ServelabError(
            f"{where}: records no GPU choice (gpu_choice), which every launch of the run takes; "
            "re-run the runtime stage to choose the GPUs"
        )
    choice = GpuChoice.from_json(doc)
    if listing.reason is not None:
        return choice
    here = {g.uuid for g in listing.gpus if g.uuid}
    for k, uid in enumerate(choice.ids):
        if uid.upper().startswith("GPU-") and uid not in here:
            was = choice.indices[k] if k < len(choice.indices) else None
            at = f" (NVML index {was} when chosen)" if was is not None else ""
            raise ServelabError(
                f"{where}: gpu_choice names GPU {uid}{at}, which NVML does not list on this "
                f"host ({_listed(listing)}); re-run the runtime stage to choose this host's GPUs"
            )
    return choice


def choose_gpus(
    configured: Sequence[str | int] | None,
    count: int,
    environ: Mapping[str, str],
    listing: GpuListing,
) -> GpuChoice:
    """The GPUs of a GPU server's container (the module's docstring): `configured` is
    runtime.gpu_devices, `count` runtime.gpus, `environ` the job's environment, `listing` the
    host's GPUs (servelab.hostfacts.gpu.list_gpus). Raises a one-line error for an id that
    names no GPU of the host, or fewer GPUs than runtime.gpus."""
    if configured:
        ids = tuple(str(g) for g in configured)
        sel = GpuSelection(LIST, ids, NVML_IDS, origin=CONFIGURED)
        return _named(sel, CONFIGURED, listing, 0)
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is not None and value.strip():
        sel = cuda_visible(value, environ.get("CUDA_DEVICE_ORDER"), "the job's environment")
        return _named(sel, CUDA_VISIBLE, listing, count)
    if count <= 0:
        why = (
            "runtime.gpus is 0 and no GPU is named: every GPU of the host (set runtime.gpus to "
            "the GPUs one server uses to give it only those)"
        )
        return GpuChoice((), EVERY_GPU, why)
    return _least_used(count, listing)


def _listed(listing: GpuListing) -> str:
    return ", ".join(f"{g.index} {g.uuid or g.name}" for g in listing.gpus) or "none"


def _least_used(count: int, listing: GpuListing) -> GpuChoice:
    """runtime.gpus GPUs, none named: the least memory in use first, ties by NVML index."""
    if listing.reason is not None:
        ids = tuple(str(i) for i in range(count))
        why = (
            f"runtime.gpus {count}, no GPU named, and NVML could not list the GPUs "
            f"({listing.reason}): NVML indices {','.join(ids)}"
        )
        return GpuChoice(ids, FIRST_INDICES, why, tuple(f"NVML index {i}" for i in ids))
    if len(listing.gpus) < count:
        raise ServelabError(
            f"runtime.gpus: {count} GPUs needed but NVML lists {len(listing.gpus)} on this host "
            f"({_listed(listing)}); set runtime.gpus to at most {len(listing.gpus)}"
        )

    def used(g: NvmlGpu) -> float:
        return float("inf") if g.memory_used_bytes is None else float(g.memory_used_bytes)

    pick = sorted(
        sorted(listing.gpus, key=lambda g: (used(g), g.index))[:count], key=lambda g: g.index
    )
    why = (
        f"runtime.gpus {count} of the {len(listing.gpus)} GPUs NVML lists, none named: those "
        "with the least memory in use (ties: the lowest NVML index)"
    )
    chosen_by = tuple(
        f"NVML index {g.index}, "
        + (
            "memory in use unknown"
            if g.memory_used_bytes is None
            else f"{g.memory_used_bytes // 2**20} MiB in use"
        )
        for g in pick
    )
    return GpuChoice(tuple(g.uuid or str(g.index) for g in pick), LEAST_MEMORY, why, chosen_by)


def _named(sel: GpuSelection, rule: str, listing: GpuListing, count: int) -> GpuChoice:
    """The GPUs a list of ids names (runtime.gpu_devices: NVML ids; CUDA_VISIBLE_DEVICES: CUDA
    ids, its first `count` when count > 0), each as the UUID of the GPU it names."""
    what = f"{rule}={','.join(sel.ids)}"
    tokens = sel.ids
    if count > 0:
        if len(sel.ids) < count:
            raise ServelabError(
                f"{what} names {len(sel.ids)} GPU(s) but runtime.gpus is {count}; give the job "
                f"{count} GPUs or set runtime.gpus to {len(sel.ids)}"
            )
        tokens = sel.ids[:count]
    if len(tokens) < len(sel.ids):
        what += f", its first {count} (runtime.gpus)"
    cuda_index = sel.namespace == CUDA_IDS and not sel.pci_bus_id_order
    if listing.reason is not None:
        guessed = [t for t in tokens if cuda_index and INDEX.match(t)]
        ambiguous = None
        if guessed:
            ambiguous = (
                f"NVML could not list the GPUs, so CUDA index {','.join(guessed)} went to the "
                "container as an NVML index: " + ambiguity(guessed, (), _LAUNCH)
            )
        why = f"{what}; NVML could not list the GPUs ({listing.reason}): the ids as given"
        return GpuChoice(tokens, rule, why, tuple("as given" for _ in tokens), ambiguous)
    ids: list[str] = []
    how: list[str] = []
    guessed = []
    for token in tokens:
        uid, found_by, guess = _to_uuid(token, sel, listing, what)
        guessed += [token] if guess else []
        if uid not in ids:
            ids.append(uid)
            how.append(found_by)
    ambiguous = ambiguity(guessed, listing.gpus, _LAUNCH) if guessed else None
    return GpuChoice(tuple(ids), rule, f"{what}, named by UUID", tuple(how), ambiguous)


def _to_uuid(
    token: str, sel: GpuSelection, listing: GpuListing, what: str
) -> tuple[str, str, bool]:
    """(the UUID the engine is given for one id, how it was found, whether that is a guess)."""
    mig = token.upper().startswith("MIG-") or (
        sel.namespace == NVML_IDS and MIG_BY_INDEX.match(token) is not None
    )
    if mig:
        return token, f"MIG device {token}, as given", False
    one = GpuSelection(LIST, (token,), sel.namespace, sel.pci_bus_id_order)
    res = resolve(one, listing.gpus, listing_lookup(listing.gpus))
    if not res.chosen:
        if token.upper().startswith("GPU-"):  # a UUID names one GPU wherever it is
            return token, f"UUID {token}, as given (NVML lists no such GPU here)", False
        raise ServelabError(
            f"{what}: {token!r} names none of the {len(listing.gpus)} GPUs NVML lists on this "
            f"host ({_listed(listing)}); name this host's GPUs by NVML index or UUID "
            "(nvidia-smi -L)"
        )
    index, found_by = res.chosen[0]
    gpu = next(g for g in listing.gpus if g.index == index)
    uid = gpu.uuid or str(index)
    return uid, f"{found_by}: {uid}", res.ambiguous is not None


def image_cuda(runtime: Mapping[str, object], tag: str | None) -> tuple[str | None, str | None]:
    """The CUDA version an image was built with, and where it was read: runtime.json's
    `image_cuda` (the image's CUDA_VERSION, from the runtime stage's probe), its `torch_cuda`
    (the CUDA its PyTorch was built for), else a `cuNNN` in the image's tag (cu129: 12.9)."""
    for key in ("image_cuda", "torch_cuda"):
        if runtime.get(key):
            return str(runtime[key]), f"runtime.json {key}"
    m = re.search(r"(?:^|[-_.])cu(\d{2})(\d)(?:$|[-_.])", tag or "")
    if m:
        return f"{int(m.group(1))}.{m.group(2)}", f"the image's tag {tag}"
    return None, None
