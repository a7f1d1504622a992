"""An experiment's history page: every metric of every point across its releases (a figure
and a table per metric) and, between each pair of consecutive releases, a change verdict per
point and metric, with the host differences named and the pairs that cannot be compared
saying why. It renders the record `servelab.site.history.release_history` returns."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from servelab.site import values

VERDICTS = ("improved", "regressed", "unchanged", "invalid", "not comparable")
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
    ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class HistoryApi:
    """The release history's record and figures (servelab.site.history)."""

    release_history: ReleaseHistory
    history_figure: Callable[[dict[str, Any], str], bytes]
    history_figure_alt: Callable[[dict[str, Any], str], str]


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


def _release_row(r: dict[str, Any], failures: dict[str, list[str]]) -> dict[str, Any]:
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


def _ci(p: dict[str, Any]) -> str:
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


def _metric_table(history: dict[str, Any], metric: str) -> dict[str, Any]:
    """The series of `metric`: a row per server configuration and level, a column per
    release."""
    tags = [str(r["tag"]) for r in history["releases"]]
    rows = []
    series = [s for s in history["series"] if s["metric"] == metric]
    for s in sorted(series, key=lambda s: (str(s["server_config"]), values.level_key(s["level"]))):
        at = {str(p["tag"]): p for p in s["points"]}
        rows.append(
            {
                "server_config": str(s["server_config"]),
                "level": values.level(s["level"]),
                "cells": [_ci(at[t]) if t in at else "-" for t in tags],
            }
        )
    return {"tags": tags, "rows": rows}


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


def _change(p: dict[str, Any]) -> dict[str, str]:
    verdict = str(p.get("verdict"))
    change = p.get("change_pct")
    pv = p.get("p_value")
    detail = ("-" if change is None else f"{change:+.2f}%") + (
        f", p {values.value_text(pv)}" if pv is not None else ""
    )
    return {"verdict": verdict, "css": values.css(verdict), "detail": detail}


def _pair(pair: dict[str, Any], metrics: list[str]) -> dict[str, Any]:
    """One pair of consecutive releases: a row per point, a cell per metric."""
    found = {str(p["metric"]) for p in pair.get("points") or []}
    cols = [m for m in metrics if m in found] + sorted(found - set(metrics))
    cells: dict[tuple[str, Any], dict[str, dict[str, str]]] = {}
    for p in pair.get("points") or []:
        cells.setdefault((str(p["server_config"]), p["level"]), {})[str(p["metric"])] = _change(p)
    keys = sorted(cells, key=lambda k: (k[0], values.level_key(k[1])))
    return {
        "before": str(pair["before"]),
        "after": str(pair["after"]),
        "id": f"pair-{pair['before']}-{pair['after']}",
        "comparable": bool(pair.get("comparable")),
        "why_not": _words(pair.get("why_not")),
        "host": host_words(pair.get("host")),
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
            (v, sum(1 for c in cells.values() for x in c.values() if x["verdict"] == v))
            for v in VERDICTS
        ],
    }


def history_view(
    history: dict[str, Any], figures: dict[str, dict[str, str]], failures: dict[str, list[str]]
) -> dict[str, Any]:
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
            }
            for m in metrics
        ],
        "pairs": [_pair(p, metrics) for p in history["pairs"]],
        "verdicts": [(v, values.css(v)) for v in VERDICTS],
    }
