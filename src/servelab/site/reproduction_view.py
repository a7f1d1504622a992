"""One reproduction (reproduction.json, docs/reproduce.md) as its page shows it: the overall
verdict with the host it was reached on, what differs between the two sides (once: host facts,
engine settings, runtime), claim by claim reference against fresh, the judged orderings and the
points."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypedDict

from servelab.documents.declared import (
    Counts,
    Fdr,
    PairCheck,
    ReproductionRecord,
    ReproductionSettings,
    SideFacts,
)
from servelab.reproduce.differences import differences, unrecorded_engines
from servelab.reproduce.markdown import HOST_CLASS_TEXT, REPORTED_POINT_METRICS, SHORT
from servelab.reproduce.verdict import (
    attribution_text,
    claim_verdict_text,
    host_speed_text,
    signed_pct,
    verdict_text,
)
from servelab.site import values

# a value longer than this is shown folded, its start as the summary
LONG = 60

# (experiment, tag, tarball sha256 or None) -> the site path of that release's page, if any
FindRelease = Callable[[str | None, str | None, str | None], str | None]


class Cell(TypedDict):
    """A recorded value as a table cell shows it: its text, and the whole when folded."""

    text: str
    full: str | None


class SideView(TypedDict):
    """A side of the comparison, with the site page of its release (None if not the site's)."""

    path: str
    kind: str
    tag: str | None
    experiment: str | None
    started: str | None
    tarball_sha256: str | None
    release: str | None


class ClaimView(TypedDict):
    claim: str
    reference: str
    fresh: str
    verdict: str
    css: str


class OrderingView(TypedDict):
    server_config: str
    pair: str
    metric: str
    reference: str
    fresh: str
    status: str
    verdict: str
    css: str


class ChainView(TypedDict):
    server_config: str
    metric: str
    reference: str
    fresh: str
    same: bool


class PointView(TypedDict):
    server_config: str
    level: str
    metric: str
    reference: str
    fresh: str
    change: str
    host: str | None  # against the host's speed (None before it was compared: no column)
    status: str
    css: str


class DifferenceView(TypedDict):
    """One row of what differs (servelab.reproduce.differences): host fact, engine setting
    or runtime field."""

    kind: str
    what: str
    reference: Cell
    fresh: Cell
    effect: str
    css: str


class DiffersView(TypedDict):
    """What differs between the two sides, once: the host's class in words, what keeps the
    fresh run from being a clean room, the rows, and what could not be compared."""

    host_class: str | None
    class_text: str
    not_clean_room: list[str]
    rows: list[DifferenceView]
    unrecorded: list[str]
    not_checked: list[str]


class ReproductionView(TypedDict):
    """The reproduction page's context (templates/reproduction.html)."""

    verdict: str
    verdict_text: str
    css: str
    why: str
    counts: Counts
    reference: SideView
    fresh: SideView
    settings: list[tuple[str, str]]
    notes: list[str]
    claims: list[ClaimView]
    orderings: list[OrderingView]
    chains: list[ChainView]
    points: list[PointView]
    differs: DiffersView
    host_speed: str | None
    fdr: str | None


def cell(v: object) -> Cell:
    """A recorded value for a table cell: JSON unless a string; a long one folded."""
    text = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    if len(text) > LONG:
        return {"text": text[:40] + "...", "full": text}
    return {"text": text, "full": None}


def _side(d: SideFacts, find: FindRelease) -> SideView:
    return {
        "path": str(d.get("path")),
        "kind": str(d.get("kind")),
        "tag": d.get("tag"),
        "experiment": d.get("experiment"),
        "started": d.get("started"),
        "tarball_sha256": d.get("tarball_sha256"),
        "release": find(d.get("experiment"), d.get("tag"), d.get("tarball_sha256")),
    }


def _claims(r: ReproductionRecord) -> list[ClaimView]:
    return [
        {
            "claim": str(c["claim"]),
            "reference": str(c["reference_verdict"]),
            "fresh": str(c["fresh_verdict"] or "-"),
            "verdict": claim_verdict_text(c) + (f" ({c['reason']})" if c.get("reason") else ""),
            "css": values.css(str(c["verdict"])),
        }
        for c in r["claims"]
    ]


def _pair(o: PairCheck, axis: str | None) -> str:
    """An ordering's pair: C8 vs C16, or R1 vs R2 at request rates."""
    if axis == "rate":
        return f"R{values.level(o['a'])} vs R{values.level(o['b'])}"
    return f"C{o['a']} vs C{o['b']}"


def _orderings(r: ReproductionRecord) -> list[OrderingView]:
    axis = r["settings"].get("axis")
    return [
        {
            "server_config": str(o["server_config"]),
            "pair": _pair(o, axis),
            "metric": SHORT.get(o["metric"], o["metric"]),
            "reference": f"{signed_pct(o['reference_diff_pct'])} ({o.get('reference_agree')})",
            "fresh": f"{signed_pct(o['fresh_diff_pct'])} ({o.get('fresh_agree') or '-'})",
            "status": str(o["status"]),
            "verdict": str(o["verdict"]),
            "css": values.css(str(o["verdict"])),
        }
        for o in r["orderings"]
    ]


def _chains(r: ReproductionRecord) -> list[ChainView]:
    judged = r["settings"]["metrics"]
    return [
        {
            "server_config": str(ch["server_config"]),
            "metric": SHORT.get(ch["metric"], ch["metric"]),
            "reference": str(ch["reference"]),
            "fresh": str(ch["fresh"]),
            "same": bool(ch["same"]),
        }
        for ch in r["chains"]
        if ch["metric"] in judged
    ]


def _points(r: ReproductionRecord) -> list[PointView]:
    rows: list[PointView] = []
    for p in r["points"]:
        if p["metric"] not in REPORTED_POINT_METRICS:
            continue
        ref_cv, new_cv = values.number(p["reference_cv_pct"]), values.number(p["fresh_cv_pct"])
        rows.append(
            {
                "server_config": str(p["server_config"]),
                "level": values.level(p["rate"] if "rate" in p else p["concurrency"]),
                "metric": SHORT.get(p["metric"], p["metric"]),
                "reference": f"{values.number(p['reference_mean'])} ({ref_cv}%)",
                "fresh": f"{values.number(p['fresh_mean'])} ({new_cv}%)",
                "change": signed_pct(p["change_pct"]),
                # against the host's speed (reproductions made before it: None, no column)
                "host": attribution_text(p) or "-" if "host_attribution" in p else None,
                "status": str(p["status"]),
                "css": values.css(str(p["verdict"])) if p.get("verdict") else "",
            }
        )
    return rows


def _differs(r: ReproductionRecord) -> DiffersView:
    """What differs, as report.md says it (servelab.reproduce.differences)."""
    host = r.get("host")
    prov = r["provenance"]
    return {
        "host_class": None if host is None else str(host["class"]),
        "class_text": "" if host is None else HOST_CLASS_TEXT.get(host["class"], ""),
        "not_clean_room": [str(f) for f in prov["not_clean_room"]],
        "rows": [
            {
                "kind": d["kind"],
                "what": d["what"],
                "reference": cell(d["reference"]),
                "fresh": cell(d["fresh"]),
                "effect": d["effect"],
                "css": "v-not-comparable" if d["blocks"] else "",
            }
            for d in differences(r)
        ],
        "unrecorded": unrecorded_engines(r),
        "not_checked": [str(x) for x in prov.get("not_checked") or []],
    }


def _settings(s: ReproductionSettings) -> list[tuple[str, str]]:
    tolerance = s.get("tolerance_pct")
    return [
        ("Orderings judged", ", ".join(s["metrics"]) + " (paired t-test on log ratios)"),
        (
            "alpha, threshold",
            f"{values.value_text(s['alpha'])}, {values.value_text(s['threshold_pct'])}%",
        ),
        (
            "Smallest effect judged",
            f"{values.value_text(s['min_effect_pct'])}%" if s["min_effect_pct"] else "any",
        ),
        ("Fresh run must call it real", "yes" if s["require_significance"] else "no: sign only"),
        (
            "Absolute values",
            f"{', '.join(s['tolerance_metrics'])} within {values.value_text(tolerance)}%"
            if tolerance is not None
            else "reported, not judged",
        ),
    ]


def reproduction_view(r: ReproductionRecord, find: FindRelease) -> ReproductionView:
    """The page's context for the reproduction record `r` (reproduction.json);
    `find` gives the site page of a side that is one of the site's releases."""
    return {
        "verdict": str(r["verdict"]),
        "verdict_text": verdict_text(r),
        "css": values.css(str(r["verdict"])),
        "why": str(r["why"]),
        "counts": r["counts"],
        "reference": _side(r["reference"], find),
        "fresh": _side(r["fresh"], find),
        "settings": _settings(r["settings"]),
        "notes": [str(n) for n in r["notes"]],
        "claims": _claims(r),
        "orderings": _orderings(r),
        "chains": _chains(r),
        "points": _points(r),
        "differs": _differs(r),
        "host_speed": host_speed_text(r),
        "fdr": _fdr(r.get("fdr")),
    }


def _fdr(fdr: Fdr | None) -> str | None:
    """The point tests' false discovery control in words (None before it was applied)."""
    if not fdr:
        return None
    return (
        f"Each change is tested (Welch's t on the logs of the repeats) under {fdr['method']}: "
        f"false discovery rate {100 * float(fdr['q']):g}% over the {fdr['tests']} tests of "
        "this comparison; a real change is set against the host's speed."
    )
