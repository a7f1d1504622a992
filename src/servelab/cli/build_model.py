"""`servelab build-model`: materialize the config's model into a folder."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the verb on the top-level subparsers."""
    m = sub.add_parser("build-model", help="materialize the config's model into a folder")
    m.add_argument("config")
    m.add_argument("--out", required=True)
    m.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from servelab.config import load
    from servelab.env.model import ModelRecord, build_model, build_tiny
    from servelab.env.runtime import cache_dir_of

    exp = load(Path(args.config))
    out = Path(args.out)
    # a tiny model's files go into --out itself (the model stage keeps them in the cache)
    record: ModelRecord
    if exp.model.source == "tiny":
        record = build_tiny(exp.model.tiny, out)
    else:
        record = build_model(exp.model, out, cache_dir_of(exp.runtime), runtime=exp.runtime)
    print(json.dumps({"revision": record["revision"], "files": len(record["files"])}))
    return 0
