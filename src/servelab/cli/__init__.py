"""The `servelab` command. Expected errors print one line, without a traceback, and exit 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from servelab import __version__
from servelab.cli import (
    analyze,
    bisect,
    build_model,
    bundle,
    check_config,
    compare,
    crosscheck,
    lock,
    profile,
    release,
    rerun,
    site,
    summary,
    telemetry,
    trace,
    verify,
)
from servelab.errors import ServelabError

# One module per verb, each with its parser (`add_parser`) beside its function; listed in the
# order `servelab --help` shows them.
VERBS = (
    check_config,
    summary,
    analyze,
    build_model,
    lock,
    bundle,
    verify,
    release,
    compare,
    crosscheck,
    rerun,
    bisect,
    site,
    telemetry,
    profile,
    trace,
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser, with every verb of VERBS registered."""
    p = argparse.ArgumentParser(prog="servelab", description=__doc__)
    p.add_argument("--version", action="version", version=f"servelab {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for verb in VERBS:
        verb.add_parser(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ServelabError as exc:
        print(f"servelab: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
