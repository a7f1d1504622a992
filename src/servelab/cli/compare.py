"""`servelab compare`: compare a fresh run with a reference; exit 0 only when it is
REPRODUCED."""

from __future__ import annotations

import argparse
from pathlib import Path

EXIT_BY_VERDICT = {"REPRODUCED": 0, "NOT REPRODUCED": 1, "NOT COMPARABLE": 3}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the verb on the top-level subparsers."""
    cp = sub.add_parser(
        "compare",
        help="compare a fresh run with a reference; exit 0 only when it is REPRODUCED",
    )
    cp.add_argument(
        "reference", help="release folder, .tar.gz, bundle, results/<exp> or vllm-bench tree"
    )
    cp.add_argument("fresh", help="the same kinds as the reference")
    cp.add_argument("--out", help="write reproduction.json and report.md here")
    cp.add_argument("--config", help="take the reproduction: section of this experiment config")
    cp.add_argument(
        "--claim", action="append", help="a claim to check besides the reference's (repeatable)"
    )
    cp.add_argument(
        "--metric", action="append", help="judge orderings of this metric only (repeatable)"
    )
    cp.add_argument(
        "--tolerance-pct", type=float, help="also judge throughput means: at most this change"
    )
    cp.add_argument(
        "--sign-only",
        action="store_true",
        help="an ordering holds when its sign does, even if not significant in the fresh run",
    )
    cp.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from servelab.config import default_section, load
    from servelab.experiment import ReproductionSection
    from servelab.reproduce import compare, verdict_lines

    section = (
        load(Path(args.config)).reproduction
        if args.config
        else default_section(ReproductionSection, "reproduction")
    )
    if args.claim:
        section = replace(section, claims=(*section.claims, *args.claim))
    if args.tolerance_pct is not None:
        section = replace(section, tolerance_pct=args.tolerance_pct)
    if args.metric:
        section = replace(section, metrics=tuple(args.metric))
    if args.sign_only:
        section = replace(section, require_significance=False)
    out = Path(args.out) if args.out else None
    result = compare(Path(args.reference), Path(args.fresh), section, out)
    for line in verdict_lines(result):
        print(line)
    if out is not None:
        print(f"{out}/reproduction.json, {out}/report.md")
    return EXIT_BY_VERDICT[result["verdict"]]
