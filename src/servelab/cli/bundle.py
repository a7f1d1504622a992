"""`servelab bundle`: assemble the evidence bundle of results/<experiment>."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the verb on the top-level subparsers."""
    b = sub.add_parser("bundle", help="assemble the evidence bundle of results/<experiment>")
    b.add_argument("experiment_dir")
    b.add_argument("--config", required=True, help="the experiment's config file")
    b.add_argument("--out", required=True)
    b.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from servelab.config import REPO_ROOT, load
    from servelab.evidence.bundle import build_bundle
    from servelab.store.paths import ExperimentPaths

    exp = load(Path(args.config))
    paths = ExperimentPaths(Path(args.experiment_dir))
    manifest = build_bundle(exp, paths, Path(args.out), REPO_ROOT)
    print(f"{args.out}: {len(manifest['files'])} files, schema-validated")
    return 0
