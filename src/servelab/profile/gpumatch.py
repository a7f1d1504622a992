"""The GPUs of an nsys trace matched to the GPUs the telemetry sampled, by UUID.

nsys numbers the GPUs it sees: TARGET_INFO_GPU.id. Inside a container given one GPU, that GPU
is the only one nsys sees and it is listed with id 0, whichever GPU of the host it is; the id
is not the host's GPU index. A UUID names one GPU everywhere: TARGET_INFO_GPU.uuid (and
TARGET_INFO_CUDA_DEVICE.uuid, a process's CUDA device) against the UUIDs the telemetry records
for the GPUs it sampled (a point.json's telemetry.gpu.devices[].uuid, NVML's
nvmlDeviceGetUUID, `GPU-<uuid>`; servelab.telemetry.gpus). UUIDs are compared without case
and without the `GPU-` prefix. A trace GPU without a UUID is matched by its id, and the profile
says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from servelab.documents.declared import TraceGpu
from servelab.errors import ServelabError
from servelab.store.jsonio import read_json


@dataclass(frozen=True)
class TelemetryGpu:
    """One GPU the telemetry sampled: its NVML index, UUID and name."""

    device: int
    uuid: str | None
    name: str | None = None


def normal_uuid(value: object) -> str | None:
    """A UUID as compared: lower case, without the `GPU-` prefix or braces; None for none."""
    if not isinstance(value, str) or not value.strip():
        return None
    text = value.strip().strip("{}").lower()
    return text[4:] if text.startswith("gpu-") else text


def telemetry_gpus(points: Iterable[Path]) -> tuple[TelemetryGpu, ...]:
    """The GPUs the telemetry of these point.json files sampled (telemetry.gpu.devices, and
    the selection's gpus), by NVML index; points that cannot be read are passed over."""
    found: dict[int, TelemetryGpu] = {}
    for path in points:
        try:
            doc = read_json(path)
        except (OSError, ServelabError):
            continue
        gpu = ((doc.get("telemetry") or {}) if isinstance(doc, dict) else {}).get("gpu")
        if not isinstance(gpu, Mapping):
            continue
        listed = list(gpu.get("devices") or []) + list(
            (gpu.get("selection") or {}).get("gpus") or []
        )
        for d in listed:
            if isinstance(d, Mapping) and isinstance(d.get("device"), int):
                index = int(d["device"])
                if found.get(index) is None or found[index].uuid is None:
                    found[index] = TelemetryGpu(index, d.get("uuid"), d.get("name"))
    return tuple(found[i] for i in sorted(found))


def match_gpus(
    trace_gpus: Mapping[str, tuple[str, str | None]],
    active: Iterable[str],
    telemetry: Sequence[TelemetryGpu] | None,
    notes: list[str],
) -> list[TraceGpu]:
    """profile.json's trace.gpus: every GPU of the trace (id -> (name, UUID)) with the
    telemetry GPU it is (`telemetry_device`, the NVML index) and how it was matched (`uuid`,
    or `id` where the trace has no UUID for it). `active`: the GPUs that ran a kernel in a
    window; a note says why one of them is not matched, or was matched by id only."""
    active = set(active)
    by_uuid = {normal_uuid(g.uuid): g for g in telemetry or () if normal_uuid(g.uuid)}
    by_index = {g.device: g for g in telemetry or ()}
    rows: list[TraceGpu] = []
    for gid in sorted(trace_gpus, key=lambda i: (0, int(i)) if i.isdigit() else (1, 0)):
        name, uuid = trace_gpus[gid]
        hit: TelemetryGpu | None = None
        how: str | None = None
        key = normal_uuid(uuid)
        if telemetry is not None and key is not None:
            hit = by_uuid.get(key)
            how = "uuid" if hit is not None else None
        elif telemetry is not None and gid.isdigit():
            hit = by_index.get(int(gid))
            how = "id" if hit is not None else None
        rows.append(
            {
                "id": gid,
                "name": name,
                "uuid": uuid,
                "telemetry_device": hit.device if hit is not None else None,
                "matched_by": how,
            }
        )
        if gid in active and telemetry is not None:
            _note(gid, uuid, hit, telemetry, notes)
    return rows


def _note(
    gid: str,
    uuid: str | None,
    hit: TelemetryGpu | None,
    telemetry: Sequence[TelemetryGpu],
    notes: list[str],
) -> None:
    """Why an active trace GPU is not matched by UUID, when it is not."""
    sampled = ", ".join(f"{g.device} ({g.uuid or 'no UUID'})" for g in telemetry) or "none"
    if uuid is None and hit is not None:
        notes.append(
            f"trace GPU {gid} has no UUID in the export (TARGET_INFO_GPU.uuid): it is matched "
            f"to the telemetry's GPU {hit.device} by its id, which inside a container (nsys "
            "numbers the GPUs it sees from 0) may be another GPU"
        )
    elif uuid is None:
        notes.append(
            f"trace GPU {gid} has no UUID in the export and its id is none of the telemetry's "
            f"GPUs (NVML index: {sampled}): not matched"
        )
    elif hit is None:
        notes.append(
            f"trace GPU {gid} ({uuid}) is none of the GPUs the telemetry sampled ({sampled}): "
            "was the profiling launch on another node or other GPUs than the sweep's?"
        )
