"""`servelab verify`: checksums, manifest completeness, schemas, and (--rebuild) byte-identical
tables and figures re-rendered from the raw data; a confirmation's bundle together with the
diagnosing bundle it records."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from servelab.errors import ServelabError
from servelab.evidence.bundle import bundle_path
from servelab.evidence.files import safe_extract, walk_files
from servelab.evidence.schemas import check_all_json
from servelab.hashing import sha256_file
from servelab.jsonio import read_json


def open_bundle(path: Path, workdir: Path) -> Path:
    """A bundle directory as is, or a release tarball extracted safely into workdir."""
    if path.is_dir():
        return path
    if path.name.endswith(".tar.gz"):
        return safe_extract(path, workdir)
    raise ServelabError(f"{path}: not a bundle directory or a .tar.gz release")


def check_sums(root: Path, files: list[str]) -> list[str]:
    sums = root / "SHA256SUMS"
    if not sums.exists():
        return ["SHA256SUMS: missing"]
    failures = []
    listed: dict[str, str] = {}
    for n, line in enumerate(sums.read_text(encoding="utf-8").splitlines(), 1):
        digest, sep, name = line.partition("  ")
        if not sep:
            failures.append(f"SHA256SUMS: line {n} is malformed")
            continue
        listed[name] = digest
    for name, digest in sorted(listed.items()):
        if not (root / name).is_file():
            failures.append(f"{name}: listed in SHA256SUMS but missing")
        elif sha256_file(root / name) != digest:
            failures.append(f"{name}: sha256 differs from SHA256SUMS")
    for name in files:
        if name != "SHA256SUMS" and name not in listed:
            failures.append(f"{name}: present but not listed in SHA256SUMS")
    return failures


def check_manifest(root: Path, files: list[str]) -> list[str]:
    if not (root / "manifest.json").exists():
        return ["manifest.json: missing"]
    try:
        manifest: dict[str, Any] = read_json(root / "manifest.json")
        entries = {e["path"]: e for e in manifest["files"]}
    except (ServelabError, KeyError, TypeError) as exc:
        return [f"manifest.json: unreadable ({exc})"]
    failures = []
    for path, e in sorted(entries.items()):
        p = root / path
        if not p.is_file():
            failures.append(f"{path}: in manifest.json but missing")
            continue
        if p.stat().st_size != e.get("bytes"):
            failures.append(f"{path}: size differs from manifest.json")
        elif sha256_file(p) != e.get("sha256"):
            failures.append(f"{path}: sha256 differs from manifest.json")
    for path in files:
        if path not in entries and path not in ("manifest.json", "SHA256SUMS"):
            failures.append(f"{path}: present but not in manifest.json")
    return failures


def rebuild(root: Path) -> list[str]:
    """Re-run the analysis from raw/ and server/ and compare tables, figures and report bytes."""
    from servelab.analysis.pipeline import ANALYSIS_VERSION, analysis_section, analyze

    pipeline = read_json(root / "provenance.json").get("pipeline", {})
    made_by = int(pipeline.get("analysis_version") or 1)
    if made_by != ANALYSIS_VERSION:
        commit = pipeline.get("git_commit") or "the commit in provenance.json"
        return [
            f"tables, figures, report.md: made by analysis version {made_by}, this servelab "
            f"has version {ANALYSIS_VERSION}; a byte-for-byte rebuild needs servelab at "
            f"{commit} (verify without --rebuild checks every byte against the checksums)"
        ]
    cfg = yaml.safe_load((root / "config.resolved.yaml").read_text(encoding="utf-8"))
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "analysis"
        analysis = analysis_section(cfg.get("analysis"))
        analyze(root, out, analysis, figures=analysis.figures)
        for rel in walk_files(out):
            theirs = root / bundle_path(rel)
            if not theirs.exists():
                failures.append(f"{theirs.relative_to(root)}: rebuilt but absent from the bundle")
            elif theirs.read_bytes() != (out / rel).read_bytes():
                failures.append(f"{theirs.relative_to(root)}: differs when rebuilt from raw data")
    return failures


@dataclass(frozen=True)
class Verification:
    """What verify checked: every failure, one line each naming the file; and for a
    confirmation's bundle, the diagnosing bundle it checked (None when none was found) with
    its failures among them and the manifest.json sha256 the confirmation recorded."""

    failures: list[str]
    diagnosing: Path | None = None
    diagnosing_failures: list[str] = field(default_factory=list)
    manifest_sha256: str | None = None


def verify(path: Path, do_rebuild: bool = False, diagnosing: Path | None = None) -> list[str]:
    """All failures, one line each naming the file; empty when the bundle holds (and, for a
    confirmation's, the diagnosing bundle too: see `verification`)."""
    return verification(path, do_rebuild, diagnosing).failures


def verification(
    path: Path, do_rebuild: bool = False, diagnosing: Path | None = None
) -> Verification:
    """Check the bundle folder or release tarball `path`. A confirmation's bundle (provenance
    `confirms`) holds only with its diagnosing bundle: `diagnosing`, or else the bundle of
    `confirms.experiment` beside it in the same results folder (a tarball has none beside
    it); that bundle's manifest.json must be the one the confirmation recorded, and it must
    verify itself (`do_rebuild` too)."""
    with tempfile.TemporaryDirectory() as tmp:
        root = open_bundle(path, Path(tmp) / "bundle")
        failures = _check(root, do_rebuild)
        confirms = _confirms_of(root)
        if confirms is None:
            if diagnosing is not None:
                raise ServelabError(
                    f"{path}: not a confirmation's bundle (provenance.json has no confirms); "
                    "pass --diagnosing only with one"
                )
            return Verification(failures)
        recorded = str(confirms.get("manifest_sha256"))
        where = diagnosing if diagnosing is not None else _beside(path, confirms)
        if where is None:
            theirs = [
                f"{path}: a confirmation's tarball has no diagnosing bundle beside it; pass "
                f"--diagnosing DIR (the bundle of {confirms.get('experiment')})"
            ]
        else:
            theirs = _check_diagnosing(where, recorded, Path(tmp) / "diagnosing", do_rebuild)
        return Verification(failures + theirs, where, theirs, recorded)


def _check(root: Path, do_rebuild: bool) -> list[str]:
    """The failures of the bundle folder `root` on its own."""
    files = walk_files(root)
    failures = check_sums(root, files) + check_manifest(root, files)
    failures += check_all_json(root, [f for f in files if f != "SHA256SUMS"])
    if do_rebuild and not failures:
        failures += rebuild(root)
    return failures


def _confirms_of(root: Path) -> dict[str, Any] | None:
    """provenance.json's `confirms`: None for any bundle but a confirmation's, and when
    provenance.json is unreadable (the checks name it then)."""
    try:
        confirms = read_json(root / "provenance.json").get("confirms")
    except (ServelabError, AttributeError):
        return None
    return confirms if isinstance(confirms, dict) else None


def _beside(path: Path, confirms: dict[str, Any]) -> Path | None:
    """Where the diagnosing bundle of the confirmation bundle folder `path` lives: both
    experiments' folders are in one results folder, so <path>/../../<experiment>/bundle
    (None for a tarball, which has nothing beside it)."""
    if not path.is_dir():
        return None
    return Path(os.path.normpath(path / ".." / ".." / str(confirms.get("experiment")) / "bundle"))


def _check_diagnosing(where: Path, recorded: str, workdir: Path, do_rebuild: bool) -> list[str]:
    """The failures of the diagnosing bundle `where` (a folder or a tarball): not there, not
    the one the confirmation recorded (its manifest.json sha256 differs: the one line, since
    checking another bundle says nothing of the diagnosis), or its own, prefixed with its
    path."""
    if not where.exists():
        return [
            f"{where}: the diagnosing bundle of this confirmation is not there; "
            "pass --diagnosing DIR"
        ]
    root = open_bundle(where, workdir)
    manifest = root / "manifest.json"
    if not manifest.is_file():
        return [f"{where}/manifest.json: missing; the diagnosing bundle cannot be identified"]
    digest = sha256_file(manifest)
    if digest != recorded:
        return [
            f"{where}/manifest.json: sha256 {digest[:12]}... is not the {recorded[:12]}... "
            "this confirmation recorded (provenance.json confirms.manifest_sha256): not the "
            "bundle it was derived from; pass --diagnosing DIR with that one"
        ]
    return [f"{where}: {line}" for line in _check(root, do_rebuild)]
