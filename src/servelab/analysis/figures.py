"""The analysis figures, drawn in servelab's figure style (servelab.render): same data, same
bytes. Every figure of means draws it one way (`means_with_ci`): the mean with its 95% CI as an
error bar and each repeat it is taken over as a grey dot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.container import ErrorbarContainer  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from servelab.analysis.groups import Groups  # noqa: E402
from servelab.analysis.knee import DominanceRow  # noqa: E402
from servelab.analysis.stats import describe  # noqa: E402
from servelab.design.level import LevelValue  # noqa: E402
from servelab.render import (  # noqa: E402
    MEAN_CI_CAPTION,
    MEAN_CI_STYLE,
    REPEAT_DOT_STYLE,
    figure_style,
    save_figure,
)
from servelab.store.paths import FIGURES  # noqa: E402

# A point's valid repeats: repeat -> value (Groups.values).
Repeats = Mapping[int, float]


def mean_ci(values: Sequence[float]) -> tuple[float, float, float] | None:
    """The mean of `values` and its 95% CI as distances below and above it (0 and 0 for one
    value); None without values."""
    d = describe(values)
    if d.mean is None:
        return None
    if d.ci95_low is None or d.ci95_high is None:
        return d.mean, 0.0, 0.0
    return d.mean, d.mean - d.ci95_low, d.ci95_high - d.mean


@dataclass
class _Marks:
    """What one call of `means_with_ci` draws: the means, their CIs (below, above) in y and,
    for a scatter of two means, in x, and the repeats' dots."""

    x: list[float]
    y: list[float]
    yerr: list[list[float]]
    xerr: list[list[float]] | None
    dots: list[tuple[float, float]]


def _draw(
    # Any: the styles (servelab.render) are keyword dicts matplotlib's stubs cannot check
    ax: Any,
    marks: _Marks,
    label: str | None,
    color: str | None,
    connect: bool,
) -> ErrorbarContainer | None:
    if marks.dots:
        ax.scatter([d[0] for d in marks.dots], [d[1] for d in marks.dots], **REPEAT_DOT_STYLE)
    if not marks.x:
        return None
    bars: ErrorbarContainer = ax.errorbar(
        marks.x,
        marks.y,
        yerr=marks.yerr,
        xerr=marks.xerr,
        linestyle="-" if connect else "none",
        label=label,
        color=color,
        **MEAN_CI_STYLE,
    )
    return bars


def means_with_ci(
    ax: Axes,
    xs: Sequence[float],
    repeats: Sequence[Repeats],
    label: str | None = None,
    color: str | None = None,
    connect: bool = True,
) -> ErrorbarContainer | None:
    """At each x, the mean of its repeats (`repeats[i]`: repeat -> value) with the mean's 95%
    CI as an error bar, and each repeat as a grey dot; an x without repeats is left out.
    `connect`: a line through the means (a sweep), else markers alone (categories). Returns
    the error bars (None when no x has a repeat)."""
    marks = _Marks([], [], [[], []], None, [])
    for x, reps in zip(xs, repeats, strict=True):
        ci = mean_ci(list(reps.values()))
        if ci is None:
            continue
        marks.x.append(float(x))
        marks.y.append(ci[0])
        marks.yerr[0].append(ci[1])
        marks.yerr[1].append(ci[2])
        marks.dots += [(float(x), v) for v in reps.values()]
    return _draw(ax, marks, label, color, connect)


def means_with_ci_2d(
    ax: Axes,
    x_repeats: Sequence[Repeats],
    y_repeats: Sequence[Repeats],
    label: str | None = None,
    color: str | None = None,
) -> ErrorbarContainer | None:
    """Points of two means (a latency against the throughput): x and y each the mean of its
    repeats with its 95% CI, the points joined in order; each repeat that has both values a
    grey dot at its own (x, y). A point without x or y repeats is left out."""
    marks = _Marks([], [], [[], []], [[], []], [])
    for xr, yr in zip(x_repeats, y_repeats, strict=True):
        cx, cy = mean_ci(list(xr.values())), mean_ci(list(yr.values()))
        if cx is None or cy is None:
            continue
        marks.x.append(cx[0])
        marks.y.append(cy[0])
        assert marks.xerr is not None
        marks.xerr[0].append(cx[1])
        marks.xerr[1].append(cx[2])
        marks.yerr[0].append(cy[1])
        marks.yerr[1].append(cy[2])
        marks.dots += [(xr[r], yr[r]) for r in sorted(set(xr) & set(yr))]
    return _draw(ax, marks, label, color, True)


def _legend(ax: Axes) -> None:
    """The axes' legend, when something on it has a label: a figure whose every point lacks a
    valid repeat draws no mean, and gets no empty legend box."""
    if ax.get_legend_handles_labels()[0]:
        ax.legend()


def _levels_axis(ax: Axes, levels: list[LevelValue]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels)
    ax.set_xticklabels([f"{c:g}" if isinstance(c, float) else str(c) for c in levels])
    ax.minorticks_off()


def _axis_label(g: Groups) -> str:
    """The x axis of a sweep: concurrency, or request rate."""
    return "request rate (req/s)" if g.open_loop else "concurrency"


def throughput_vs_concurrency(g: Groups) -> Figure:
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    levels: set[LevelValue] = set()
    for sc in g.configs:
        lv = g.levels(sc)
        levels |= set(lv)
        means_with_ci(ax, lv, [g.values(sc, c, "output_throughput") for c in lv], label=sc)
    _levels_axis(ax, sorted(levels))
    ax.set_xlabel(_axis_label(g))
    ax.set_ylabel("output throughput (tok/s)")
    word = "request rate" if g.open_loop else "concurrency"
    ax.set_title(f"Throughput vs {word} ({MEAN_CI_CAPTION})")
    _legend(ax)
    fig.tight_layout()
    return fig


def latency_throughput(g: Groups, dominated: list[DominanceRow]) -> Figure:
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 4.0))
    dom = {(d["server_config"], d[g.axis]) for d in dominated}
    for ax, metric, label in (
        (axes[0], "mean_ttft_ms", "mean TTFT (ms)"),
        (axes[1], "mean_tpot_ms", "mean TPOT (ms)"),
    ):
        for sc in g.configs:
            lv = g.levels(sc)
            bars = means_with_ci_2d(
                ax,
                [g.values(sc, c, "output_throughput") for c in lv],
                [g.values(sc, c, metric) for c in lv],
                label=sc,
            )
            if bars is None:
                continue
            color = bars.lines[0].get_color() if bars.lines[0] is not None else None
            for c in lv:
                x, y = g.mean(sc, c, "output_throughput"), g.mean(sc, c, metric)
                if x is None or y is None:
                    continue
                ax.annotate(f"{c:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
                if (sc, c) in dom:
                    ax.scatter([x], [y], marker="x", s=80, color=color, zorder=5)
        ax.set_xlabel("output throughput (tok/s)")
        ax.set_ylabel(label)
    fig.suptitle(f"Latency vs throughput ({MEAN_CI_CAPTION}; x: dominated point)")
    _legend(axes[0])
    fig.tight_layout()
    return fig


def ttft_distribution(g: Groups) -> Figure:
    keys = [(sc, c) for sc in g.configs for c in g.levels(sc)]
    fig, ax = plt.subplots(figsize=(max(6.4, 0.6 * len(keys)), 4.0))
    data = [
        [t for p in g.valid_points(*k, "mean_ttft_ms") for t in p.ttfts_ms] or [0.0] for k in keys
    ]
    ax.boxplot(data, showfliers=True, flierprops={"markersize": 2})
    ax.set_xticks(range(1, len(keys) + 1))
    ax.set_xticklabels(
        [f"{sc}\n{g.level_name(c)}" for sc, c in keys], fontsize=7, rotation=45, ha="right"
    )
    if any(t > 0 for d in data for t in d):
        ax.set_yscale("log")
    else:  # no valid repeat anywhere: nothing a log axis could show (matplotlib warns)
        ax.text(0.5, 0.5, "no valid repeat", transform=ax.transAxes, ha="center", va="center")
    ax.set_ylabel("TTFT (ms)")
    ax.set_title("TTFT distribution per point (valid repeats)")
    fig.tight_layout()
    return fig


def paired_differences(g: Groups) -> Figure:
    pairs = [
        (sc, a, b) for sc in g.configs for a, b in zip(g.levels(sc), g.levels(sc)[1:], strict=False)
    ]
    fig, ax = plt.subplots(figsize=(max(6.4, 0.7 * len(pairs)), 4.0))
    for i, (sc, a, b) in enumerate(pairs):
        va, vb = g.pair(sc, a, sc, b, "output_throughput")
        rel = [100.0 * (x / y - 1) for x, y in zip(va, vb, strict=True) if y]
        means_with_ci(ax, [i], [dict(enumerate(rel))], color="C3", connect=False)
    ax.axhline(0, color="0.5", linewidth=0.8)
    ax.set_xticks(range(len(pairs)))
    ax.set_xticklabels(
        [f"{sc}\n{a:g} vs {b:g}" for sc, a, b in pairs], fontsize=7, rotation=45, ha="right"
    )
    ax.set_ylabel("throughput a / b - 1 (%)")
    ax.set_title(f"Paired differences per adjacent pair ({MEAN_CI_CAPTION})")
    fig.tight_layout()
    return fig


def configs_side_by_side(g: Groups) -> Figure:
    levels = sorted({c for sc in g.configs for c in g.levels(sc)})
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 4.0))
    width = 0.8 / max(1, len(g.configs))
    for j, sc in enumerate(g.configs):
        xs = [i + (j - (len(g.configs) - 1) / 2) * width for i in range(len(levels))]
        for ax, metric in ((axes[0], "output_throughput"), (axes[1], "mean_ttft_ms")):
            reps = [g.values(sc, c, metric) for c in levels]
            means_with_ci(ax, xs, reps, label=sc, color=f"C{j % 10}", connect=False)
    for ax, label in ((axes[0], "output throughput (tok/s)"), (axes[1], "mean TTFT (ms)")):
        ax.set_xticks(range(len(levels)))
        ax.set_xticklabels([f"{c:g}" for c in levels])
        ax.set_xlabel(_axis_label(g))
        ax.set_ylabel(label)
    fig.suptitle(f"Server configurations side by side ({MEAN_CI_CAPTION})")
    _legend(axes[0])
    fig.tight_layout()
    return fig


def render_all(g: Groups, dominated: list[DominanceRow], out_dir: Path) -> list[Path]:
    """The analysis figures (paths.FIGURES), .svg and .png each."""
    draw = {
        "throughput_vs_concurrency": lambda: throughput_vs_concurrency(g),
        "latency_throughput": lambda: latency_throughput(g, dominated),
        "ttft_distribution": lambda: ttft_distribution(g),
        "paired_differences": lambda: paired_differences(g),
        "configs_side_by_side": lambda: configs_side_by_side(g),
    }
    with figure_style():
        return [path for name in FIGURES for path in save_figure(draw[name](), out_dir, name)]
