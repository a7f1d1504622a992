"""One release folder as its page shows it: the release's facts, claims, per-point table,
validity, diagnoses, figures, profile summaries and files. Every section reads its own file;
a file that cannot be read is named in its section and the rest of the page still shows."""

from __future__ import annotations

import csv
from collections.abc import Callable, Container
from pathlib import Path
from typing import Any

from servelab.analysis.groups import SUMMARY_METRICS
from servelab.analysis.markdown import cpu_line
from servelab.analysis.proposals import proposal_line
from servelab.analysis.validity import AFFECTS_WORDS
from servelab.errors import ServelabError
from servelab.hostfacts import ISA_FLAGS
from servelab.metrics import insufficient, percentile_of
from servelab.site import layout, values
from servelab.site.release_records import (
    ClaimRow,
    ClaimsSection,
    CopiedFile,
    DiagnosesSection,
    DiagnosisRow,
    PerPoint,
    PointCell,
    PointTable,
    ProfileRow,
    ReleaseContext,
    ReleaseRow,
    ValiditySection,
)
from servelab.site.scan import ReleaseDir
from servelab.store.jsonio import read_json
from servelab.store.paths import PROFILE_FILE

# what a damaged or unexpected file raises while a section reads it
READ_ERRORS = (ServelabError, OSError, ValueError, KeyError, TypeError, AttributeError, csv.Error)
AXES = ("concurrency", "rate")
# the per-point table's metrics first, in this order; any other of summary.csv after them
METRIC_ORDER = tuple(SUMMARY_METRICS)


def guarded(read: Callable[[Path], Any], folder: Path) -> Any:
    """`read(folder)`, or {"error": why} when a file it reads is damaged or unexpected."""
    try:
        return read(folder)
    except READ_ERRORS as exc:
        return {"error": f"{read.__name__.lstrip('_')}: {exc}".replace(f"{folder}/", "")}


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8", newline="") as fh:
        return list(csv.DictReader(fh))


def _cpu(host: dict[str, Any]) -> list[tuple[str, str]]:
    """The CPU rows of the host table, in the report's words."""
    f = host.get("cpu_facts") or {}
    if not f:
        return [
            ("CPU", str(host.get("cpu") or "-")),
            ("CPU facts", "not recorded (a bundle made before they were)"),
        ]
    flags = f.get("flags") or {}
    order = [k for k in ISA_FLAGS if k in flags] + sorted(set(flags) - set(ISA_FLAGS))
    return [
        ("CPU", cpu_line(host["cpu_facts"])),  # f, as recorded
        ("ISA class", str(f.get("isa_class"))),
        ("ISA flags present", ", ".join(k for k in order if flags[k]) or "none of those checked"),
        ("ISA flags absent", ", ".join(k for k in order if not flags[k]) or "none"),
    ]


def host_rows(prov: dict[str, Any]) -> list[tuple[str, str]]:
    """The measuring host, row by row (provenance.json `host`, and `runtime.isa`)."""
    host = prov.get("host") or {}
    rows = _cpu(host)
    isa = (prov.get("runtime") or {}).get("isa")
    if isa:
        caps = isa.get("env") or {}
        rows.append(
            (
                "The server runtime computes with",
                f"PyTorch {isa.get('cpu_capability')}, oneDNN {isa.get('onednn_isa')}"
                + (
                    "; capped by " + ", ".join(f"{k}={v}" for k, v in sorted(caps.items()))
                    if caps
                    else " (no ISA cap set)"
                ),
            )
        )
    gpus = host.get("gpus") or []
    gpu_text = "; ".join(
        f"{g.get('name')} (driver {g.get('driver')}, {g.get('memory')})"
        for g in gpus
        if isinstance(g, dict)
    )
    rows += [
        ("GPUs", gpu_text or f"none ({host.get('gpu_reason') or 'no reason recorded'})"),
        (
            "Memory",
            f"{values.number((host.get('memory_bytes') or 0) / 2**30)} GiB"
            if host.get("memory_bytes")
            else "-",
        ),
        ("OS, kernel, machine", f"{host.get('os')}, {host.get('kernel')}, {host.get('machine')}"),
    ]
    return rows


def provenance_rows(prov: dict[str, Any], release: dict[str, Any]) -> list[tuple[str, str]]:
    """What the release was made from: pipeline, versions, model, runtime, times, pinning."""
    pipe = prov.get("pipeline") or {}
    model = prov.get("model") or {}
    rt = prov.get("runtime") or {}
    locks = pipe.get("locks") or {}
    pinned = release.get("pinned")
    rows = [
        ("Experiment", str(prov.get("experiment"))),
        ("Started, finished", f"{prov.get('started') or '-'}, {prov.get('finished') or '-'}"),
        (
            "git commit",
            str(pipe.get("git_commit"))
            + (" (uncommitted changes)" if pipe.get("git_dirty") else ""),
        ),
        ("servelab", str(pipe.get("servelab_version"))),
        ("Analysis version", str(pipe.get("analysis_version") or 1)),
        ("Snakemake", str(pipe.get("snakemake_version"))),
        ("vLLM", str(prov.get("vllm_version"))),
        (
            "Model",
            f"{model.get('source')}"
            + (f" {model['repo']}" if model.get("repo") else "")
            + f", revision {model.get('revision')}",
        ),
        (
            "Runtime",
            f"{rt.get('kind')}"
            + (f", lock {rt.get('lock')} sha256 {rt.get('lock_sha256')}" if rt.get("lock") else "")
            + (f", image {rt.get('image')}" if rt.get("image") else ""),
        ),
    ]
    rows += [(f"Lock {name}", str(digest)) for name, digest in sorted(locks.items())]
    for sc, server in sorted((prov.get("servers") or {}).items()):
        args = (server.get("args") or {}) if isinstance(server, dict) else {}
        rows.append(
            (
                f"Server {sc}",
                ", ".join(f"{k}={values.value_text(v)}" for k, v in sorted(args.items())) or "-",
            )
        )
    reasons = "; ".join(release.get("unpinned_reasons") or [])
    rows.append(("Pinned", "yes" if pinned else f"no: {reasons}" if pinned is not None else "-"))
    return rows


def date_of(prov: dict[str, Any]) -> str | None:
    """The day the release's run started (YYYY-MM-DD), when provenance records it."""
    started = prov.get("started")
    return str(started)[:10] if started else None


def _claim_line(ev: Any) -> str | None:
    """A paired comparison's evidence in one line; None for any other evidence."""
    if not isinstance(ev, dict) or "mean_rel_diff_pct" not in ev:
        return None
    p = ev.get("p_value")
    return (
        f"mean difference {values.value_text(ev.get('mean_rel_diff_pct'))}% over "
        f"{ev.get('n')} paired repeats, {ev.get('agree')} agree"
        + (f", p = {values.value_text(p)}" if p is not None else "")
        + (f" ({ev['test_verdict']})" if ev.get("test_verdict") else "")
    )


def claims(folder: Path) -> ClaimsSection:
    """tables/claims.json: each claim with its verdict and evidence; held/total."""
    rows: list[ClaimRow] = []
    for c in read_json(folder / "tables" / "claims.json"):
        verdict = str(c["verdict"])
        rows.append(
            {
                "claim": str(c["claim"]),
                "verdict": verdict,
                "css": values.css(verdict),
                "reason": c.get("reason"),
                "line": _claim_line(c.get("evidence")),
                "evidence": c.get("evidence"),
            }
        )
    held = sum(1 for r in rows if r["verdict"] == "holds")
    return {"rows": rows, "held": held, "total": len(rows)}


def _axis(row: Container[str]) -> str:
    return next((a for a in AXES if a in row), "concurrency")


def per_point(folder: Path) -> PerPoint:
    """tables/summary.csv as one table per server configuration: a row per level, a column
    per metric, each cell the mean with its 95% CI and the repeats it rests on."""
    rows = read_csv(folder / "tables" / "summary.csv")
    axis = _axis(rows[0]) if rows else "concurrency"
    found = {r["metric"] for r in rows}
    metrics = [m for m in METRIC_ORDER if m in found] + sorted(found - set(METRIC_ORDER))
    short = _insufficient(folder, axis)
    cells: dict[str, dict[str, dict[str, PointCell]]] = {}
    for r in rows:
        key = (r["server_config"], r[axis], r["metric"])
        cells.setdefault(r["server_config"], {}).setdefault(r[axis], {})[r["metric"]] = {
            "mean": short[key] if r["n"] == "0" and key in short else _cell(r["mean"]),
            "ci": f"[{_cell(r['ci95_low'])}, {_cell(r['ci95_high'])}]",
            "n": r["n"],
        }
    tables: list[PointTable] = [
        {
            "server_config": sc,
            "id": layout.anchor(sc),
            "rows": [
                {"level": lv, "cells": [by_level[lv].get(m) for m in metrics]}
                for lv in sorted(by_level, key=values.level_key)
            ],
        }
        for sc, by_level in sorted(cells.items())
    ]
    return {"axis": axis, "metrics": metrics, "tables": tables}


def _insufficient(folder: Path, axis: str) -> dict[tuple[str, str, str], str]:
    """'insufficient (n = 4: max 21.0 ms; p99 needs 368)' by (server config, level, metric):
    the percentiles that points.csv leaves blank because a point's requests are too few to
    report them (of the point's repeats, the one with the fewest requests)."""
    path = folder / "tables" / "points.csv"
    fewest: dict[tuple[str, str, str], tuple[int, str]] = {}
    for r in read_csv(path) if path.exists() else []:
        for column, text in r.items():
            of = percentile_of(column)
            if of is None or text or not r.get(f"n_{of[0]}"):
                continue
            n, top = int(float(r[f"n_{of[0]}"])), r.get(f"max_{of[0]}_ms")
            key = (r["server_config"], r[axis], column)
            if key not in fewest or n < fewest[key][0]:
                fewest[key] = (n, insufficient(of[1], n, float(top) if top else None))
    return {key: f"insufficient ({why})" for key, (_, why) in fewest.items()}


def _cell(text: str | None) -> str:
    """A number of a CSV table as the site shows it."""
    return values.number(float(text) if text not in (None, "") else None)


def _point_counts(folder: Path) -> tuple[int, int] | None:
    """(valid, total) points, from points.csv's `valid` column or else validity.json; None
    when neither records validity."""
    points = folder / "tables" / "points.csv"
    if points.is_file():
        rows = read_csv(points)
        if rows and "valid" in rows[0]:
            return sum(1 for r in rows if r["valid"] == "true"), len(rows)
    record = folder / "tables" / "validity.json"
    if record.is_file():
        pts = read_json(record)["points"]
        return sum(1 for p in pts if p["valid"]), len(pts)
    return None


def validity(folder: Path) -> ValiditySection:
    """The points valid/total, every check with its threshold and counts, and every flagged
    point with its reason (tables/validity.json, or points.csv's reasons without it)."""
    counted = _point_counts(folder)
    out: ValiditySection = {"valid": None, "total": None, "checks": [], "flagged": []}
    if counted is not None:
        out["valid"], out["total"] = counted
    record = folder / "tables" / "validity.json"
    if record.is_file():
        v = read_json(record)
        counts = v.get("counts") or {}
        for k in v["checks"]:
            n = counts.get(k["name"]) or {}
            limit = k.get("threshold_key")
            out["checks"].append(
                {
                    "name": k["name"],
                    "threshold": f"{limit} = {values.value_text(k.get('threshold'))}"
                    if limit
                    else "-",
                    "removes": AFFECTS_WORDS.get(k.get("affects"), str(k.get("affects"))),
                    "counts": [n.get(s, 0) for s in ("passed", "failed", "noted", "not checked")],
                }
            )
        out["flagged"] = _flagged(v["points"])
    elif counted is not None:
        out["flagged"] = _flagged_csv(read_csv(folder / "tables" / "points.csv"))
    return out


def _flagged(points: list[dict[str, Any]]) -> list[dict[str, str]]:
    rows = []
    for p in points:
        for k in p.get("checks") or []:
            if k.get("status") in ("failed", "noted"):
                rows.append(
                    {
                        "server_config": str(p["server_config"]),
                        "repeat": str(p.get("repeat")),
                        "level": values.level(p.get(_axis(p))),
                        "check": str(k["check"]),
                        "status": str(k["status"]),
                        "reason": str(k.get("reason")),
                    }
                )
    return rows


def _flagged_csv(rows: list[dict[str, str]]) -> list[dict[str, str]]:
    return [
        {
            "server_config": r["server_config"],
            "repeat": r["repeat"],
            "level": r[_axis(r)],
            "check": reason.split(":", 1)[0],
            "status": "failed",
            "reason": reason,
        }
        for r in rows
        if r.get("valid") == "false"
        for reason in (r.get("invalid_reasons") or "").split(";")
        if reason
    ]


def diagnoses(folder: Path) -> DiagnosesSection:
    """tables/diagnoses.json: each diagnosis in words, with its evidence level and its
    proposal (or why it has no remedy), as the report writes them."""
    out: list[DiagnosisRow] = []
    for d in read_json(folder / "tables" / "diagnoses.json"):
        axis = next((a for a in AXES if a in d), None)
        where = None
        if axis is not None:
            at = d[axis] if isinstance(d[axis], list) else [d[axis]]
            where = f"{axis} {', '.join(values.level(x) for x in at)}"
        out.append(
            {
                "kind": str(d["kind"]),
                "server_config": str(d.get("server_config")),
                "where": where,
                "level": (d.get("evidence_level") or {}).get("label"),
                "suggestion": str(d.get("suggestion")),
                "proposal": proposal_line(d),
                "evidence": d.get("evidence"),
            }
        )
    return {"rows": out}


def profiles(bundle: Path | None) -> list[ProfileRow]:
    """The profile summary of each server configuration the bundle profiled
    (profile/<config>/profile.json): status, tool, localisation verdicts and notes."""
    if bundle is None or not (bundle / "profile").is_dir():
        return []
    out: list[ProfileRow] = []
    for path in sorted((bundle / "profile").glob(f"*/{PROFILE_FILE}")):
        p = read_json(path)
        out.append(
            {
                "server_config": path.parent.name,
                "status": str(p.get("status")),
                "tool": p.get("tool"),
                "reason": p.get("reason"),
                "localisation": [str(v.get("text")) for v in p.get("localisation") or []],
                "notes": [str(n) for n in p.get("notes") or []],
            }
        )
    return out


TOC = (
    ("verification", "Verification"),
    ("summary", "Summary"),
    ("claims", "Claims"),
    ("figures", "Figures"),
    ("points", "Per point"),
    ("validity", "Validity"),
    ("diagnoses", "Diagnoses"),
    ("profile", "Profile"),
    ("host", "Host"),
    ("provenance", "Provenance"),
    ("files", "Files"),
)
LINKED = {
    "claims": "tables/claims.json",
    "summary": "tables/summary.csv",
    "points_csv": "tables/points.csv",
    "diagnoses": "tables/diagnoses.json",
    "provenance": "provenance.json",
}


def _json_or_error(path: Path) -> tuple[dict[str, Any], str | None]:
    try:
        data = read_json(path)
    except READ_ERRORS as exc:
        return {}, str(exc).replace(f"{path.parent}/", "")
    if not isinstance(data, dict):
        return {}, f"{path.name}: not a JSON object"
    return data, None


def _fraction(section: dict[str, Any], part: str, whole: str) -> str:
    if section.get("error"):
        return "unreadable"
    if section.get(whole) is None:
        return "not checked"
    return f"{section[part]}/{section[whole]}"


def _figures(rel: ReleaseDir, page: str, files: list[CopiedFile]) -> list[dict[str, str]]:
    svgs = [
        f["path"] for f in files if f["path"].startswith("figures/") and f["path"].endswith(".svg")
    ]
    out = []
    for path in sorted(svgs, key=lambda p: values.figure_key(Path(p).stem)):
        stem = Path(path).stem
        out.append(
            {
                "name": Path(path).name,
                "src": layout.href(page, f"{layout.release_files(rel.experiment, rel.tag)}/{path}"),
                "alt": values.figure_text(stem),
                "caption": stem.replace("_", " ").capitalize(),
            }
        )
    return out


def release_context(
    rel: ReleaseDir, page: str, files: list[CopiedFile], failures: list[str]
) -> ReleaseContext:
    """The release page's context, and its row of the index (`row`)."""
    folder = rel.path
    prov, prov_error = _json_or_error(folder / "provenance.json")
    release, _ = _json_or_error(folder / "release.json")
    copied = {f["path"] for f in files}
    base = layout.release_files(rel.experiment, rel.tag)
    sections = {
        "claims": guarded(claims, folder),
        "points": guarded(per_point, folder),
        "validity": guarded(validity, folder),
        "diagnoses": guarded(diagnoses, folder),
    }
    for s in sections.values():
        s.setdefault("error", None)
    sections["validity"].setdefault("axis", sections["points"].get("axis", "concurrency"))
    row: ReleaseRow = {
        "tag": rel.tag,
        "date": date_of(prov) or "-",
        "host": values.host_class(prov) if not prov_error else "unreadable",
        "commit": str((prov.get("pipeline") or {}).get("git_commit") or "-")[:12],
        "servelab": str((prov.get("pipeline") or {}).get("servelab_version") or "-"),
        "vllm": str(prov.get("vllm_version") or "-"),
        "claims": _fraction(sections["claims"], "held", "total"),
        "points": _fraction(sections["validity"], "valid", "total"),
        "failures": failures,
    }
    summary = [
        ("Date", row["date"]),
        ("Host", row["host"]),
        ("git commit", str((prov.get("pipeline") or {}).get("git_commit") or "-")),
        (
            "servelab, analysis version",
            f"{row['servelab']}, {(prov.get('pipeline') or {}).get('analysis_version') or 1}",
        ),
        ("vLLM", row["vllm"]),
        ("Claims held", row["claims"]),
        ("Valid points", row["points"]),
    ]
    return {
        "experiment": str(release.get("experiment") or prov.get("experiment") or rel.experiment),
        "tag": rel.tag,
        "toc": TOC,
        "failures": failures,
        "summary": summary,
        "claims": sections["claims"],
        "points": sections["points"],
        "validity": sections["validity"],
        "diagnoses": sections["diagnoses"],
        "figures": _figures(rel, page, files),
        "host": host_rows(prov) if not prov_error else [],
        "provenance": provenance_rows(prov, release) if not prov_error else [],
        "host_error": prov_error,
        "links": {
            k: layout.href(page, f"{base}/{p}") if p in copied else None for k, p in LINKED.items()
        },
        "files": [{**f, "href": layout.href(page, f"{base}/{f['path']}")} for f in files],
        "row": row,
    }
