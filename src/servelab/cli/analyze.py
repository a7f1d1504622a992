"""`servelab analyze`: tables, verdicts, figures and report.md from raw data
(`servelab.analysis.pipeline.analyze`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servelab.analysis.result import Analysis


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the verb on the top-level subparsers."""
    a = sub.add_parser("analyze", help="tables, verdicts, figures and report.md from raw data")
    a.add_argument(
        "root",
        help="results/<experiment>, or a vllm-bench tree (rep_NN/concurrency_CCC or rep_NN/rate_R)",
    )
    a.add_argument("--out", required=True, help="output folder")
    a.add_argument("--config", help="experiment config whose analysis: section to use")
    a.add_argument("--name", help="server config name for a vllm-bench tree (default: folder name)")
    a.add_argument("--no-figures", action="store_true", help="skip the figures")
    a.add_argument(
        "--skip-damaged",
        action="store_true",
        help="leave out points whose raw data cannot be read (and go without a configuration's "
        "capacity or host facts whose file cannot be read), listing them in the report",
    )
    a.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from servelab.analysis.pipeline import analyze
    from servelab.config import default_section, load
    from servelab.experiment import AnalysisSection

    opts = (
        load(Path(args.config)).analysis
        if args.config
        else default_section(AnalysisSection, "analysis")
    )
    results = analyze(
        Path(args.root),
        Path(args.out),
        opts,
        name=args.name,
        figures=not args.no_figures,
        skip_damaged=args.skip_damaged,
    )
    _print_results(args, results)
    return 0


def _print_results(args: argparse.Namespace, results: Analysis) -> None:
    """The counts, then one line per skipped file, diagnosis (and its proposal) and claim."""
    from servelab.analysis.diagnoses import diagnosis_line
    from servelab.analysis.proposals import proposal_line

    print(
        f"{args.out}: {len(results.points)} points, {len(results.diagnoses)} diagnoses, "
        f"{len(results.claims)} claims"
    )
    skipped = results.skipped or []
    if skipped:
        print(
            f"  skipped {len(skipped)} damaged point(s) or file(s) (listed in report.md; "
            f"paths relative to {args.root}):"
        )
    for sk in skipped:
        print(f"  skipped {sk.get('point') or sk['file']}: {sk['reason']}")
    for d in results.diagnoses:
        print(f"  {diagnosis_line(d)}")
        line = proposal_line(d)
        if line is not None:
            print(f"    {line}")
    for c in results.claims:
        print(f"  claim {c['verdict']}: {c['claim']}")
