"""`servelab verify`: check a bundle folder or release tarball; exit 0 only if it holds."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    """Register the verb on the top-level subparsers."""
    v = sub.add_parser(
        "verify", help="check a bundle folder or release tarball; exit 0 only if it holds"
    )
    v.add_argument("path")
    v.add_argument(
        "--rebuild",
        action="store_true",
        help="also re-render tables and figures from the raw data and compare bytes",
    )
    v.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from servelab.evidence.verify import verify

    failures = verify(Path(args.path), do_rebuild=args.rebuild)
    for line in failures:
        print(f"FAIL {line}")
    if failures:
        return 1
    what = "checksums, manifest, schemas" + (", rebuilt tables and figures" if args.rebuild else "")
    print(f"{args.path}: OK ({what})")
    return 0
