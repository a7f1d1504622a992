"""The path of an SLO capacity search (search.json) as a figure: the rate measured at each step,
met, failed or undecided, and the final bracket shaded; drawn in servelab's figure style
(servelab.render): same search, same bytes."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

from servelab.analysis.search import SearchResult  # noqa: E402
from servelab.render import figure_style, save_figure  # noqa: E402

SEARCH_FIGURE = "search_path"
# how the steps are drawn by their decision: (marker, color, label)
_DRAWN = {
    "meets": ("o", "C2", "meets the SLO"),
    "fails": ("X", "C3", "fails the SLO"),
    "undecided": ("D", "C1", "undecided (counted as not meeting)"),
}


def search_path(result: SearchResult) -> Figure:
    """Rate (req/s; a log scale when the rates span more than a factor of 10) against step:
    the path as a line, each step marked met (green circle), failed (red cross) or undecided
    after its rounds (orange diamond; only where a step was), a dotted
    line where bracketing ends and bisection begins, the final bracket shaded, the answer in
    the title."""
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    steps = result.path
    orders = [s.order for s in steps]
    rates = [s.rate for s in steps]
    ax.plot(orders, rates, color="0.6", linewidth=1, zorder=2)
    for decision, (marker, color, label) in _DRAWN.items():
        xs = [s.order for s in steps if s.decision.decision == decision]
        ys = [s.rate for s in steps if s.decision.decision == decision]
        if decision == "undecided" and not xs:
            continue  # the legend names what the figure shows
        ax.scatter(xs, ys, s=40, zorder=4, marker=marker, color=color, label=label)
    for s in steps:
        ax.annotate(
            f"{s.rate:g}", (s.order, s.rate), textcoords="offset points", xytext=(5, 4), fontsize=7
        )
    first_bisect = next((s.order for s in steps if s.phase == "bisect"), None)
    if first_bisect is not None:
        ax.axvline(first_bisect - 0.5, color="0.5", linestyle=":", linewidth=1)
    bracket = result.answer.bracket
    if bracket is not None:
        ax.axhspan(bracket[0], bracket[1], color="C0", alpha=0.2, zorder=1, label="final bracket")
    if rates and max(rates) > 10 * min(rates):
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: f"{y:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_xticks(orders)
    ax.set_xlabel("step (left of the dotted line: bracketing; right: bisection)")
    ax.set_ylabel("request rate (req/s)")
    share = f"{result.spec.target * 100:g}%"
    answer = result.answer.text().split(" (", 1)[0]  # without the reason, which can be long
    ax.set_title(f"SLO capacity ({share} of requests within the SLO): {answer}", fontsize=9)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return fig


def render_search(result: SearchResult, out_dir: Path, name: str = SEARCH_FIGURE) -> list[Path]:
    """The search path figure as <out_dir>/<name>.svg and .png (servelab.render.save_figure)."""
    with figure_style():
        return save_figure(search_path(result), out_dir, name)
