"""Reading servelab's raw layout (DESIGN.md "Raw data contract", docs/raw-data.md).

`load_points` is the one reader of the measured points: every complete point.json of an
experiment folder, each with its folder and what the validity checks read beside it (its
configuration's launch arguments and warm-up). The analysis, the end-of-run summary and
`servelab telemetry summarize` all read points through it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab.errors import ServelabError
from servelab.jsonio import read_json, read_jsonl_gz
from servelab.paths import POINT_FILE, ExperimentPaths

SUPPORTED_POINT_FORMATS = {1}
REQUESTS_FILE = "requests.jsonl.gz"


@dataclass(frozen=True)
class RawPoint:
    """One complete measured point: its point.json (`meta`), its folder, and the context the
    validity checks read: the configuration's launch arguments (server/<sc>/launch.json
    `args`) and its warm-up's point.json (raw/<sc>/warmup/), each None when absent."""

    meta: dict[str, Any]
    folder: Path
    server_args: Mapping[str, Any] | None = None
    warmup: Mapping[str, Any] | None = None

    @property
    def server_config(self) -> str:
        return str(self.meta["server_config"])

    @property
    def requests_path(self) -> Path:
        return self.folder / REQUESTS_FILE

    def request_rows(self) -> list[dict[str, Any]]:
        """The rows of requests.jsonl.gz (an error when the file is missing)."""
        return read_jsonl_gz(self.requests_path)


def point_files(exp_dir: Path) -> list[Path]:
    """Complete measured points only: `.partial` and `.incomplete` folders never match."""
    pattern = f"*/rep[0-9][0-9]/c[0-9][0-9][0-9][0-9]/{POINT_FILE}"
    return sorted(ExperimentPaths(exp_dir).raw.glob(pattern))


def load_point(path: Path) -> dict[str, Any]:
    point = read_json(path)
    version = point.get("format_version")
    if version not in SUPPORTED_POINT_FORMATS:
        raise ServelabError(
            f"{path}: point format_version {version!r} is not one this servelab reads "
            f"({sorted(SUPPORTED_POINT_FORMATS)}); upgrade servelab or re-run the sweep"
        )
    return dict(point)


def load_points(exp_dir: Path) -> list[RawPoint]:
    """Every complete measured point of `exp_dir`, in folder order, with its context."""
    context = _contexts(exp_dir)
    out = []
    for path in point_files(exp_dir):
        meta = load_point(path)
        if meta.get("status") != "complete":
            continue
        args, warmup = context.get(str(meta["server_config"]), (None, None))
        out.append(RawPoint(meta, path.parent, args, warmup))
    return out


def _contexts(
    exp_dir: Path,
) -> dict[str, tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]]:
    """Per raw/<sc>/ folder, read once: its launch arguments and its warm-up's point.json."""
    out: dict[str, tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]] = {}
    paths = ExperimentPaths(exp_dir)
    for d in sorted(paths.raw.iterdir()) if paths.raw.is_dir() else []:
        if not d.is_dir():
            continue
        lj = paths.server(d.name) / "launch.json"
        args = read_json(lj).get("args") if lj.is_file() else None
        wp = paths.warmup(d.name) / POINT_FILE
        warmup = read_json(wp) if wp.is_file() else None
        out[d.name] = (
            args if isinstance(args, dict) else None,
            warmup if isinstance(warmup, dict) else None,
        )
    return out
