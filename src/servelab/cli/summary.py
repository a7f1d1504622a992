"""`servelab summary`: print the summary table of results/<experiment>."""

from __future__ import annotations

import argparse
from pathlib import Path

from servelab.errors import ServelabError


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the verb on the top-level subparsers."""
    s = sub.add_parser("summary", help="print the summary table of results/<experiment>")
    s.add_argument("experiment_dir")
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from servelab.summary import render_summary

    exp = Path(args.experiment_dir)
    if not (exp / "raw").is_dir():
        raise ServelabError(f"{exp}: no raw/ folder; pass results/<experiment>")
    print(render_summary(exp), end="")
    return 0
