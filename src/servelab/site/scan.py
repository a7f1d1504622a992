"""What an evidence folder holds: its experiments (folders holding release folders, each
marked by its release.json) and its reproductions (folders holding a reproduction.json, as
`servelab compare REF FRESH --out DIR` writes them)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from servelab.errors import ServelabError

RELEASE_FILE = "release.json"
REPRODUCTION_FILE = "reproduction.json"


@dataclass(frozen=True)
class ReleaseDir:
    """One release folder: `experiment` names its experiment's folder in the site."""

    experiment: str
    tag: str
    path: Path


@dataclass(frozen=True)
class ExperimentDir:
    """A folder holding release folders, its releases in tag order."""

    name: str
    path: Path
    releases: tuple[ReleaseDir, ...]


@dataclass(frozen=True)
class ReproductionDir:
    """A folder holding reproduction.json; `name`: its path below the evidence folder."""

    name: str
    path: Path


@dataclass(frozen=True)
class EvidenceDir:
    root: Path
    experiments: tuple[ExperimentDir, ...]
    reproductions: tuple[ReproductionDir, ...]


def tag_key(tag: str) -> tuple[tuple[int, int, str], ...]:
    """Tags in number order: v1 < v2 < v10 (runs of digits compare as numbers, the rest as
    text)."""
    return tuple(
        (0, int(part), part) if part.isdigit() else (1, 0, part)
        for part in re.findall(r"\d+|\D+", tag)
    )


def _name(path: Path, root: Path) -> str:
    """A folder's path below the evidence folder, or the evidence folder's own name."""
    rel = path.relative_to(root).as_posix()
    return rel if rel != "." else (root.resolve().name or "evidence")


def scan_evidence(root: Path) -> EvidenceDir:
    """Every release and reproduction under `root`, in a stable order; a missing folder, or
    one holding neither, is refused in one line."""
    if not root.is_dir():
        raise ServelabError(
            f"{root}: no such folder; give the evidence folder (e.g. evidence), which holds "
            "<experiment>/<tag>/ release folders"
        )
    if (root / RELEASE_FILE).is_file():
        raise ServelabError(
            f"{root}: a release folder; give the folder above its experiment's folder "
            "(e.g. evidence)"
        )
    by_experiment: dict[Path, list[ReleaseDir]] = {}
    reproductions: list[ReproductionDir] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        here = Path(dirpath)
        if RELEASE_FILE in filenames:
            by_experiment.setdefault(here.parent, []).append(
                ReleaseDir(_name(here.parent, root), here.name, here)
            )
            dirnames[:] = []
        elif REPRODUCTION_FILE in filenames:
            reproductions.append(ReproductionDir(_name(here, root), here))
            dirnames[:] = []
    if not by_experiment and not reproductions:
        raise ServelabError(
            f"{root}: holds no release (a folder with {RELEASE_FILE}) and no reproduction "
            f"(a folder with {REPRODUCTION_FILE}); give the evidence folder, e.g. evidence"
        )
    experiments = [
        ExperimentDir(_name(path, root), path, tuple(sorted(rels, key=lambda r: tag_key(r.tag))))
        for path, rels in by_experiment.items()
    ]
    return EvidenceDir(
        root,
        tuple(sorted(experiments, key=lambda e: e.name)),
        tuple(sorted(reproductions, key=lambda r: r.name)),
    )
