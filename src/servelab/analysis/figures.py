"""The analysis figures, drawn in servelab's figure style (servelab.render): same data, same
bytes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from servelab.analysis.groups import Groups, Level  # noqa: E402
from servelab.analysis.stats import describe, mean_rel_diff_pct  # noqa: E402
from servelab.paths import FIGURES  # noqa: E402
from servelab.render import figure_style, save_figure  # noqa: E402


def _levels_axis(ax: Any, levels: list[Level]) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels)
    ax.set_xticklabels([f"{c:g}" if isinstance(c, float) else str(c) for c in levels])
    ax.minorticks_off()


def _axis_label(g: Groups) -> str:
    """The x axis of a sweep: concurrency, or request rate."""
    return "request rate (req/s)" if g.open_loop else "concurrency"


def throughput_vs_concurrency(g: Groups) -> Figure:
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    levels: set[Level] = set()
    for sc in g.configs:
        lv = g.levels(sc)
        levels |= set(lv)
        means: list[float] = []
        lo: list[float] = []
        hi: list[float] = []
        for c in lv:
            d = describe(list(g.values(sc, c, "output_throughput").values()))
            means.append(d.mean if d.mean is not None else float("nan"))
            lo.append((d.mean - d.ci95_low) if d.ci95_low is not None and d.mean is not None else 0)
            hi.append(
                (d.ci95_high - d.mean) if d.ci95_high is not None and d.mean is not None else 0
            )
            reps = g.values(sc, c, "output_throughput")
            ax.scatter([c] * len(reps), list(reps.values()), s=12, alpha=0.5, color="0.4", zorder=3)
        ax.errorbar(lv, means, yerr=[lo, hi], marker="o", capsize=3, label=sc, zorder=4)
    _levels_axis(ax, sorted(levels))
    ax.set_xlabel(_axis_label(g))
    ax.set_ylabel("output throughput (tok/s)")
    word = "request rate" if g.open_loop else "concurrency"
    ax.set_title(f"Throughput vs {word} (mean, 95% CI; grey: each repeat)")
    ax.legend()
    fig.tight_layout()
    return fig


def latency_throughput(g: Groups, dominated: list[dict[str, Any]]) -> Figure:
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 4.0))
    dom = {(d["server_config"], d[g.axis]) for d in dominated}
    for ax, metric, label in (
        (axes[0], "mean_ttft_ms", "mean TTFT (ms)"),
        (axes[1], "mean_tpot_ms", "mean TPOT (ms)"),
    ):
        for sc in g.configs:
            xs, ys, cs = [], [], []
            for c in g.levels(sc):
                x, y = g.mean(sc, c, "output_throughput"), g.mean(sc, c, metric)
                if x is None or y is None:
                    continue
                xs.append(x)
                ys.append(y)
                cs.append(c)
            line = ax.plot(xs, ys, marker="o", label=sc)[0]
            for x, y, c in zip(xs, ys, cs, strict=True):
                ax.annotate(f"{c:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
                if (sc, c) in dom:
                    ax.scatter([x], [y], marker="x", s=80, color=line.get_color(), zorder=5)
        ax.set_xlabel("output throughput (tok/s)")
        ax.set_ylabel(label)
    axes[0].set_title("Latency vs throughput (x: dominated point)")
    axes[0].legend()
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
    ax.set_yscale("log")
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
        ax.scatter([i] * len(rel), rel, s=14, color="0.3", zorder=3)
        mean = mean_rel_diff_pct(va, vb)
        if mean is not None:
            ax.hlines(mean, i - 0.3, i + 0.3, color="C3", zorder=4)
    ax.axhline(0, color="0.5", linewidth=0.8)
    ax.set_xticks(range(len(pairs)))
    ax.set_xticklabels(
        [f"{sc}\n{a:g} vs {b:g}" for sc, a, b in pairs], fontsize=7, rotation=45, ha="right"
    )
    ax.set_ylabel("throughput a / b - 1 (%)")
    ax.set_title("Paired differences per repeat (dots) and their mean (bar)")
    fig.tight_layout()
    return fig


def configs_side_by_side(g: Groups) -> Figure:
    levels = sorted({c for sc in g.configs for c in g.levels(sc)})
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 4.0))
    width = 0.8 / max(1, len(g.configs))
    for j, sc in enumerate(g.configs):
        xs = [i + (j - (len(g.configs) - 1) / 2) * width for i in range(len(levels))]
        for ax, metric in ((axes[0], "output_throughput"), (axes[1], "mean_ttft_ms")):
            ax.bar(xs, [g.mean(sc, c, metric) or 0.0 for c in levels], width, label=sc)
    for ax, label in ((axes[0], "output throughput (tok/s)"), (axes[1], "mean TTFT (ms)")):
        ax.set_xticks(range(len(levels)))
        ax.set_xticklabels([f"{c:g}" for c in levels])
        ax.set_xlabel(_axis_label(g))
        ax.set_ylabel(label)
    axes[0].set_title("Server configurations side by side")
    axes[0].legend()
    fig.tight_layout()
    return fig


def render_all(g: Groups, dominated: list[dict[str, Any]], out_dir: Path) -> list[Path]:
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
