"""`servelab verify`: check a bundle folder, release tarball or release folder; exit 0 only if
it holds."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the verb on the top-level subparsers."""
    v = sub.add_parser(
        "verify",
        help="check a bundle folder, release tarball or release folder; exit 0 only if it holds",
    )
    v.add_argument(
        "path", help="a bundle folder, a release .tar.gz or a release folder (evidence/EXP/TAG)"
    )
    v.add_argument(
        "--rebuild",
        action="store_true",
        help="also re-render tables and figures from the raw data and compare bytes",
    )
    v.add_argument(
        "--diagnosing",
        metavar="DIR",
        help="a confirmation's diagnosing bundle: folder, tarball or release folder (default: "
        "the diagnosing experiment's bundle in the confirmation's results folder)",
    )
    v.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from servelab.evidence.verify import verification

    diagnosing = Path(args.diagnosing) if args.diagnosing else None
    checked = verification(Path(args.path), do_rebuild=args.rebuild, diagnosing=diagnosing)
    for line in checked.failures:
        print(f"FAIL {line}")
    if checked.diagnosing is not None and not checked.diagnosing_failures:
        print(
            f"diagnosing bundle {checked.diagnosing}: holds "
            f"(manifest sha256 {str(checked.manifest_sha256)[:8]}...)"
        )
    if checked.failures:
        return 1
    what = "checksums, manifest, schemas" + (", rebuilt tables and figures" if args.rebuild else "")
    if checked.release is not None:
        print(
            f"{args.path}: OK (release {checked.release.get('tag')}: tarball sha256 "
            f"{str(checked.release.get('tarball_sha256'))[:12]}..., the bundle inside ({what}), "
            f"{checked.copies} extracted copies)"
        )
    else:
        print(f"{args.path}: OK ({what})")
    return 0
