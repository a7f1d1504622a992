"""`servelab site`: build the static evidence site over a folder of releases and
reproductions."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the verb on the top-level subparsers."""
    s = sub.add_parser(
        "site",
        help="build a static site over a folder of releases and reproductions",
    )
    s.add_argument("evidence", help="the evidence folder: <experiment>/<tag>/ release folders")
    s.add_argument(
        "--out",
        required=True,
        help="the site's folder: new, empty, or a site built before (replaced)",
    )
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from servelab.site import build_site

    result = build_site(Path(args.evidence), Path(args.out))
    failing = len(result.not_verified)
    print(
        f"site: {len(result.pages)} pages"
        + (f", {failing} release(s) that do not verify (shown as such)" if failing else "")
        + f"; open {result.index.resolve().as_uri()} in a browser, or serve it: "
        f"python -m http.server -d {result.out}"
    )
    return 0
