"""`servelab bisect`: find the first setup (vLLM release, image, server arguments) whose metric
changed, each step measured on this host against the good end (docs/reproduce.md, "Bisect
across releases")."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the verb on the top-level subparsers."""
    p = sub.add_parser(
        "bisect",
        help="find the first setup whose metric changed, each step a same-host interleaved "
        "comparison with the good end",
    )
    p.add_argument(
        "--configfile",
        required=True,
        help="an experiment config with a bisect: section, e.g. "
        "config/experiments/bisect-vllm-cpu.yaml",
    )
    p.add_argument("--cores", default="all", help="snakemake --cores of each step (default all)")
    p.add_argument(
        "--write-only",
        action="store_true",
        help="write the first step's config and print its snakemake command, measure nothing",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import yaml

    from servelab.analysis.bisect import FOUND, headline, time_line
    from servelab.config import load
    from servelab.errors import ServelabError
    from servelab.reproduce.bisection import (
        main_say,
        question,
        run_bisection,
        snakemake_runner,
        step_config,
        step_name,
    )

    if not Path("Snakefile").is_file():
        raise ServelabError(
            f"{Path.cwd()}: no Snakefile here; run servelab bisect from the repository"
        )
    exp = load(Path(args.configfile))
    q = question(exp)
    if args.write_only:
        first = q.bad if q.check_bad else (q.good + q.bad) // 2
        root = Path(exp.results_dir) / step_name(exp, q, first)
        root.mkdir(parents=True, exist_ok=True)
        cfg = root / "bisect-step.yaml"
        cfg.write_text(yaml.safe_dump(step_config(exp, q, first), sort_keys=False), "utf-8")
        main_say(f"first step: snakemake --cores {args.cores} --configfile {cfg}")
        return 0
    doc = run_bisection(exp, snakemake_runner(str(args.cores)), main_say)
    main_say(headline(doc))
    times = time_line(doc)
    if times:
        main_say(times)
    main_say(f"the chain: {Path(exp.results_dir) / exp.name / 'bisection' / 'report.md'}")
    return 0 if doc["verdict"] == FOUND else 1
