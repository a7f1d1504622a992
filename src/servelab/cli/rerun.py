"""`servelab rerun`: re-run a reference's server beside the current side on this host, and
answer SAME, DIFFERENT or UNKNOWN per level and metric (docs/reproduce.md, "Re-run on one
host")."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import cast

import yaml


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the verb on the top-level subparsers."""
    p = sub.add_parser(
        "rerun",
        help="measure a reference's server beside the current side on this host, interleaved, "
        "and answer SAME, DIFFERENT or UNKNOWN",
    )
    p.add_argument("reference", help="release folder, release .tar.gz or bundle folder")
    p.add_argument(
        "current",
        nargs="?",
        help="the same kinds; absent: the reference's servers on this checkout's runtime "
        "(--configfile's)",
    )
    p.add_argument(
        "--configfile",
        default="config/config.yaml",
        help="this checkout's experiment config, whose runtime is the current side when no "
        "CURRENT is given (default config/config.yaml)",
    )
    p.add_argument(
        "--config",
        action="append",
        dest="configs",
        help="re-run only this server configuration of the reference (repeatable)",
    )
    p.add_argument("--margin-pct", type=float, default=None, help="equivalence margin (10)")
    p.add_argument(
        "--rounds",
        default="3:10",
        help="MIN:MAX rounds of the interleaved plan (default 3:10)",
    )
    p.add_argument(
        "--waves",
        type=int,
        help="workload.waves of every point (default 4 x the reference's: longer windows, "
        "fewer rounds to a verdict)",
    )
    p.add_argument(
        "--slices",
        type=int,
        help="side by side: send each point in this many slices that alternate between the "
        "two servers (default waves / 2; 1: whole points)",
    )
    p.add_argument(
        "--one-at-a-time",
        action="store_true",
        help="start one side's server at a time in each round (default on CPU runtimes: both "
        "sides' servers up together, their points alternating, where memory holds both)",
    )
    p.add_argument("--name", help="the experiment's name (default rerun-<reference experiment>)")
    p.add_argument("--results-dir", default="results", help="where results go (default results)")
    p.add_argument("--cores", default="all", help="snakemake --cores (default all)")
    p.add_argument(
        "--write-only",
        action="store_true",
        help="write the experiment config and print the snakemake command, measure nothing",
    )
    p.set_defaults(func=run)


def _rounds(text: str) -> tuple[int, int]:
    from servelab.errors import ServelabError

    lo, sep, hi = text.partition(":")
    try:
        pair = (int(lo), int(hi if sep else lo))
    except ValueError:
        pair = (0, 0)
    if not 2 <= pair[0] <= pair[1]:
        raise ServelabError(f"--rounds {text}: give MIN:MAX with 2 <= MIN <= MAX, e.g. 3:6")
    return pair


def run(args: argparse.Namespace) -> int:
    from servelab.analysis.equivalence import DEFAULT_MARGIN_PCT
    from servelab.config import read_file, resolve
    from servelab.errors import ServelabError
    from servelab.reproduce.rerun import RerunOptions, experiment_name, header, rerun_config
    from servelab.reproduce.sides import ResolvedConfig, open_side

    repo = Path.cwd()
    if not (repo / "Snakefile").is_file():
        raise ServelabError(f"{repo}: no Snakefile here; run servelab rerun from the repository")
    opts = RerunOptions(
        name=args.name,
        results_dir=args.results_dir,
        margin_pct=args.margin_pct if args.margin_pct is not None else DEFAULT_MARGIN_PCT,
        rounds=_rounds(args.rounds),
        configs=tuple(args.configs) if args.configs else None,
        waves=args.waves,
        side_by_side=False if args.one_at_a_time else None,
        slices=args.slices,
    )
    # resolved: checked against config.schema.yaml
    this = cast(ResolvedConfig, resolve(read_file(Path(args.configfile)), args.configfile))
    with tempfile.TemporaryDirectory(prefix="servelab-rerun-") as work:
        reference = open_side(Path(args.reference), Path(work) / "ref", "reference")
        current = (
            open_side(Path(args.current), Path(work) / "cur", "current side")
            if args.current
            else None
        )
        for side in (reference, current):
            if side is not None and side.config is None:
                raise ServelabError(
                    f"{side.given}: a {side.kind}, not a bundle or a release; a re-run needs "
                    "the server, runtime and model a bundle records"
                )
        out = Path(opts.results_dir) / experiment_name(reference, opts)
        cfg = rerun_config(reference, current, this, out, repo, opts)
        resolve(cfg, "the derived rerun config")  # refused here, in one line, before anything
        path = out / "rerun.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            header(reference, current) + yaml.safe_dump(cfg, sort_keys=False), encoding="utf-8"
        )
    cmd = ["snakemake", "--cores", str(args.cores), "--configfile", str(path)]
    print(f"rerun: {path} written: {len(cfg['server']['configs'])} server configurations")
    print(f"rerun: {shlex.join(cmd)}")
    if args.write_only:
        return 0
    sys.stdout.flush()
    done = subprocess.run(cmd, cwd=repo, check=False)
    if done.returncode == 0:
        print(f"rerun: the answers: {out}/analysis/report.md#compared-on-this-host")
    return done.returncode
