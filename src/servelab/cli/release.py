"""`servelab release`: freeze a bundle into evidence/<experiment>/<tag>/."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the verb on the top-level subparsers."""
    r = sub.add_parser("release", help="freeze a bundle into evidence/<experiment>/<tag>/")
    r.add_argument("bundle")
    r.add_argument("--tag", required=True)
    r.add_argument("--evidence", default="evidence", help="folder of releases (default: evidence)")
    r.add_argument(
        "--allow-unpinned",
        action="store_true",
        help="release even with unpinned inputs (the release records why)",
    )
    r.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from servelab.evidence.release import release

    dest = release(Path(args.bundle), args.tag, Path(args.evidence), args.allow_unpinned)
    print(f"released {dest}")
    return 0
