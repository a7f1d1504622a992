"""The Markdown report of a comparison (report.md beside reproduction.json)."""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from servelab.reproduce.verdict import claim_verdict_text, signed_pct, verdict_text

SHORT = {
    "output_throughput": "tok/s",
    "mean_ttft_ms": "mean TTFT ms",
    "p99_ttft_ms": "p99 TTFT ms",
    "mean_tpot_ms": "mean TPOT ms",
    "p99_tpot_ms": "p99 TPOT ms",
}


def _f(x: Any, spec: str = ",.2f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def report_markdown(r: dict[str, Any]) -> str:
    ref, new = r["reference"], r["fresh"]
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
        f"- Judged: orderings of {', '.join(r['settings']['metrics'])} the reference called "
        f"real (paired t-test on log ratios, alpha {r['settings']['alpha']}, threshold "
        f"{r['settings']['threshold_pct']}%"
        + (
            f", effect at least {r['settings']['min_effect_pct']}%"
            if r["settings"]["min_effect_pct"]
            else ""
        )
        + ("" if r["settings"]["require_significance"] else ", sign only")
        + "), every claim"
        + (
            f", and {', '.join(r['settings']['tolerance_metrics'])} within "
            f"{r['settings']['tolerance_pct']}%"
            if r["settings"]["tolerance_pct"] is not None
            else "; absolute values are reported, not judged"
        )
        + ".",
    ]
    lines += [f"- Note: {n}" for n in r["notes"]]
    lines += ["", "## Claims", ""]
    if r["claims"]:
        lines += ["| claim | reference | fresh | verdict |", "|---|---|---|---|"]
        for c in r["claims"]:
            why = f" ({c['reason']})" if c.get("reason") else ""
            lines.append(
                f"| `{c['claim']}` | {c['reference_verdict']} | "
                f"{c['fresh_verdict'] or '-'} | {claim_verdict_text(c)}{why} |"
            )
    else:
        lines.append("The reference states no claims.")
    lines += ["", "## Orderings", ""]
    lines += ["Adjacent concurrency levels, `<`/`>` a real difference, `~` none:", ""]
    lines += ["| config | metric | reference | fresh |", "|---|---|---|---|"]
    for ch in r["chains"]:
        if ch["metric"] in r["settings"]["metrics"]:
            mark = "" if ch["same"] else " (differs)"
            lines.append(
                f"| {ch['server_config']} | {SHORT.get(ch['metric'], ch['metric'])} | "
                f"{ch['reference']} | {ch['fresh']}{mark} |"
            )
    lines += ["", "Judged pairs (the reference called them real):", ""]
    if r["orderings"]:
        lines += [
            "| config | pair | metric | reference | fresh | status | verdict |",
            "|---|---|---|---|---|---|---|",
        ]
        for o in r["orderings"]:
            lines.append(
                f"| {o['server_config']} | C{o['a']} vs C{o['b']} | "
                f"{SHORT.get(o['metric'], o['metric'])} | {signed_pct(o['reference_diff_pct'])} "
                f"({o['reference_agree']}) | {signed_pct(o['fresh_diff_pct'])} "
                f"({o['fresh_agree'] or '-'}) | {o['status']} | {o['verdict']} |"
            )
    else:
        lines.append("None.")
    lines += ["", "## Points", "", "Means over repeats; change = fresh / reference - 1.", ""]
    lines += [
        "| config | c | metric | reference (CV) | fresh (CV) | change | status |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in r["points"]:
        if p["metric"] not in ("output_throughput", "mean_ttft_ms", "mean_tpot_ms"):
            continue
        lines.append(
            f"| {p['server_config']} | {p['concurrency']} | {SHORT[p['metric']]} | "
            f"{_f(p['reference_mean'])} ({_f(p['reference_cv_pct'], '.1f')}%) | "
            f"{_f(p['fresh_mean'])} ({_f(p['fresh_cv_pct'], '.1f')}%) | "
            f"{signed_pct(p['change_pct'])} | {p['status']} |"
        )
    lines += _host_section(r.get("host"))
    prov = r["provenance"]
    lines += ["", "## Provenance", ""]
    if prov["not_clean_room"]:
        lines += [f"- **{f}**" for f in prov["not_clean_room"]]
    else:
        lines.append("- Nothing that must match differs, and the fresh run is on another host.")
    diff = [f for f in prov["fields"] if not f["same"]]
    if diff:
        lines += ["", "| field | reference | fresh | effect |", "|---|---|---|---|"]
        for f in diff:
            effect = {"blocks": "not comparable", "note": "noted"}[f["effect"]]
            lines.append(
                f"| {f['field']} | {_short(f['reference'])} | {_short(f['fresh'])} | {effect} |"
            )
    return "\n".join(lines) + "\n"


HOST_CLASS_TEXT = {
    "differs": "a performance-relevant host fact differs",
    "equivalent": "only facts that do not affect performance differ",
    "identical": "every recorded host fact is the same",
    "unknown": "no performance-relevant difference is known, but a side does not record "
    "every relevant fact",
}


def _host_section(host: dict[str, Any] | None) -> list[str]:
    if host is None:
        return []
    lines = [
        "",
        "## Host",
        "",
        f"Host class: **{host['class']}** ({HOST_CLASS_TEXT[host['class']]}); "
        "docs/reproduce.md says which facts are performance-relevant and why.",
    ]
    rows = [(d, "yes") for d in host["relevant_differences"]]
    rows += [
        (d, "no" + (f" ({d['note']})" if d.get("note") else "")) for d in host["other_differences"]
    ]
    if rows:
        lines += ["", "| fact | reference | fresh | performance-relevant |", "|---|---|---|---|"]
        for d, rel in rows:
            lines.append(
                f"| {d['fact']} | {_short(d['reference'])} | {_short(d['fresh'])} | {rel} |"
            )
    unknown = host["unknown"]
    if unknown:
        lines += ["", "Not recorded on both sides (cannot be compared):", ""]
        lines += ["| fact | not recorded by | performance-relevant |", "|---|---|---|"]
        for u in unknown:
            lines.append(
                f"| {u['fact']} | {', '.join(u['missing_in'])} | "
                f"{'yes' if u['relevant'] else 'no'} |"
            )
    return lines


def _short(v: Any) -> str:
    text = json.dumps(v, sort_keys=True) if not isinstance(v, str) else v
    if len(text) > 60:
        return f"{text[:40]}... (sha256 {hashlib.sha256(text.encode()).hexdigest()[:8]})"
    return text.replace("|", "\\|")
