"""The figure "utilization vs tokens/s" (paths.TELEMETRY_FIGURE), for the analysis and for
`servelab telemetry summarize`: same rows, same bytes (servelab.render's figure saver)."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import cast

from servelab.render import figure_style, save_figure
from servelab.store.paths import TELEMETRY_FIGURE
from servelab.telemetry.columns import UtilizationRow

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
# servelab's figure style (render.FIGURE_RC) with the settings this figure has always been
# drawn with: text as paths, matplotlib's font size and no default grid (it draws its own).
# Released analyses hold its bytes (analysis/figures/utilization_vs_throughput.*).
STYLE = {"svg.fonttype": "path", "font.size": 10.0, "axes.grid": False, "grid.alpha": 1.0}


def _value(v: float | None) -> float:
    """A plotted value of a row that has it (`have`: utilization and throughput known; a
    measured point's concurrency)."""
    return float(cast(float, v))


def plot_utilization_vs_throughput(
    rows: Sequence[UtilizationRow], out_dir: Path, title: str = "utilization vs tokens/s"
) -> list[Path]:
    """Write the figure into `out_dir` (.svg and .png): one dot per point, one colour per
    server config, each concurrency labelled at the mean of its repeats, the best throughput
    dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    have = [r for r in rows if r.get("utilization_pct") is not None and r.get("output_throughput")]
    source = "gpu" if any(r["utilization_source"] == "gpu" for r in have) else "cpu"
    cpus = next((r.get("host_cpus") for r in have if r.get("host_cpus")), None)
    xlabel = (
        "GPU utilization, % (NVML, mean over the point)"
        if source == "gpu"
        else "server CPU, % of all the host's cores"
        + (f" ({cpus})" if cpus else "")
        + " (process tree, mean over the point)"
    )
    with figure_style(**STYLE):
        fig, ax = plt.subplots(figsize=(7.0, 4.5), dpi=100)
        configs = sorted({str(r["server_config"]) for r in have})
        colours = plt.get_cmap("tab10")
        for i, sc in enumerate(configs):
            mine = [r for r in have if str(r["server_config"]) == sc]
            ax.scatter(
                [_value(r["utilization_pct"]) for r in mine],
                [_value(r["output_throughput"]) for r in mine],
                label=sc,
                marker=MARKERS[i % len(MARKERS)],
                color=colours(i % 10),
                alpha=0.8,
                s=36,
            )
            by_conc: dict[int, list[UtilizationRow]] = defaultdict(list)
            for r in mine:
                by_conc[int(cast(float, r["concurrency"]))].append(r)
            for conc, rs in sorted(by_conc.items()):
                x = statistics.fmean(_value(r["utilization_pct"]) for r in rs)
                y = statistics.fmean(_value(r["output_throughput"]) for r in rs)
                ax.annotate(
                    f"c{conc}",
                    (x, y),
                    textcoords="offset points",
                    xytext=(5, 4),
                    fontsize=8,
                    color=colours(i % 10),
                )
        if have:
            best = max(_value(r["output_throughput"]) for r in have)
            ax.axhline(best, color="0.5", linestyle="--", linewidth=1)
            ax.annotate(
                f"best {best:,.0f} tok/s",
                (0, best),
                xycoords=("axes fraction", "data"),
                textcoords="offset points",
                xytext=(4, -11),
                fontsize=8,
                color="0.4",
            )
            ax.legend(title="server config", fontsize=8, title_fontsize=8, loc="center left")
        else:
            ax.text(0.5, 0.5, "no point with telemetry", ha="center", transform=ax.transAxes)
        ax.set_xlim(0, max([100.0, *(_value(r["utilization_pct"]) * 1.05 for r in have)]))
        ax.set_ylim(bottom=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("output throughput, tok/s")
        ax.set_title(title)
        ax.grid(True, color="0.9")
        fig.tight_layout()
        return save_figure(fig, out_dir, TELEMETRY_FIGURE)
