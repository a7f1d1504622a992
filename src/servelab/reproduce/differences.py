"""What differs between the two sides of a comparison, said once: one table of the host facts,
the engine settings as the servers resolved them, and the runtime and setup fields of the
provenance that differ, each row with its effect on the verdicts. The report (report.md) and
the site's reproduction page show it once, at the top; the verdict line names only the host's
class, and each claim, ordering and point row only its own verdict."""

from __future__ import annotations

from typing import TypedDict

from servelab.documents.declared import (
    DifferenceRow as HostDifference,
    EngineDiff,
    FieldRow,
    HostComparison,
    ReproductionRecord,
)
from servelab.hostfacts import difference_names

HOST, ENGINE, RUNTIME = "host", "engine", "runtime"
NOT_RECORDED_CELL = "not recorded"


class DiffersRow(TypedDict):
    """One difference: what kind (host, engine, runtime), what, the value on each side (as
    recorded; "not recorded" where a side has none), its effect in words, and whether it
    makes the comparison NOT COMPARABLE."""

    kind: str
    what: str
    reference: object
    fresh: object
    effect: str
    blocks: bool


def _host_rows(host: HostComparison | None) -> list[DiffersRow]:
    if host is None:
        return []
    rows: list[DiffersRow] = []
    for d in host.get("relevant_differences", []):
        rows.append(_row(HOST, d["fact"], d, "performance-relevant"))
    for d in host.get("other_differences", []):
        note = f" ({d['note']})" if d.get("note") else ""
        rows.append(_row(HOST, d["fact"], d, "not performance-relevant" + note))
    for u in host.get("unknown", []):
        missing = u.get("missing_in", [])
        effect = "cannot be compared" + (", performance-relevant" if u.get("relevant") else "")
        rows.append(
            {
                "kind": HOST,
                "what": u["fact"],
                "reference": NOT_RECORDED_CELL if "reference" in missing else u.get("reference"),
                "fresh": NOT_RECORDED_CELL if "fresh" in missing else u.get("fresh"),
                "effect": effect,
                "blocks": False,
            }
        )
    return rows


def _row(
    kind: str, what: str, d: HostDifference | FieldRow, effect: str, blocks: bool = False
) -> DiffersRow:
    return {
        "kind": kind,
        "what": what,
        "reference": d.get("reference"),
        "fresh": d.get("fresh"),
        "effect": effect,
        "blocks": blocks,
    }


def _engine_rows(engine: EngineDiff | None) -> list[DiffersRow]:
    if engine is None:
        return []
    rows: list[DiffersRow] = []
    for r in engine.get("rows", []):
        blocks = bool(r["scheduling"] and not r["pinned"])
        why = "pinned by the arguments" if r["pinned"] else "vLLM's own choice"
        effect = ("blocks orderings, knees and claims" if blocks else "noted") + f" ({why})"
        rows.append(
            {
                "kind": ENGINE,
                "what": f"{r['server_config']}: {r['setting']}",
                "reference": r["a"],
                "fresh": r["b"],
                "effect": effect,
                "blocks": blocks,
            }
        )
    return rows


def _runtime_rows(fields: list[FieldRow]) -> list[DiffersRow]:
    return [
        _row(
            RUNTIME,
            f["field"],
            f,
            "not comparable" if f["effect"] == "blocks" else "noted",
            f["effect"] == "blocks",
        )
        for f in fields
        if not f["same"]
    ]


def differences(r: ReproductionRecord) -> list[DiffersRow]:
    """Every difference between the reference and the fresh run: host facts (those that
    differ, then those a side does not record), engine settings, runtime and setup."""
    prov = r["provenance"]
    return (
        _host_rows(r.get("host"))
        + _engine_rows(prov.get("engine"))
        + _runtime_rows(list(prov["fields"]))
    )


def unrecorded_engines(r: ReproductionRecord) -> list[str]:
    """The configurations whose engine settings a side did not record, one line each; None
    recorded on either side (a reproduction made before they were compared) says so once."""
    engine = r["provenance"].get("engine")
    if engine is None:
        return ["engine settings: not compared (a reproduction made before they were recorded)"]
    return list(engine["not_recorded"])


def differences_line(r: ReproductionRecord) -> str | None:
    """The differences in one line for the terminal, each named once: the performance-relevant
    host facts, every engine setting and every runtime field that differs ("host: avx512f, ISA
    class avx512_bf16+amx -> avx2; engine: mns8: max_num_seqs 256 -> 1024; runtime:
    vllm_version 0.31.0 -> 0.32.0"; None: none)."""
    parts = []
    host = r.get("host")
    if host is not None and host["relevant_differences"]:
        parts.append("host: " + difference_names(host["relevant_differences"], limit=None))
    rows_of = differences(r)
    for kind, label in ((ENGINE, "engine"), (RUNTIME, "runtime")):
        rows = [d for d in rows_of if d["kind"] == kind]
        if rows:
            parts.append(f"{label}: " + ", ".join(_text(d) for d in rows))
    return "; ".join(parts) or None


def _text(d: DiffersRow) -> str:
    a, b = d["reference"], d["fresh"]
    short = all(isinstance(v, str | int | float | bool) and len(str(v)) <= 24 for v in (a, b))
    return f"{d['what']} {a} -> {b}" if short else d["what"]
