"""Numbers and words as the site shows them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from servelab.render import num
from servelab.store.paths import FIGURES, TELEMETRY_FIGURE

# What each analysis figure shows (its text alternative); the numbers are in the page's tables.
FIGURE_TEXT = {
    "throughput_vs_concurrency": "Output throughput (tok/s) against concurrency or request "
    "rate for each server configuration: the mean with its 95% confidence interval, and each "
    "repeat as a grey dot",
    "latency_throughput": "Mean TTFT and mean TPOT against output throughput for each server "
    "configuration, each point labelled with its concurrency; a cross marks a dominated point",
    "ttft_distribution": "Box plots of the time to first token of every request, per server "
    "configuration and concurrency (valid repeats), on a log scale",
    "paired_differences": "Relative throughput difference between adjacent concurrency levels "
    "of each server configuration, per repeat (dots) and their mean (bar)",
    "configs_side_by_side": "Bars of output throughput and of mean TTFT at each concurrency, "
    "the server configurations side by side",
    TELEMETRY_FIGURE: "Utilization (GPU, or the server's CPU share of the host) against output "
    "throughput for each point",
}
FIGURE_ORDER = (*FIGURES, TELEMETRY_FIGURE)


def figure_text(name: str) -> str:
    """The text alternative of the analysis figure `name` (its file name without .svg)."""
    return FIGURE_TEXT.get(name, f"Figure {name.replace('_', ' ')}")


def figure_key(name: str) -> tuple[int, str]:
    """The analysis figures in the report's order, any other after them by name."""
    return (FIGURE_ORDER.index(name) if name in FIGURE_ORDER else len(FIGURE_ORDER), name)


def number(x: object) -> str:
    """A measured value: two decimals with thousands separators, "-" when there is none."""
    return num(x)


def value_text(x: object) -> str:
    """A value of a JSON record: 4 significant digits for a float, as is otherwise."""
    if x is None:
        return "none"
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, float):
        return "-" if math.isnan(x) else f"{x:.4g}"
    return str(x)


def level(x: object) -> str:
    """A concurrency or request rate as the tables write it (4, 0.5)."""
    if isinstance(x, float):
        return f"{x:g}"
    return str(x)


def level_key(x: object) -> tuple[int, float, str]:
    """Levels in number order, anything else after them."""
    if isinstance(x, int | float) and not isinstance(x, bool):
        return (0, float(x), "")
    try:
        return (0, float(str(x)), str(x))
    except ValueError:
        return (1, 0.0, str(x))


def css(word: str) -> str:
    """A verdict or status as a CSS class (`v-holds`, `v-not-comparable`)."""
    return "v-" + "-".join("".join(c if c.isalnum() else " " for c in word.lower()).split())


def host_class(prov: Mapping[str, Any] | None) -> str:
    """The measuring host in a few words: CPU model (vendor, family, model), ISA class, and
    the GPUs where there are any: the index, the release pages and the history say it alike."""
    host = (prov or {}).get("host") or {}
    f = host.get("cpu_facts") or {}
    cpu = str(f.get("model_name") or host.get("cpu") or "CPU not recorded")
    if f.get("family") is not None:
        cpu += f" ({f.get('vendor')} family {f.get('family')} model {f.get('model')})"
    text = (
        f"{cpu}, ISA class {f['isa_class']}"
        if f.get("isa_class")
        else f"{cpu}, ISA class not recorded"
    )
    gpus = [str(g.get("name")) for g in host.get("gpus") or [] if isinstance(g, dict)]
    if gpus:
        names = sorted(set(gpus))
        text += "; " + ", ".join(f"{gpus.count(n)} x {n}" for n in names)
    return text
