"""The one rendering toolkit: numbers, CSV, Markdown tables and figures, each written one way.

Same data, same bytes: every table, report and figure servelab writes goes through these.

- `num`: a number for people (reports, terminal tables): "-" when there is none.
- `cell` / `csv_text` / `write_csv`: CSV for programs. Floats to `digits` significant
  digits: 6 for the analysis and telemetry tables (changing it changes every released table),
  9 where values are microsecond totals (the profile's tables), as in JSON (jsonio).
- `md_table`: a Markdown table, "|---|" rules, ":" for right-aligned columns.
- `figure_style` / `save_figure` / `figure_bytes`: deterministic matplotlib output (fixed SVG
  hash salt, no dates or versions in the files).
- `MEAN_CI_STYLE` / `REPEAT_DOT_STYLE` / `MEAN_CI_CAPTION`: how every figure of means shows
  its uncertainty (the mean's 95% CI as an error bar, each repeat as a grey dot;
  servelab.analysis.figures.means_with_ci draws them).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MISSING = "-"


def num(x: object, spec: str = ",.2f", missing: str = MISSING) -> str:
    """`format(x, spec)`, or `missing` for None and NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return missing
    return format(x, spec)


def cell(value: object, digits: int = 6) -> str:
    """One CSV cell: empty for None, true/false, floats to `digits` significant digits,
    lists space-separated."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    if isinstance(value, list | tuple):
        return " ".join(cell(v, digits) for v in value)
    return str(value)


def csv_text(
    columns: Sequence[str],
    rows: Iterable[Mapping[str, object] | Sequence[object]],
    digits: int = 6,
) -> str:
    """A header line and one line per row; a row is a mapping (read by column name) or a
    sequence in column order."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for row in rows:
        values = [row.get(c) for c in columns] if isinstance(row, Mapping) else list(row)
        w.writerow([cell(v, digits) for v in values])
    return buf.getvalue()


def write_csv(
    path: Path,
    columns: Sequence[str],
    rows: Iterable[Mapping[str, object] | Sequence[object]],
    digits: int = 6,
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(csv_text(columns, rows, digits), encoding="utf-8")


def md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def md_table(header: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> list[str]:
    """Lines of a Markdown table. `align` has one letter per column, "l" or "r" (default
    "l" for all); cells are written with str()."""
    rule = "".join("---:|" if a == "r" else "---|" for a in align.ljust(len(header), "l"))
    out = ["| " + " | ".join(header) + " |", "|" + rule]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return out


FIGURE_RC: dict[str, str | float | bool] = {
    "svg.hashsalt": "servelab",
    "svg.fonttype": "none",
    "font.family": "DejaVu Sans",
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "figure.dpi": 100,
}
FIGURE_FORMATS = ("svg", "png")
# A mean with its 95% CI (matplotlib errorbar keywords), and each repeat behind it (scatter).
MEAN_CI_STYLE: dict[str, str | float] = {"marker": "o", "capsize": 3, "zorder": 4}
REPEAT_DOT_STYLE: dict[str, str | float] = {"s": 12, "alpha": 0.5, "color": "0.4", "zorder": 3}
# what a figure of means says it shows, in its title or caption
MEAN_CI_CAPTION = "mean, 95% CI; dots: each repeat"


@contextmanager
def figure_style(**overrides: object) -> Iterator[None]:
    """matplotlib settings for servelab's figures (FIGURE_RC, then `overrides`)."""
    import matplotlib

    rc: dict[str, object] = {**FIGURE_RC, **overrides}
    # matplotlib's stubs take only its literal rc names as keys; it checks the names when set
    with matplotlib.rc_context(rc):  # type: ignore[arg-type]
        yield


def save_figure(
    fig: Figure, out_dir: Path, name: str, formats: Sequence[str] = FIGURE_FORMATS
) -> list[Path]:
    """Write `fig` as <out_dir>/<name>.<format> for each format, without dates or versions,
    and close it."""
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        path = out_dir / f"{name}.{fmt}"
        fig.savefig(path, format=fmt, metadata=_undated(fmt))
        paths.append(path)
    plt.close(fig)
    return paths


def figure_bytes(fig: Figure, fmt: str = "svg") -> bytes:
    """`fig` in one format, as `save_figure` writes it, and close it (for a caller that
    embeds the figure rather than writing a file)."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, metadata=_undated(fmt))
    plt.close(fig)
    return buf.getvalue()


def _undated(fmt: str) -> dict[str, None]:
    """The metadata that keeps a figure's bytes free of dates and versions."""
    return {"Date": None, "Creator": None} if fmt == "svg" else {"Software": None}
