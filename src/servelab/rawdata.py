"""Reading servelab's raw layout (DESIGN.md "Raw data contract")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servelab.errors import ServelabError
from servelab.jsonio import read_json

SUPPORTED_POINT_FORMATS = {1}


def point_files(exp_dir: Path) -> list[Path]:
    """Complete measured points only: `.partial` and `.incomplete` folders never match."""
    return sorted((exp_dir / "raw").glob("*/rep[0-9][0-9]/c[0-9][0-9][0-9][0-9]/point.json"))


def load_point(path: Path) -> dict[str, Any]:
    point = read_json(path)
    version = point.get("format_version")
    if version not in SUPPORTED_POINT_FORMATS:
        raise ServelabError(
            f"{path}: point format_version {version!r} is not one this servelab reads "
            f"({sorted(SUPPORTED_POINT_FORMATS)}); upgrade servelab or re-run the sweep"
        )
    return dict(point)


def load_points(exp_dir: Path) -> list[dict[str, Any]]:
    points = [load_point(p) for p in point_files(exp_dir)]
    return [p for p in points if p.get("status") == "complete"]


def point_contexts(exp_dir: Path) -> dict[str, dict[str, Any]]:
    """What the validity checks read beside the points of each server configuration (by
    name, for every raw/<sc>/): its launch arguments (server/<sc>/launch.json `args`) and the
    warm-up's point.json (raw/<sc>/warmup/); each None when absent."""
    out: dict[str, dict[str, Any]] = {}
    raw = exp_dir / "raw"
    for d in sorted(raw.iterdir()) if raw.is_dir() else []:
        if not d.is_dir():
            continue
        lj = exp_dir / "server" / d.name / "launch.json"
        args = read_json(lj).get("args") if lj.is_file() else None
        wp = d / "warmup" / "point.json"
        warmup = read_json(wp) if wp.is_file() else None
        out[d.name] = {
            "server_args": args if isinstance(args, dict) else None,
            "warmup": warmup if isinstance(warmup, dict) else None,
        }
    return out
