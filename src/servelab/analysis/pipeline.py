"""`servelab analyze`: every table, verdict and figure as a pure function of the raw data."""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from servelab.analysis.claims import evaluate_claims
from servelab.analysis.dataset import Dataset, load_dataset
from servelab.analysis.diagnoses import diagnoses
from servelab.analysis.groups import (
    POINT_METRICS,
    Groups,
    paired_table,
    points_table,
    summary_table,
)
from servelab.analysis.knee import DOMINANCE, dominance, knee
from servelab.analysis.slo import slo_capacity
from servelab.analysis.validity import validity_json
from servelab.config import default_section, merge
from servelab.experiment import AnalysisSection, section_from_dict
from servelab.jsonio import write_json
from servelab.telemetry.summary import COLUMNS as TELEMETRY_COLUMNS

__all__ = ["ANALYSIS_VERSION", "Dataset", "analysis_section", "analyze", "load_dataset"]

# Bumped whenever analyze() writes different bytes for the same raw data, so that a bundle says
# which analysis made its tables (provenance.json pipeline.analysis_version; absent = 1).
# 1: until the validity checks; 2: validity checks (validity.json, points.csv columns);
# 3: the pitfall checks (docs/pitfalls.md), TTFT at the first chunk with text, the client-wait,
# first-byte and in-flight metrics.
ANALYSIS_VERSION = 3


def analysis_section(recorded: Mapping[str, Any] | None) -> AnalysisSection:
    """The `analysis:` section of a recorded config (a bundle's config.resolved.yaml, written
    by this servelab or an older one that lacked newer keys) filled over the schema's
    defaults; the schema's defaults where there is none. Numbers the schema calls numbers
    are floats, as when the section was read then."""
    base = asdict(default_section(AnalysisSection, "analysis"))
    a = section_from_dict(AnalysisSection, merge(base, dict(recorded or {})), "analysis")
    return replace(
        a,
        threshold_pct=float(a.threshold_pct),
        alpha=float(a.alpha),
        plateau_pct=float(a.plateau_pct),
        flat_pct=float(a.flat_pct),
    )


def fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list | tuple):
        return " ".join(fmt(v) for v in value)
    return str(value)


def write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for row in rows:
        w.writerow([fmt(row.get(c)) for c in columns])
    path.write_text(buf.getvalue(), encoding="utf-8")


UTILIZATION_FIGURE = "utilization_vs_throughput"


def utilization_figure(ds: Dataset, out_dir: Path) -> list[Path]:
    """Utilization against tokens/s, per point (telemetry): a busy-looking device that
    delivers a fraction of the best throughput stands out."""
    from servelab.telemetry import plot_utilization_vs_throughput, utilization_vs_throughput

    rows = utilization_vs_throughput(
        {
            "server_config": p.server_config,
            "concurrency": p.concurrency,
            "repeat": p.repeat,
            "output_throughput": p.metrics.get("output_throughput"),
            "telemetry": p.extra.get("telemetry"),
        }
        for p in ds.points
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    return [
        plot_utilization_vs_throughput(rows, out_dir / f"{UTILIZATION_FIGURE}.{fmt}")
        for fmt in ("svg", "png")
    ]


def analyze(
    root: Path,
    out: Path,
    analysis: AnalysisSection | None = None,
    name: str | None = None,
    figures: bool = True,
) -> dict[str, Any]:
    """Every table, verdict and figure of the points under `root` into `out`; `analysis`:
    the experiment's analysis section (the schema's defaults when None)."""
    opts = analysis or default_section(AnalysisSection, "analysis")
    ds = load_dataset(root, name, opts.validity)
    g = Groups(ds)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "points": points_table(ds),
        "summary": summary_table(g),
        "paired": paired_table(g, opts),
        "knee": knee(g, opts),
        "dominance": dominance(g),
        "slo": slo_capacity(g, opts),
        "validity": validity_json(g.point_flags(), opts.validity),
        "host": {"hosts": ds.hosts, "runtime_isa": ds.runtime_isa},
    }
    results["diagnoses"] = diagnoses(g, ds, results["knee"], results["dominance"], opts)
    results["claims"] = evaluate_claims(
        g, opts, results["knee"], results["dominance"], results["diagnoses"]
    )
    has_telemetry = any("telemetry" in p.extra for p in ds.points)
    tel_cols = list(TELEMETRY_COLUMNS) if has_telemetry else []
    write_csv(
        out / "points.csv",
        results["points"],
        [
            "server_config",
            "repeat",
            "concurrency",
            "position",
            "valid",
            "invalid_reasons",
            *POINT_METRICS,
            *tel_cols,
        ],
    )
    write_csv(
        out / "summary.csv",
        results["summary"],
        [
            "server_config",
            "concurrency",
            "metric",
            "n",
            "mean",
            "sd",
            "cv_pct",
            "ci95_low",
            "ci95_high",
            "min",
            "max",
        ],
    )
    write_csv(
        out / "paired.csv",
        results["paired"],
        [
            "server_config",
            "a",
            "b",
            "metric",
            "n",
            "mean_rel_diff_pct",
            "agree",
            "p_value",
            "verdict",
        ],
    )
    dom_cols = ["server_config", "concurrency", "dominated_by"] + [
        f"{m}_delta_pct" for m, _ in DOMINANCE
    ]
    write_csv(out / "dominance.csv", results["dominance"], dom_cols)
    write_json(out / "knee.json", results["knee"])
    write_json(out / "diagnoses.json", results["diagnoses"])
    write_json(out / "claims.json", results["claims"])
    write_json(out / "validity.json", results["validity"])
    if results["slo"] is not None:
        write_json(out / "slo.json", results["slo"])
    elif (out / "slo.json").exists():
        (out / "slo.json").unlink()
    fig_names: list[str] = []
    if figures:
        from servelab.analysis.figures import render_all

        fig_names = [p.name for p in render_all(g, results["dominance"], out / "figures")]
        if has_telemetry:
            fig_names += [p.name for p in utilization_figure(ds, out / "figures")]
    from servelab.analysis.report import render

    (out / "report.md").write_text(render(g, results, ds.layout, fig_names), encoding="utf-8")
    return results
