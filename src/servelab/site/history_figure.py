"""The figures of an experiment's release history (`site.history.release_history`'s record):
`history_figure` one metric across the releases as an SVG, with where consecutive releases are
not comparable and where a series changed (its change points), and `history_figure_alt` its
text alternative. Same history, same bytes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from servelab.analysis.changepoints import NO_CHANGE
from servelab.errors import ServelabError
from servelab.render import num
from servelab.site.history_records import History, Series, SeriesPoint

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def _metric_series(history: History, metric: str) -> list[Series]:
    if metric not in history.get("metrics", []):
        raise ServelabError(
            f"metric {metric!r}: not in the history of {history.get('experiment')!r}; use one of "
            + ", ".join(history.get("metrics", []))
        )
    return [s for s in history["series"] if s["metric"] == metric]


def _level_text(s: Series) -> str:
    return f"c={s['level']:g}" if s["axis"] == "concurrency" else f"rate={s['level']:g}"


def _breaks(history: History) -> list[tuple[int, str]]:
    """Where consecutive releases are not comparable: (index of the later one, a short
    reason) for the figure's separators and its text."""
    out = []
    for i, p in enumerate(history["pairs"], 1):
        if p["comparable"]:
            continue
        why = str(p["why_not"] or "")
        short = (
            "not analysed again"
            if "cannot be analysed" in why
            else "host differs"
            if why.startswith("the hosts differ")
            else "setup differs"
        )
        out.append((i, short))
    return out


def history_figure(history: History, metric: str) -> bytes:
    """`metric` across the releases as an SVG: x = the releases in order; one panel per server
    config, one line per level, each release's mean with its 95% CI and its repeats as dots
    (analysis.figures.means_with_ci); where consecutive releases are not comparable, a dashed
    separator with the reason and the lines broken; where a series changed (its change points),
    an open triangle between the two releases, pointing the way it went. Same history, same
    bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from servelab.render import MEAN_CI_CAPTION, figure_bytes, figure_style

    series = _metric_series(history, metric)
    tags = [r["tag"] for r in history["releases"]]
    configs = sorted({s["server_config"] for s in series}) or ["(no analysed release)"]
    breaks = _breaks(history)
    unit = _unit(metric)
    with figure_style():
        size = (max(6.4, 0.8 * len(tags)) + 1.0, 2.6 * len(configs) + 0.6)
        fig, grid = plt.subplots(len(configs), 1, figsize=size, squeeze=False)
        axes = list(grid[:, 0])
        for ax, sc in zip(axes, configs, strict=True):
            mine = [s for s in series if s["server_config"] == sc]
            _history_panel(ax, mine, tags, [i for i, _ in breaks])
            for i, why in breaks:
                ax.axvline(i - 0.5, color="0.3", linestyle="--", linewidth=1)
                ax.annotate(
                    why,
                    (i - 0.5, 1.0),
                    xycoords=("data", "axes fraction"),
                    xytext=(-3, -3),
                    textcoords="offset points",
                    rotation=90,
                    ha="right",
                    va="top",
                    fontsize=7,
                    color="0.3",
                )
            ax.set_title(sc, fontsize=9)
            ax.set_ylabel(f"{metric} ({unit})" if unit else metric)
            ax.set_xticks(range(len(tags)))
            ax.set_xticklabels(tags)
        axes[-1].set_xlabel("release")
        fig.suptitle(f"{history['experiment']}: {metric} per release ({MEAN_CI_CAPTION})")
        fig.tight_layout()
        return figure_bytes(fig, "svg")


def _history_panel(ax: Axes, series: list[Series], tags: list[str], breaks: list[int]) -> None:
    """One server config's levels across the releases, each level a little apart from the
    next so that their dots do not hide each other, and each line broken before every release
    in `breaks` (not comparable with the one before it)."""
    from servelab.analysis.figures import means_with_ci

    at = {t: i for i, t in enumerate(tags)}
    width = 0.5 / max(1, len(series))
    means, marked = [], False
    for k, s in enumerate(series):
        dx = (k - (len(series) - 1) / 2) * width
        runs: dict[int, list[SeriesPoint]] = {}
        for p in s["points"]:
            runs.setdefault(sum(1 for b in breaks if b <= at[p["tag"]]), []).append(p)
        label: str | None = _level_text(s)  # on the first run that draws a mean
        for _, pts in sorted(runs.items()):
            drawn = means_with_ci(
                ax,
                [at[p["tag"]] + dx for p in pts],
                [dict(enumerate(p["repeats"])) for p in pts],
                label=label,
                color=f"C{k % 10}",
            )
            label = label if drawn is None else None
        marked = _change_marks(ax, s, at, dx, f"C{k % 10}") or marked
        means += [p["mean"] for p in s["points"] if p["mean"] is not None and p["mean"] > 0]
    if means and max(means) > 20 * min(means):
        ax.set_yscale("log")
    ax.set_xlim(-0.5, len(tags) - 0.5)
    if marked:  # the triangles' legend entry
        ax.plot(
            [], [], marker="v", markerfacecolor="none", color="0.3", ls="none", label="change point"
        )
    if series:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.text(0.5, 0.5, "no release analysed", ha="center", transform=ax.transAxes)


def _change_marks(ax: Axes, s: Series, at: dict[str, int], dx: float, color: str) -> bool:
    """A series' change points: an open triangle between the two releases, pointing the way
    the level went, halfway (geometrically) between their means; whether it drew one."""
    means = {p["tag"]: p["mean"] for p in s["points"]}
    drawn = False
    for run in s.get("change_points") or []:
        for c in run["change_points"]:
            before, after = means.get(c["before"]), means.get(c["after"])
            if not before or not after or before <= 0 or after <= 0:
                continue
            x = (at[c["before"]] + at[c["after"]]) / 2 + dx
            ax.plot(
                [x],
                [(before * after) ** 0.5],
                marker="^" if c["change_pct"] > 0 else "v",
                markersize=9,
                markerfacecolor="none",
                markeredgewidth=1.5,
                color=color,
                linestyle="none",
                zorder=5,
            )
            drawn = True
    return drawn


UNITS = {
    "output_throughput": "tok/s",
    "total_token_throughput": "tok/s",
    "request_throughput": "req/s",
}


def _unit(metric: str) -> str:
    return "ms" if metric.endswith("_ms") else UNITS.get(metric, "")


def history_figure_alt(history: History, metric: str) -> str:
    """The text alternative of `history_figure`: what it shows, the range of the means, where
    consecutive releases are not comparable, and where a series changed."""
    series = _metric_series(history, metric)
    tags = [r["tag"] for r in history["releases"]]
    means = [p["mean"] for s in series for p in s["points"] if p["mean"] is not None]
    configs = sorted({s["server_config"] for s in series})
    span = f"{tags[0]} to {tags[-1]}" if tags else "no release"
    text = (
        f"{metric} of {history['experiment']} per release ({span}), one panel per server config "
        f"({', '.join(configs) or 'none'}), one line per level, each mean with its 95% CI and "
        "its repeats as dots, the lines broken where releases are not comparable"
    )
    unit = _unit(metric)
    if means:
        lo, hi = min(means), max(means)
        text += f"; means from {num(lo, ',.3g')} to {num(hi, ',.3g')}{' ' + unit if unit else ''}"
    else:  # a percentile its points hold too few requests to report is left out of the history
        text += "; no mean to draw (every point invalid, or too few requests to report it)"
    text += "."
    breaks = _breaks(history)
    if breaks:
        text += (
            " Not comparable: "
            + "; ".join(f"{tags[i - 1]} to {tags[i]} ({why})" for i, why in breaks)
            + "."
        )
    return text + _changes_alt(series)


def _changes_alt(series: list[Series]) -> str:
    """The figure's change points in words (its open triangles), or that there is none."""
    found = [
        f"{s['server_config']} {_level_text(s)} {c['before']} to {c['after']} "
        f"{c['change_pct']:+.1f}%"
        for s in series
        for run in s.get("change_points") or []
        for c in run["change_points"]
    ]
    judged = any(r["answer"] == NO_CHANGE for s in series for r in s.get("change_points") or [])
    if not found:
        return " No change point in any line." if judged else ""
    return " Change points (open triangles): " + "; ".join(found) + "."
