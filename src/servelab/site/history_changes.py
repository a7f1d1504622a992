"""The change points of a release history's series (analysis.changepoints), and their words.

A series (one metric at one point across the releases that measured it) is cut where two
consecutive releases are not comparable (another host class, another setup, a release not
analysed again: the history's pairs say which): a step across such a cut is no change of the
code's, and the figure already breaks its lines there. Each run of comparable releases with at
least `changepoints.MIN_RELEASES` releases gets a step fit (never rescaled by the canary); each
change point is set against the host ratio between the releases either side by the gate of
analysis.hostspeed, an UNKNOWN naming `servelab rerun` with those two releases' folders; a
shorter run has "too few releases".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from servelab.analysis.changepoints import (
    CHANGED,
    EXCURSION,
    METHOD,
    MIN_RELEASES,
    NO_CHANGE,
    PENALTY,
    SD_FLOOR,
    TOO_FEW,
    Releases,
    change_points,
)
from servelab.analysis.hostspeed import AS_HOST, BEYOND_HOST, UNKNOWN, HostSpeed
from servelab.site.history_records import (
    ChangeMethod,
    ChangePointRow,
    ChangeRun,
    Series,
    SeriesPoint,
)


@dataclass(frozen=True)
class Known:
    """What the history knows of an analysed release: its host speed (None: not recorded),
    its folder as a rerun names it, its practical threshold and its equivalence margin."""

    host: HostSpeed | None
    path: str
    threshold_pct: float
    margin_pct: float


def method() -> ChangeMethod:
    """How the history finds change points, as its record states it."""
    return {
        "method": METHOD,
        "penalty": PENALTY,
        "sd_floor": SD_FLOOR,
        "min_releases": MIN_RELEASES,
    }


def runs(
    series: Series, tags: Sequence[str], comparable: Sequence[bool]
) -> list[list[SeriesPoint]]:
    """The series' points with a valid repeat, cut into runs of comparable releases
    (`comparable[i]`: releases i and i + 1 of `tags` are comparable)."""
    at = {t: i for i, t in enumerate(tags)}
    out: list[list[SeriesPoint]] = []
    last: int | None = None
    for p in series["points"]:
        if not p["repeats"]:
            continue
        i = at[p["tag"]]
        if last is None or not all(comparable[last:i]):
            out.append([])
        out[-1].append(p)
        last = i
    return out


def series_changes(
    series: Series,
    tags: Sequence[str],
    comparable: Sequence[bool],
    known: Mapping[str, Known],
) -> list[ChangeRun]:
    """Each run of comparable releases of `series` with its change points: `known` gives each
    analysed release's host speed, folder, threshold and margin (a run is judged with its
    first release's threshold and margin)."""
    out: list[ChangeRun] = []
    for run in runs(series, tags, comparable):
        first = known[run[0]["tag"]]
        releases = Releases(
            [known[p["tag"]].host for p in run],
            [known[p["tag"]].path for p in run],
            first.margin_pct,
        )
        found = change_points(
            series["metric"], [p["repeats"] for p in run], releases, first.threshold_pct
        )
        points: list[ChangePointRow] = [
            {
                "before": run[c.at - 1]["tag"],
                "after": run[c.at]["tag"],
                "kind": c.kind,
                "change_pct": c.change_pct,
                "vs_host_pct": c.vs_host_pct,
                "answer": c.answer,
                "direction": c.direction,
                "why": c.why,
            }
            for c in found.points
        ]
        out.append(
            {
                "releases": [p["tag"] for p in run],
                "answer": found.answer,
                "between_sd": found.between_sd,
                "change_points": points,
            }
        )
    return out


NO_VALUES = "no values"  # a series without a release that has a value of it


def series_answer(changes: Sequence[ChangeRun]) -> str:
    """A series' answer over its runs: changed when any run changed, else no change point
    when any run was judged, else why none was (too few releases; no values, without a run:
    every point invalid, or a percentile too few requests report)."""
    if not changes:
        return NO_VALUES
    answers = [r["answer"] for r in changes]
    for answer in (CHANGED, NO_CHANGE):
        if answer in answers:
            return answer
    return next((a for a in answers if a != TOO_FEW), TOO_FEW)


def point_words(c: ChangePointRow) -> str:
    """A change point in words: between which releases (an excursion: at which), by how much,
    and whose it is."""
    if c.get("kind") == EXCURSION:
        text = f"excursion at {c['after']} {c['change_pct']:+.1f}% (back at the next release)"
    else:
        text = f"{c['before']} to {c['after']} {c['change_pct']:+.1f}%"
    vs = c.get("vs_host_pct")
    against = f"{vs:+.1f}% against the host" if vs is not None else ""
    if c["answer"] == BEYOND_HOST:
        return f"{text} ({c['direction']}, beyond the host: {against})"
    if c["answer"] == AS_HOST:
        return f"{text} (as the host's speed: {against})"
    if c["answer"] == UNKNOWN:
        return f"{text} (unknown: the canary cannot tell; {c.get('why')})"
    return f"{text} ({c['answer']})"


def run_words(changes: Sequence[ChangeRun]) -> str:
    """A series' change points in words, per judged run ("v3 to v6: no change point"), or why
    no run could be judged."""
    judged = [r for r in changes if r["answer"] != TOO_FEW]
    if not changes:
        return f"{NO_VALUES} (every point invalid, or too few requests to report it)"
    if not judged:
        return f"{TOO_FEW} (fewer than {MIN_RELEASES} comparable)"
    parts = []
    for r in judged:
        span = f"{r['releases'][0]} to {r['releases'][-1]}"
        found = "; ".join(point_words(c) for c in r["change_points"]) or r["answer"]
        parts.append(f"{span}: {found}")
    return "; ".join(parts)
