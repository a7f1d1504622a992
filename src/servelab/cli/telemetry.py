"""`servelab telemetry summarize results/<experiment>`: per point, throughput beside telemetry
(`servelab.telemetry.table.summarize_experiment`)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `servelab telemetry summarize` on the top-level subparsers."""
    t = sub.add_parser("telemetry", help="telemetry recorded alongside every point")
    tsub = t.add_subparsers(dest="telemetry_command", required=True)
    s = tsub.add_parser(
        "summarize",
        help="per point: tok/s, server and client CPU, running / waiting, KV usage; "
        "writes points.csv and the utilization-vs-tokens/s figure",
    )
    s.add_argument("experiment_dir", help="results/<experiment>")
    s.add_argument("--out", help="folder for the CSV and figure (default <experiment>/telemetry)")
    s.set_defaults(func=run_summarize)


def run_summarize(args: argparse.Namespace) -> int:
    from servelab.telemetry.table import summarize_experiment

    text, written = summarize_experiment(
        Path(args.experiment_dir), Path(args.out) if args.out else None
    )
    print(text, end="")
    for path in written:
        print(f"wrote {path}")
    return 0
