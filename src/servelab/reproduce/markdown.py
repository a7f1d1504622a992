"""The Markdown report of a comparison (report.md beside reproduction.json): the verdict and
what was judged, what differs between the two sides (once), then one section each for the
claims, the orderings, the points and the host's speed."""

from __future__ import annotations

import hashlib
import json

from servelab.documents.declared import ClaimCheck, Fdr, PairCheck, PointCheck, ReproductionRecord
from servelab.render import md_escape, md_table, num
from servelab.reproduce.differences import differences, unrecorded_engines
from servelab.reproduce.verdict import (
    attribution_text,
    claim_verdict_text,
    host_speed_text,
    signed_pct,
    verdict_text,
)

SHORT = {
    "output_throughput": "tok/s",
    "mean_ttft_ms": "mean TTFT ms",
    "p99_ttft_ms": "p99 TTFT ms",
    "mean_tpot_ms": "mean TPOT ms",
    "p99_tpot_ms": "p99 TPOT ms",
}
# the point metrics the report shows (reproduction.json has them all)
REPORTED_POINT_METRICS = ("output_throughput", "mean_ttft_ms", "mean_tpot_ms")
CLEAN_ROOM = "Nothing that must match differs, and the fresh run is on another host."
HOST_CLASS_TEXT = {
    "differs": "a performance-relevant host fact differs",
    "equivalent": "only facts that do not affect performance differ",
    "identical": "every recorded host fact is the same",
    "unknown": "no performance-relevant difference is known, but a side does not record "
    "every relevant fact",
}


def report_markdown(r: ReproductionRecord) -> str:
    lines = _head(r)
    lines += _differences(r)
    lines += _claims(r["claims"])
    lines += _orderings(r)
    lines += _points(r["points"], r.get("fdr"))
    lines += _host_speed_section(r)
    return "\n".join(lines) + "\n"


def _head(r: ReproductionRecord) -> list[str]:
    ref, new, s = r["reference"], r["fresh"], r["settings"]
    lines = [
        "# Reproduction",
        "",
        f"**Verdict: {verdict_text(r)}** ({r['why']}).",
        "",
        f"- Reference: `{ref['path']}` ({ref['kind']}"
        + (f", tag {ref['tag']}" if ref.get("tag") else "")
        + (f", started {ref['started']}" if ref.get("started") else "")
        + ")",
        f"- Fresh: `{new['path']}` ({new['kind']}"
        + (f", started {new['started']}" if new.get("started") else "")
        + ")",
        f"- Judged: orderings of {', '.join(s['metrics'])} the reference called "
        f"real (paired t-test on log ratios, alpha {s['alpha']}, threshold "
        f"{s['threshold_pct']}%"
        + (f", effect at least {s['min_effect_pct']}%" if s["min_effect_pct"] else "")
        + ("" if s["require_significance"] else ", sign only")
        + "), every claim"
        + (
            f", and {', '.join(s['tolerance_metrics'])} within {s['tolerance_pct']}%"
            if s["tolerance_pct"] is not None
            else "; absolute values are reported, not judged"
        )
        + ".",
    ]
    return lines + [f"- Note: {n}" for n in r["notes"]]


def _claims(claims: list[ClaimCheck]) -> list[str]:
    lines = ["", "## Claims", ""]
    if not claims:
        return [*lines, "The reference states no claims."]
    rows = [
        (
            f"`{c['claim']}`",
            c["reference_verdict"],
            c["fresh_verdict"] or "-",
            claim_verdict_text(c) + (f" ({c['reason']})" if c.get("reason") else ""),
        )
        for c in claims
    ]
    return lines + md_table(("claim", "reference", "fresh", "verdict"), rows)


def _pair(o: PairCheck, axis: str | None) -> str:
    """An ordering's pair: C8 vs C16, or R1 vs R2 at request rates."""
    if axis == "rate":
        return f"R{o['a']:g} vs R{o['b']:g}"
    return f"C{o['a']} vs C{o['b']}"


def _orderings(r: ReproductionRecord) -> list[str]:
    lines = ["", "## Orderings", ""]
    word = "request rates" if r["settings"].get("axis") == "rate" else "concurrency levels"
    lines += [f"Adjacent {word}, `<`/`>` a real difference, `~` none:", ""]
    chains = [
        (
            ch["server_config"],
            SHORT.get(ch["metric"], ch["metric"]),
            ch["reference"],
            ch["fresh"] + ("" if ch["same"] else " (differs)"),
        )
        for ch in r["chains"]
        if ch["metric"] in r["settings"]["metrics"]
    ]
    lines += md_table(("config", "metric", "reference", "fresh"), chains)
    lines += ["", "Judged pairs (the reference called them real):", ""]
    if not r["orderings"]:
        return [*lines, "None."]
    pairs = [
        (
            o["server_config"],
            _pair(o, r["settings"].get("axis")),
            SHORT.get(o["metric"], o["metric"]),
            f"{signed_pct(o['reference_diff_pct'])} ({o['reference_agree']})",
            f"{signed_pct(o['fresh_diff_pct'])} ({o['fresh_agree'] or '-'})",
            o["status"],
            o["verdict"],
        )
        for o in r["orderings"]
    ]
    header = ("config", "pair", "metric", "reference", "fresh", "status", "verdict")
    return lines + md_table(header, pairs)


def _points(points: list[PointCheck], fdr: Fdr | None = None) -> list[str]:
    lines = ["", "## Points", "", "Means over repeats; change = fresh / reference - 1.", ""]
    attributed = fdr is not None
    if attributed:
        assert fdr is not None
        lines[-2:] = [
            "Means over repeats; change = fresh / reference - 1. Each change is tested (Welch's "
            "t on the logs of the repeats), the tests under Benjamini-Hochberg: false discovery "
            f"rate {100 * float(fdr['q']):g}% over the {fdr['tests']} tests of this comparison; "
            "a real change is set against the host's speed (docs/reproduce.md).",
            "",
        ]
    rows = [
        (
            p["server_config"],
            p["rate"] if "rate" in p else p["concurrency"],
            SHORT[p["metric"]],
            f"{num(p['reference_mean'])} ({num(p['reference_cv_pct'], '.1f')}%)",
            f"{num(p['fresh_mean'])} ({num(p['fresh_cv_pct'], '.1f')}%)",
            signed_pct(p["change_pct"]),
            *([attribution_text(p) or "-"] if attributed else []),
            p["status"],
        )
        for p in points
        if p["metric"] in REPORTED_POINT_METRICS
    ]
    header: tuple[str, ...] = ("config", "c", "metric", "reference (CV)", "fresh (CV)", "change")
    header += ("against the host", "status") if attributed else ("status",)
    return lines + md_table(header, rows)


def _host_speed_section(r: ReproductionRecord) -> list[str]:
    speed = host_speed_text(r)
    if speed is None:
        return []
    return ["", "## Host speed", "", f"Host speed: {speed}."]


def _differences(r: ReproductionRecord) -> list[str]:
    """What differs between the two sides, once, before any verdict row: the host's class,
    what keeps the fresh run from being a clean room, then one table of the host facts, the
    engine settings as the servers resolved them, and the runtime and setup fields."""
    lines = ["", "## What differs", ""]
    host, prov = r.get("host"), r["provenance"]
    if host is not None:
        lines.append(
            f"Host class: **{host['class']}** ({HOST_CLASS_TEXT[host['class']]}); "
            "docs/reproduce.md says which facts are performance-relevant and why."
        )
    flags = [f"- **{f}**" for f in prov["not_clean_room"]]
    lines += ["", *(flags or [f"- {CLEAN_ROOM}"])]
    rows = [
        (
            d["kind"],
            md_escape(d["what"]),
            _cell_value(d["reference"]),
            _cell_value(d["fresh"]),
            d["effect"],
        )
        for d in differences(r)
    ]
    if rows:
        lines += ["", *md_table(("kind", "what", "reference", "fresh", "effect"), rows)]
    else:
        lines += ["", "No recorded host fact, engine setting or runtime field differs."]
    engines = unrecorded_engines(r)
    if engines:
        lines += ["", *[f"- {md_escape(x)}" for x in engines]]
    unchecked = prov.get("not_checked") or []
    if unchecked:
        lines += ["", "Could not be checked (a server servelab did not launch):", ""]
        lines += [f"- {md_escape(line)}" for line in unchecked]
    return lines


def _cell_value(v: object) -> str:
    """A value for a table cell: JSON unless a string; a long one as its start and a hash."""
    text = json.dumps(v, sort_keys=True) if not isinstance(v, str) else v
    if len(text) > 60:
        return f"{text[:40]}... (sha256 {hashlib.sha256(text.encode()).hexdigest()[:8]})"
    return md_escape(text)
