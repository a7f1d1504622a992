"""The `servelab` command. Expected errors print one line, without a traceback, and exit 2."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from servelab import __version__
from servelab.errors import ServelabError


def _cmd_check_config(args: argparse.Namespace) -> int:
    from servelab.config import load

    cfg = load(Path(args.config))
    names = ", ".join(c["name"] for c in cfg["server"]["configs"])
    sw = cfg["sweep"]
    points = len(sw["concurrency"]) * sw["repeats"]
    print(
        f"{args.config}: valid; experiment {cfg['experiment']}, server configs: {names}; "
        f"{points} points each"
    )
    return 0


def _cmd_summary(args: argparse.Namespace) -> int:
    from servelab.summary import render_summary

    exp = Path(args.experiment_dir)
    if not (exp / "raw").is_dir():
        raise ServelabError(f"{exp}: no raw/ folder; pass results/<experiment>")
    print(render_summary(exp), end="")
    return 0


def _cmd_lock(args: argparse.Namespace) -> int:
    from servelab.jsonio import read_json
    from servelab.runtime import lock_from_pip_report

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


def _cmd_build_model(args: argparse.Namespace) -> int:
    from servelab.config import load
    from servelab.model import build_model

    cfg = load(Path(args.config))
    record = build_model(cfg["model"], Path(args.out))
    print(json.dumps({"revision": record["revision"], "files": len(record["files"])}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from servelab.runtime import LOCK_EXCLUDE

    p = argparse.ArgumentParser(prog="servelab", description=__doc__)
    p.add_argument("--version", action="version", version=f"servelab {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("check-config", help="validate an experiment config against the schema")
    c.add_argument("config")
    c.set_defaults(func=_cmd_check_config)

    s = sub.add_parser("summary", help="print the summary table of results/<experiment>")
    s.add_argument("experiment_dir")
    s.set_defaults(func=_cmd_summary)

    m = sub.add_parser("build-model", help="materialize the config's model into a folder")
    m.add_argument("config")
    m.add_argument("--out", required=True)
    m.set_defaults(func=_cmd_build_model)

    lk = sub.add_parser("lock", help="write a hashed runtime lock from a pip --report file")
    lk.add_argument("--report", required=True, help="output of pip install --dry-run --report")
    lk.add_argument("--out", required=True)
    lk.add_argument("--title", required=True, help="one line: what the lock is for")
    lk.add_argument("--exclude", nargs="*", default=list(LOCK_EXCLUDE))
    lk.set_defaults(func=_cmd_lock)
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
