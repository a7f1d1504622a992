"""`servelab check-config`: validate an experiment config and say what it will measure."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the verb on the top-level subparsers."""
    c = sub.add_parser("check-config", help="validate an experiment config against the schema")
    c.add_argument("config")
    c.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from servelab.config import load
    from servelab.workload import trace
    from servelab.workload.datasets import check_local_pin

    cfg = load(Path(args.config))
    check_local_pin(cfg.workload.dataset)  # a dataset file other than the pinned one: refused
    trace.check_local_pin(cfg.workload.trace)  # a trace file too
    names = ", ".join(cfg.server.names)
    levels, plan = len(cfg.sweep.levels), cfg.sweep.rounds
    points = (
        f"{levels * plan.min} to {levels * plan.max} points each (rounds {plan.min} to "
        f"{plan.max}, until the claims are decided)"
        if plan is not None
        else f"{levels * cfg.sweep.most_repeats} points each"
    )
    print(f"{args.config}: valid; experiment {cfg.name}, server configs: {names}; {points}")
    return 0
