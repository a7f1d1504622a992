"""`servelab lock`: write a hashed runtime lock from a pip --report file."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the verb on the top-level subparsers."""
    from servelab.env.runtime import LOCK_EXCLUDE

    lk = sub.add_parser("lock", help="write a hashed runtime lock from a pip --report file")
    lk.add_argument("--report", required=True, help="output of pip install --dry-run --report")
    lk.add_argument("--out", required=True)
    lk.add_argument("--title", required=True, help="one line: what the lock is for")
    lk.add_argument("--exclude", nargs="*", default=list(LOCK_EXCLUDE))
    lk.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from servelab.env.runtime import lock_from_pip_report
    from servelab.store.jsonio import read_json

    report = read_json(Path(args.report))
    header = (
        f"servelab runtime lock: {args.title}\n"
        "Every distribution pinned with its sha256; installed with\n"
        f"  pip install --no-deps --require-hashes -r {args.out}\n"
        f"Left out: {', '.join(args.exclude)}. See envs/README.md to regenerate."
    )
    text = lock_from_pip_report(report, header, args.exclude)
    Path(args.out).write_text(text, encoding="utf-8")
    print(f"{args.out}: {text.count('--hash=')} pinned distributions")
    return 0
