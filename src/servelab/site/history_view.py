"""An experiment's history page: every metric of every point across its releases (a figure
and a table per metric) and, between each pair of consecutive releases, a change verdict per
point and metric, with the host differences named and the pairs that cannot be compared
saying why. It renders the record `servelab.site.history.release_history` returns."""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, Protocol, TypedDict

from servelab.analysis.changepoints import CHANGED
from servelab.analysis.hostspeed import no_speed_words
from servelab.design.level import LevelValue
from servelab.site import values
from servelab.site.history_changes import point_words, run_words, series_answer
from servelab.site.history_records import (
    History,
    Pair,
    PairPoint,
    ReleaseRow,
    Series,
    SeriesPoint,
)

# the verdicts of a point between two releases (servelab.analysis.hostspeed's answers, then
# the history's own), each with the short words of a table cell and the words of a count
BEYOND_HOST = "changed beyond what the host explains"
AS_HOST = "changed as much as the host's speed did (not attributed to the code)"
UNKNOWN = "unknown: the canary cannot tell the host's speed from the code's"
HOST_NOT_RECORDED = "host speed not recorded"
VERDICTS = (
    BEYOND_HOST,
    AS_HOST,
    UNKNOWN,
    HOST_NOT_RECORDED,
    "unchanged",
    "invalid",
    "not comparable",
)
CELL_WORDS = {
    BEYOND_HOST: "beyond the host",
    AS_HOST: "as the host's speed",
    UNKNOWN: "unknown",
    HOST_NOT_RECORDED: "changed, host speed not recorded",
}
COUNT_WORDS = {
    UNKNOWN: "unknown (the canary cannot tell the host's speed from the code's)",
    HOST_NOT_RECORDED: "changed with the host speed not recorded (not attributed to the code)",
}
CSS = {
    AS_HOST: "v-as-host",
    UNKNOWN: "v-unknown",
    HOST_NOT_RECORDED: "v-host-not-recorded",
    "better": "v-beyond-better",
    "worse": "v-beyond-worse",
}
HISTORY_MODULE = "servelab.site.history"


class ReleaseHistory(Protocol):
    """`servelab.site.history.release_history`: `checked` maps a release folder to the check the
    caller already made of it (`site.check.CheckedRelease`), so it is not verified again."""

    def __call__(
        self,
        experiment: str,
        releases: list[Path],
        workdir: Path,
        checked: Mapping[Path, Any] | None = None,
    ) -> History: ...


@dataclass(frozen=True)
class HistoryApi:
    """The release history's record and figures (servelab.site.history)."""

    release_history: ReleaseHistory
    history_figure: Callable[[History, str], bytes]
    history_figure_alt: Callable[[History, str], str]


def history_api() -> HistoryApi | None:
    """servelab.site.history's functions, imported when a page needs them; None when this
    servelab has no such module."""
    try:
        mod = importlib.import_module(HISTORY_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != HISTORY_MODULE:
            raise
        return None
    return HistoryApi(mod.release_history, mod.history_figure, mod.history_figure_alt)


class ReleaseView(TypedDict):
    """A release's row of the history page."""

    tag: str
    date: str
    commit: str
    analysis_version: str
    servelab_version: str
    vllm_version: str
    host_class: str
    points: str
    error: str | None
    failures: list[str]


class LevelRow(TypedDict):
    """A server configuration and level of a table, a cell per release or metric, and in a
    metric's table its change points in words."""

    server_config: str
    level: str
    cells: list[Any]
    change: NotRequired[str]


class MetricTable(TypedDict):
    """A metric's table: a column per release."""

    tags: list[str]
    rows: list[LevelRow]


class MetricView(TypedDict):
    """A metric's section: its figure, its table and its change points in one line (None for
    a history recorded without them)."""

    metric: str
    id: str
    figure: dict[str, str] | None
    table: MetricTable
    changes: str | None


class ChangeCell(TypedDict):
    """A point's cell between two releases."""

    verdict: str
    word: str
    css: str
    detail: str


class PairView(TypedDict):
    """Two consecutive releases: a row per point, a cell per metric, the counts per verdict."""

    before: str
    after: str
    id: str
    comparable: bool
    why_not: str | None
    changed: str | None
    engine: list[str]
    host: list[str]
    host_speed: str | None
    fdr: str | None
    metrics: list[str]
    rows: list[LevelRow]
    counts: list[tuple[str, int]]


class HistoryView(TypedDict):
    """The history page's context (templates/history.html)."""

    releases: list[ReleaseView]
    metrics: list[MetricView]
    pairs: list[PairView]
    verdicts: list[tuple[str, str, str]]
    change_method: str | None


def _release_row(r: ReleaseRow, failures: dict[str, list[str]]) -> ReleaseView:
    commit = r.get("git_commit")
    return {
        "tag": str(r["tag"]),
        "date": str(r["date"])[:10] if r.get("date") else "-",
        "commit": str(commit)[:12] if commit else "-",
        "analysis_version": values.value_text(r.get("analysis_version")),
        "servelab_version": values.value_text(r.get("servelab_version")),
        "vllm_version": values.value_text(r.get("vllm_version")),
        "host_class": values.value_text(r.get("host_class")),
        "points": (
            f"{r['points_valid']}/{r['points_total']}" if r.get("points_total") is not None else "-"
        ),
        "error": r.get("error"),
        "failures": failures.get(str(r["tag"]), []),
    }


def _ci(p: SeriesPoint) -> str:
    """A series point: its mean with the 95% CI ([low, high], or ± a half-width), the repeats
    it rests on, and how many a validity check left out."""
    lost = p.get("invalid")
    if lost is True or (p.get("mean") is None and lost):
        return "invalid"
    if p.get("mean") is None:
        return "-"
    ci = p.get("ci95")
    if isinstance(ci, list | tuple) and len(ci) == 2:
        spread = f" [{values.number(ci[0])}, {values.number(ci[1])}]"
    else:
        spread = f" ± {values.number(ci)}" if ci is not None else ""
    notes = [f"n {p['n']}"] if p.get("n") is not None else []
    if isinstance(lost, int | float) and lost:
        notes.append(f"{lost:g} invalid")
    return f"{values.number(p['mean'])}{spread}" + (f" ({', '.join(notes)})" if notes else "")


def _metric_table(history: History, metric: str) -> MetricTable:
    """The series of `metric`: a row per server configuration and level, a column per
    release."""
    tags = [str(r["tag"]) for r in history["releases"]]
    rows: list[LevelRow] = []
    series = [s for s in history["series"] if s["metric"] == metric]
    for s in sorted(series, key=lambda s: (str(s["server_config"]), values.level_key(s["level"]))):
        at = {str(p["tag"]): p for p in s["points"]}
        row: LevelRow = {
            "server_config": str(s["server_config"]),
            "level": values.level(s["level"]),
            "cells": [_ci(at[t]) if t in at else "-" for t in tags],
        }
        if "change_points" in s:
            row["change"] = run_words(s["change_points"])
        rows.append(row)
    return {"tags": tags, "rows": rows}


def _changes(history: History, metric: str) -> str | None:
    """A metric's change points in one line: how many series changed, where and by how much,
    and how many have no change point (or too few releases to tell)."""
    series = [s for s in history["series"] if s["metric"] == metric and "change_points" in s]
    if not series:
        return None
    series.sort(key=lambda s: (str(s["server_config"]), values.level_key(s["level"])))
    answers = [series_answer(s["change_points"]) for s in series]
    changed = [s for s, a in zip(series, answers, strict=True) if a == CHANGED]
    text = f"{len(changed)} of {len(series)} series changed"
    if changed:
        text += ": " + "; ".join(_changed_words(s) for s in changed)
    others = sorted({a for a in answers if a != CHANGED}, key=answers.index)
    counts = [f"{answers.count(a)} {a}" for a in others]
    return text + (f"; {', '.join(counts)}" if counts else "") + "."


def _changed_words(s: Series) -> str:
    """A changed series in the metric's line: its point and its change points."""
    points = [c for r in s["change_points"] for c in r["change_points"]]
    where = f"{s['server_config']} at {values.level(s['level'])}"
    return f"{where}: {', '.join(point_words(c) for c in points)}"


def host_words(host: Any) -> list[str]:
    """A pair's host differences in words, whatever form the record gives them."""
    if not host:
        return []
    if isinstance(host, str):
        return [host]
    if isinstance(host, dict):
        if host.get("qualifier"):
            return [str(host["qualifier"])]
        if host.get("class") is not None:
            return [f"host class {host['class']}"]
        return [json.dumps(host, sort_keys=True)]
    if isinstance(host, list):
        return [w for h in host for w in host_words(h)]
    return [str(host)]


def _words(x: Any) -> str | None:
    """A reason given as text or as a list of phrases, as one line."""
    if isinstance(x, list | tuple):
        return "; ".join(str(w) for w in x) or None
    return str(x) if x else None


def _change(p: PairPoint) -> ChangeCell:
    """A point's cell: its verdict in a few words (a change beyond the host says which way),
    the change of the mean, the test's p and its Benjamini-Hochberg adjusted p, and a change
    beyond the host measured against the host's speed."""
    verdict = str(p.get("verdict"))
    direction = p.get("direction")
    word = CELL_WORDS.get(verdict, verdict)
    if verdict == BEYOND_HOST and direction:
        word = f"{direction}, {word}"
    change = p.get("change_pct")
    detail = "-" if change is None else f"{change:+.2f}%"
    if p.get("p_value") is not None:
        detail += f", p {values.value_text(p['p_value'])}"
    if p.get("p_adjusted") is not None:
        detail += f", BH p {values.value_text(p['p_adjusted'])}"
    if p.get("vs_host_pct") is not None and verdict in (BEYOND_HOST, UNKNOWN):
        detail += f", {p['vs_host_pct']:+.1f}% against the host"
    if verdict == UNKNOWN and p.get("why"):
        detail += f"; {p['why']}"
    css = CSS.get(str(direction) if verdict == BEYOND_HOST else verdict) or values.css(verdict)
    return {"verdict": verdict, "word": word, "css": css, "detail": detail}


def _host_speed_words(pair: Pair) -> str | None:
    """The pair's host speed in one sentence: the later release's host against the earlier
    one's, or why it is not known."""
    hs = pair.get("host_speed")
    if not isinstance(hs, dict):
        return None
    if not hs.get("recorded"):
        return (
            f"{no_speed_words(hs.get('why_not'))}: a change between these releases may be the "
            "host's speed as well as the code's, and is not attributed to the code."
        )
    ratio, low, high = (values.number(hs.get(k)) for k in ("ratio", "low", "high"))
    moved = "moved" if hs.get("moved") else "did not move beyond its noise"
    gpu = hs.get("parts") == "gpu"  # the GPU canary's parts: a GPU server's speed is its GPU's
    compute, copy = ("GPU matmul", "device copy") if gpu else ("compute", "copy bandwidth")
    text = (
        f"{pair['after']}'s host ran the {'GPU ' if gpu else ''}canary at {ratio} times the "
        f"speed of {pair['before']}'s ({compute} {values.number(hs.get('compute'))}, {copy} "
        f"{values.number(hs.get('bandwidth'))}; 95% interval {low} to {high}): the host's "
        f"speed {moved}."
    )
    if hs.get("unknown_why"):
        text += (
            f" The canary cannot tell the host's speed from the code's here "
            f"({hs['unknown_why']}): compare both on one host with `{hs.get('rerun')}`."
        )
    return text


def _fdr_words(pair: Pair) -> str | None:
    fdr = pair.get("fdr")
    if not isinstance(fdr, dict):
        return None
    return (
        f"{fdr.get('method', 'Benjamini-Hochberg')} applied: false discovery rate "
        f"{100 * float(fdr.get('q', 0.05)):g}% over the {fdr.get('tests')} tests of this pair."
    )


def _pair(pair: Pair, metrics: list[str]) -> PairView:
    """One pair of consecutive releases: a row per point, a cell per metric."""
    found = {str(p["metric"]) for p in pair.get("points") or []}
    cols = [m for m in metrics if m in found] + sorted(found - set(metrics))
    cells: dict[tuple[str, LevelValue], dict[str, ChangeCell]] = {}
    for p in pair.get("points") or []:
        cells.setdefault((str(p["server_config"]), p["level"]), {})[str(p["metric"])] = _change(p)
    keys = sorted(cells, key=lambda k: (k[0], values.level_key(k[1])))
    return {
        "before": str(pair["before"]),
        "after": str(pair["after"]),
        "id": f"pair-{pair['before']}-{pair['after']}",
        "comparable": bool(pair.get("comparable")),
        "why_not": _words(pair.get("why_not")),
        "changed": ", ".join(str(c) for c in pair.get("changed") or []) or None,
        "engine": [str(e) for e in pair.get("engine") or []],
        "host": host_words(pair.get("host")),
        "host_speed": _host_speed_words(pair),
        "fdr": _fdr_words(pair),
        "metrics": cols,
        "rows": [
            {
                "server_config": sc,
                "level": values.level(lv),
                "cells": [cells[(sc, lv)].get(m) for m in cols],
            }
            for sc, lv in keys
        ],
        "counts": [
            (
                COUNT_WORDS.get(v, v),
                sum(1 for c in cells.values() for x in c.values() if x["verdict"] == v),
            )
            for v in VERDICTS
        ],
    }


def history_view(
    history: History, figures: dict[str, dict[str, str]], failures: dict[str, list[str]]
) -> HistoryView:
    """The page's context: `figures` gives each metric's figure ({"src", "alt"}),
    `failures` each release tag's verification failures."""
    metrics = [str(m) for m in history["metrics"]]
    return {
        "releases": [_release_row(r, failures) for r in history["releases"]],
        "metrics": [
            {
                "metric": m,
                "id": f"metric-{m}",
                "figure": figures.get(m),
                "table": _metric_table(history, m),
                "changes": _changes(history, m),
            }
            for m in metrics
        ],
        "pairs": [_pair(p, metrics) for p in history["pairs"]],
        "verdicts": [(CELL_WORDS.get(v, v), v, CSS.get(v) or values.css(v)) for v in VERDICTS],
        "change_method": _change_method(history),
    }


def _change_method(history: History) -> str | None:
    """How the change points were found, in words (None for a history without them)."""
    how = history.get("change_point_method")
    if not isinstance(how, dict):
        return None
    return (
        "Change points: where a series changed level, found by a step fit over each run of at "
        f"least {how['min_releases']} comparable consecutive releases (a step must stand "
        f"{math.sqrt(how['penalty']):g} standard errors clear of none, the scatter of the "
        "releases' levels beyond their repeats counted in, and reach the practical threshold; "
        'a release up and back down at the next is one excursion; docs/analysis.md, "Change '
        'points over a history"), never rescaled by the canary, and marked in the figure by '
        "an open triangle pointing the way the series went."
    )
