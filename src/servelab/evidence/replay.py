"""provenance.json's `trace`, for a trace replay (workload.trace): the trace's identity (the
file: path or hub repository, revision, sha256), the window replayed (its start, duration, the
requests in it and sent, those left out by reason, its recorded rate), the block size and seed
the prompts were built from, and the time scale of every rate measured. Every configuration
must have replayed the same file and window."""

from __future__ import annotations

from servelab.documents import JsonObject
from servelab.errors import ServelabError
from servelab.evidence.documents import TracePart
from servelab.store.jsonio import read_json
from servelab.store.paths import ARRIVALS_DIR, ExperimentPaths
from servelab.store.records import ArrivalsRecord


def trace_part(paths: ExperimentPaths) -> TracePart:
    """The trace a run replayed, from raw/<sc>/trace.json and its arrivals; nothing without."""
    found: JsonObject | None = None
    scales: JsonObject = {}  # each rate measured (as %g) -> its time scale
    for sc_dir in sorted(p for p in paths.raw.iterdir() if p.is_dir()):
        path = paths.trace(sc_dir.name)
        if not path.exists():
            continue
        record = read_json(path)
        ident: JsonObject = {k: record.get(k) for k in ("file", "window", "block_tokens", "seed")}
        if found is not None and ident != found:
            raise ServelabError(
                f"{path}: replayed another trace or window than the other configurations; "
                "measure every configuration on one trace"
            )
        found = ident
        for a in sorted((sc_dir / ARRIVALS_DIR).glob("*.json")):
            doc = ArrivalsRecord.read(a).doc
            if doc.get("time_scale") is not None:
                scales[f"{float(doc['rate']):g}"] = float(doc["time_scale"])
    if found is None:
        return {}
    return {"trace": {**found, "time_scales": scales}}
