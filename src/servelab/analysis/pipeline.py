"""`servelab analyze`: every table, verdict and figure as a pure function of the raw data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TypedDict

from servelab.analysis.claims import Findings, evaluate_claims
from servelab.analysis.clients import run_clients
from servelab.analysis.confirmation import confirmation
from servelab.analysis.dataset import Dataset, load_dataset
from servelab.analysis.diagnoses import diagnoses
from servelab.analysis.groups import (
    PAIRED_COLUMNS,
    POINTS_COLUMNS,
    SUMMARY_COLUMNS,
    Groups,
    axis_of,
    paired_table,
    points_table,
    summary_table,
    with_axis,
)
from servelab.analysis.knee import DOMINANCE_COLUMNS, DominanceRow, dominance, knee
from servelab.analysis.outputs import OutputsAsk, claim_configs, outputs_compared
from servelab.analysis.result import Analysis
from servelab.analysis.rounds import sequential_claims
from servelab.analysis.runtimes import runtimes_compared
from servelab.analysis.samehost import same_host
from servelab.analysis.search import SearchResult
from servelab.analysis.slo import slo_capacity
from servelab.analysis.turns import TurnRow, turns_of
from servelab.analysis.validity import host_speed_json, validity_json
from servelab.config import default_section, merge
from servelab.design.stopping import StoppingRule
from servelab.documents import JsonValue
from servelab.documents.declared import ClaimVerdict, RoundsRecord, SearchJson, StartRecord
from servelab.env.endpoint import report_facts
from servelab.experiment import AnalysisSection, section_from_dict
from servelab.render import write_csv
from servelab.store.jsonio import write_json
from servelab.store.paths import (
    ANALYSIS_REPORT,
    search_figure_name,
)
from servelab.store.rawdata import relative
from servelab.telemetry.columns import table_columns as telemetry_table_columns

__all__ = [
    "ANALYSIS_VERSION",
    "Dataset",
    "analysis_section",
    "analyze",
    "load_dataset",
    "searches_of",
]

# Bumped whenever analyze() writes different bytes for the same raw data, so that a bundle says
# which analysis made its tables (provenance.json pipeline.analysis_version; absent = 1).
# 1: until the validity checks; 2: validity checks (validity.json, points.csv columns);
# 3: the pitfall checks (docs/pitfalls.md), TTFT at the first chunk with text, the client-wait,
# first-byte and in-flight metrics; 4: every diagnosis and knee with its evidence level (a dip
# on one repeat reported untested), the CUDA graph capture sizes and the dip's batch against them;
# 5: points.csv's telemetry columns filled (they were written empty); 6: every diagnosis with
# its proposal or why it has none (analysis.proposals), in diagnoses.json and the report; 7: every
# figure of means draws the mean's 95% CI and each repeat (figures.means_with_ci); 8: every
# percentile with its n and 95% interval, or none where the requests are too few to bound it
# (points.csv's tail columns, paired and claim verdicts "insufficient"), the steady_state
# check, SLO decisions by early stopping, and same_outputs.
ANALYSIS_VERSION = 8


def analysis_section(recorded: Mapping[str, JsonValue] | None) -> AnalysisSection:
    """The `analysis:` section of a recorded config (a bundle's config.resolved.yaml, written
    by this servelab or an older one that lacked newer keys) filled over the schema's
    defaults; the schema's defaults where there is none."""
    base = asdict(default_section(AnalysisSection, "analysis"))
    return section_from_dict(AnalysisSection, merge(base, dict(recorded or {})), "analysis")


def utilization_figure(ds: Dataset, out_dir: Path) -> list[Path]:
    """Utilization against tokens/s, per point (telemetry): a busy-looking device that
    delivers a fraction of the best throughput stands out."""
    from servelab.telemetry import plot_utilization_vs_throughput, utilization_vs_throughput

    rows = utilization_vs_throughput(
        {
            "server_config": p.server_config,
            "concurrency": p.level.value,
            "repeat": p.repeat,
            "output_throughput": p.metrics.get("output_throughput"),
            "telemetry": p.extra.get("telemetry"),
        }
        for p in ds.points
    )
    return plot_utilization_vs_throughput(rows, out_dir)


def analyze(
    root: Path,
    out: Path,
    analysis: AnalysisSection | None = None,
    name: str | None = None,
    figures: bool = True,
    skip_damaged: bool = False,
) -> Analysis:
    """Every table, verdict and figure of the points under `root` into `out`; `analysis`:
    the experiment's analysis section (the schema's defaults when None). The raw data is
    read, and checked, before anything is written: damaged raw data raises and leaves `out`
    as it was. With `skip_damaged`, damaged points are left out and listed in the result's
    `skipped` and the report. Server configs measured on more than one node are named in its
    `hosts_differ` (config -> hostname) and the report's Host section."""
    opts = analysis or default_section(AnalysisSection, "analysis")
    ds = load_dataset(root, name, opts.validity, skip_damaged=skip_damaged)
    g = Groups(ds)
    out.mkdir(parents=True, exist_ok=True)
    validity = validity_json(g.point_flags(), opts.validity, g.point_records())
    if ds.canaries:  # only where the sweep recorded the host-speed canary
        validity["host_speed"] = host_speed_json(ds.canaries)
    searches = searches_of(ds)
    notes = _notes(ds, root, searches)
    knees, dominated = knee(g, opts), dominance(g)
    diagnosed = diagnoses(g, ds, knees, dominated, opts)
    found = Findings(knees, dominated, diagnosed, notes.get("search", {}))
    claims, rounds = _claims(g, ds, opts, found)
    # the compared configurations' completions, where the points recorded their token ids
    outputs = OutputsAsk(ds.outputs, opts.max_differing_outputs_pct)
    named = [(p.a, p.b) for p in opts.compare] + [
        pair for c in claims if (pair := claim_configs(c)) is not None
    ]
    result = Analysis(
        points=points_table(ds),
        summary=summary_table(g),
        paired=paired_table(g, opts),
        knee=knees,
        dominance=dominated,
        validity=validity,
        # a server servelab did not launch: what it said of itself (endpoint.report_facts)
        host={"hosts": ds.hosts, "runtime_isa": ds.runtime_isa, **report_facts(ds.capacity)},
        diagnoses=diagnosed,
        claims=claims,
        slo=slo_capacity(g, opts),
        rounds=rounds,
        # configurations on their own runtimes (another vLLM release)
        runtimes=runtimes_compared(g, ds, opts, outputs),
        # pairs compared on this host in three words (a rerun)
        same_host=same_host(ds, opts.compare, opts.margin_pct, opts.alpha, outputs=outputs)
        if opts.compare
        else None,
        # did the compared configurations give the same answers (the report's "Same outputs")
        same_outputs=outputs_compared(outputs, g.configs, named),
        # a confirmation experiment: a verdict per proposal
        confirmation=confirmation(g, claims, opts.confirms) if opts.confirms is not None else None,
        # other tools measuring the same points (client.cross_check)
        clients=run_clients(root, opts.validity) or None,
        **notes,
    )
    _write_tables(out, ds, result)
    fig_names = _figures(g, ds, dominated, out, searches) if figures else []
    from servelab.analysis.markdown import render_report

    (out / ANALYSIS_REPORT).write_text(
        render_report(g, result, ds.layout, fig_names), encoding="utf-8"
    )
    return result


class Notes(TypedDict, total=False):
    """The analysis's entries present only where they apply (`_notes`): the damaged data
    skipped, the hosts of configs measured on several nodes, the searches, the sweeps' server
    starts, the chat points' turns."""

    skipped: list[dict[str, str]]
    hosts_differ: dict[str, str]
    search: dict[str, SearchJson]
    starts: dict[str, StartRecord]
    turns: dict[str, list[TurnRow]]


def _notes(ds: Dataset, root: Path, searches: dict[str, SearchResult]) -> Notes:
    """The analysis's entries present only where they apply, so that the outputs of data that
    has none stay byte for byte: the damaged data skipped, the hosts of configs measured on
    several nodes, the sweeps' server starts."""
    notes: Notes = {}
    if ds.skipped:
        # paths relative to `root`: the report reads the same wherever the results lie
        notes["skipped"] = [
            {
                ("point" if s.left_out is None else "file"): relative(s.path, root),
                "reason": s.damage.line(root),
                **({} if s.left_out is None else {"left_out": s.left_out}),
            }
            for s in ds.skipped
        ]
    if len({str(n.get("hostname")) for n in ds.nodes.values()}) > 1:
        notes["hosts_differ"] = {
            sc: str(node.get("hostname")) for sc, node in sorted(ds.nodes.items())
        }
    if searches:
        notes["search"] = {sc: r.to_json() for sc, r in searches.items()}
    if ds.layout == "servelab":
        # where each sweep's server start went; only the sweeps' launches, which the analysis
        # depends on (a profiling pass may not have run yet), and only when recorded: the
        # report of older raw data stays byte for byte
        starts = {k: v for k, v in ds.starts.items() if k.startswith("sweep ")}
        if starts:
            notes["starts"] = starts
        # multi-turn chat points: TTFT by turn and their conversations (turns.json)
        turns = turns_of(ds)
        if turns:
            notes["turns"] = turns
    return notes


def _claims(
    g: Groups, ds: Dataset, opts: AnalysisSection, found: Findings
) -> tuple[list[ClaimVerdict], RoundsRecord | None]:
    """The claims' verdicts and, for a sequential sweep, its looks (None otherwise)."""
    if ds.sequential is not None:
        # a sequential sweep: its claims as its stopping rule decided them, look by look
        rule = StoppingRule.from_json(ds.sequential["rule"])
        return sequential_claims(ds, opts, rule, ds.sequential.get("stopped"))
    return evaluate_claims(g, opts, found, ds.nodes), None


def _write_tables(out: Path, ds: Dataset, result: Analysis) -> None:
    """The tables and verdicts of ANALYSIS_TABLES, validity.json, and slo.json, rounds.json,
    turns.json, confirmation.json and same_host.json where they apply (an earlier one removed
    where they do not)."""
    blocks = [p.extra["telemetry"] for p in ds.points if "telemetry" in p.extra]
    axis = axis_of(ds)
    columns = {
        "points.csv": [*with_axis(POINTS_COLUMNS, axis), *telemetry_table_columns(blocks)],
        "summary.csv": with_axis(SUMMARY_COLUMNS, axis),
        "paired.csv": PAIRED_COLUMNS,
        "dominance.csv": with_axis(DOMINANCE_COLUMNS, axis),
    }
    for table, rows in result.csv_tables().items():
        write_csv(out / table, columns[table], rows)
    for table, doc in result.json_tables().items():
        write_json(out / table, doc)
    for table, only in result.only_where().items():  # only where they apply
        if only is not None:
            write_json(out / table, only)
        elif (out / table).exists():
            (out / table).unlink()


def searches_of(ds: Dataset) -> dict[str, SearchResult]:
    """Each configuration's SLO capacity search (raw/<sc>/search/search.json), where one ran;
    none in a vllm-bench tree."""
    return ds.searches


def _figures(
    g: Groups,
    ds: Dataset,
    dominated: list[DominanceRow],
    out: Path,
    searches: dict[str, SearchResult],
) -> list[str]:
    """The figures' file names: the analysis figures, utilization against tokens/s where the
    points have telemetry, then each SLO capacity search's path."""
    from servelab.analysis.figures import render_all

    names = [p.name for p in render_all(g, dominated, out / "figures")]
    if any("telemetry" in p.extra for p in ds.points):
        names += [p.name for p in utilization_figure(ds, out / "figures")]
    if searches:
        from servelab.analysis.search_figure import render_search

        for sc, result in searches.items():
            names += [
                p.name for p in render_search(result, out / "figures", search_figure_name(sc))
            ]
    return names
