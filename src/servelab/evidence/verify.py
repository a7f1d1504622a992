"""`servelab verify`: checksums, manifest completeness, schemas, and (--rebuild) byte-identical
tables and figures re-rendered from the raw data; a release folder's tarball, the bundle inside
it and the copies beside it; a confirmation's bundle together with the diagnosing bundle it
records."""

from __future__ import annotations

import filecmp
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from servelab.documents import JsonObject
from servelab.documents.declared import ConfirmsFacts, Manifest, Provenance
from servelab.errors import ServelabError
from servelab.evidence.bundle import bundle_path
from servelab.evidence.files import release_sizes, safe_extract, walk_files
from servelab.evidence.schemas import check_all_json
from servelab.store.hashing import sha256_file
from servelab.store.jsonio import read_json

RELEASE_FILE = "release.json"
# What a release folder holds beside release.json, its tarball and the tarball's .sha256: copies
# of these files of the bundle, and of every file under these folders of it.
RELEASE_COPIES = ("manifest.json", "provenance.json", "report.md", "SHA256SUMS")
RELEASE_COPY_FOLDERS = ("tables", "figures")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def is_release_folder(path: Path) -> bool:
    """Whether `path` is a release folder (evidence/<experiment>/<tag>/, as `servelab release`
    writes it): a folder with release.json."""
    return path.is_dir() and (path / RELEASE_FILE).exists()


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
        manifest: Manifest = read_json(root / "manifest.json")
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
    """What verify checked: every failure, one line each naming the file; for a confirmation's
    bundle, the diagnosing bundle it checked (None when none was found) with its failures among
    them and the manifest.json sha256 the confirmation recorded; for a release folder, its
    release.json and how many files beside the tarball were found identical to the tarball's."""

    failures: list[str]
    diagnosing: Path | None = None
    diagnosing_failures: list[str] = field(default_factory=list)
    manifest_sha256: str | None = None
    release: JsonObject | None = None
    copies: int = 0


def verify(path: Path, do_rebuild: bool = False, diagnosing: Path | None = None) -> list[str]:
    """All failures, one line each naming the file; empty when the bundle or release holds
    (and, for a confirmation's, the diagnosing bundle too: see `verification`)."""
    return verification(path, do_rebuild, diagnosing).failures


def verification(
    path: Path, do_rebuild: bool = False, diagnosing: Path | None = None
) -> Verification:
    """Check the bundle folder, release tarball or release folder `path` (a release folder:
    `check_release_folder`). A confirmation's bundle (provenance `confirms`) holds only with
    its diagnosing bundle: `diagnosing`, or else the bundle of `confirms.experiment` beside it
    in the same results folder (a tarball or a release folder has none beside it); that
    bundle's manifest.json must be the one the confirmation recorded, and it must verify itself
    (`do_rebuild` too)."""
    with tempfile.TemporaryDirectory() as tmp:
        root, failures, release = _open_checked(path, Path(tmp) / "bundle", do_rebuild)
        rel, copies = (release.release, release.copies) if release else (None, 0)
        confirms = _confirms_of(root) if root is not None else None
        if confirms is None:
            if diagnosing is not None and root is not None:
                raise ServelabError(
                    f"{path}: not a confirmation's bundle (provenance.json has no confirms); "
                    "pass --diagnosing only with one"
                )
            return Verification(failures, release=rel, copies=copies)
        recorded = str(confirms.get("manifest_sha256"))
        where = diagnosing if diagnosing is not None else _beside(path, confirms)
        if where is None:
            kind = "release" if release else "tarball"
            theirs = [
                f"{path}: a confirmation's {kind} has no diagnosing bundle beside it; pass "
                f"--diagnosing DIR (the bundle of {confirms.get('experiment')})"
            ]
        else:
            theirs = _check_diagnosing(where, recorded, Path(tmp) / "diagnosing", do_rebuild)
        return Verification(failures + theirs, where, theirs, recorded, rel, copies)


@dataclass(frozen=True)
class ReleaseFolder:
    """A release folder checked: its release.json ({} when unreadable), the bundle extracted
    from its tarball (None when the tarball was not opened: missing, or not the one release.json
    records), how many files beside the tarball are identical to the tarball's, and every
    failure, one line each naming the file."""

    folder: Path
    release: JsonObject
    root: Path | None
    copies: int
    failures: list[str]


def check_release_folder(path: Path, workdir: Path, do_rebuild: bool = False) -> ReleaseFolder:
    """Check the release folder `path`: release.json names a tarball in the folder whose sha256
    it records; only then is the tarball extracted (into `workdir`, bounded by the sizes the
    manifest.json beside it declares) and the bundle inside checked as a bundle folder is
    (`do_rebuild` too; its failures prefixed with the tarball's path); the tarball's .sha256
    names it with the same digest; every other file in the folder is identical to the
    tarball's at the same path, and the copies `servelab release` writes are all there;
    release.json's experiment and tag are the bundle's and the tarball's. A tarball that cannot
    be extracted safely raises ServelabError, as for a tarball given on its own."""
    rel, name, failures = _read_release(path)
    if name is None:
        return ReleaseFolder(path, rel, None, 0, failures)
    tarball = path / name
    if not tarball.is_file():
        return ReleaseFolder(
            path, rel, None, 0, [f"{tarball}: missing; release.json names it as the tarball"]
        )
    digest = sha256_file(tarball)
    recorded = str(rel.get("tarball_sha256"))
    root = None
    if digest != recorded:
        failures.append(
            f"{tarball}: sha256 {digest[:12]}... differs from release.json ({recorded[:12]}... "
            "in tarball_sha256): the release was altered; fetch it again"
        )
    else:
        root = safe_extract(tarball, workdir, _declared_beside(path))
        failures += [f"{tarball}: {line}" for line in _check(root, do_rebuild)]
    failures += _check_digest_file(path / f"{name}.sha256", name, digest)
    if root is None:
        return ReleaseFolder(path, rel, None, 0, failures)
    copy_failures, copies = _check_copies(path, name, root)
    failures += copy_failures + _check_names(path, rel, name, root)
    return ReleaseFolder(path, rel, root, copies, failures)


def _read_release(path: Path) -> tuple[JsonObject, str | None, list[str]]:
    """release.json and the tarball it names (a file name in the folder), or a failure."""
    file = path / RELEASE_FILE
    try:
        rel = read_json(file)
    except ServelabError as exc:
        return {}, None, [str(exc)]
    except OSError as exc:
        return {}, None, [f"{file}: unreadable ({exc.strerror})"]
    if not isinstance(rel, dict):
        return {}, None, [f"{file}: not a JSON object; it holds the release's tag and tarball"]
    name = rel.get("tarball")
    if not isinstance(name, str) or "/" in name or not name.endswith(".tar.gz"):
        return (
            rel,
            None,
            [f"{file}: tarball {name!r} is not the file name of a .tar.gz in the release folder"],
        )
    return rel, name, []


def _declared_beside(path: Path) -> dict[str, int] | None:
    """The sizes the manifest.json beside the tarball declares, bounding what is extracted;
    None when there is none or it cannot be read (the copy check then names it)."""
    try:
        return release_sizes(path / "manifest.json")
    except ServelabError:
        return None


def _check_digest_file(file: Path, name: str, digest: str) -> list[str]:
    """The tarball's .sha256: one line `<sha256>  <tarball>` with the tarball's digest."""
    if not file.is_file():
        return [f"{file}: missing; it holds the tarball's sha256 as `<sha256>  {name}`"]
    lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
    hexd, sep, named = lines[0].partition("  ") if len(lines) == 1 else ("", "", "")
    if not sep or not _HEX64.match(hexd):
        return [f"{file}: not one line `<sha256>  {name}`"]
    if named != name:
        return [f"{file}: names {named!r}, not the tarball {name}"]
    if hexd != digest:
        return [
            f"{file}: sha256 {hexd[:12]}... differs from {name}'s ({digest[:12]}...): the "
            "release was altered; fetch it again"
        ]
    return []


def _check_copies(path: Path, name: str, root: Path) -> tuple[list[str], int]:
    """Every file of the folder but release.json, the tarball and its .sha256 is the
    tarball's at the same path, byte for byte; the copies a release holds are all there.
    Returns the failures and the number of identical copies."""
    try:
        present = walk_files(path)
    except ServelabError as exc:
        return [str(exc)], 0
    own = {RELEASE_FILE, name, f"{name}.sha256"}
    inside = set(walk_files(root))
    failures = []
    copies = 0
    for rel in present:
        if rel in own:
            continue
        if rel not in inside:
            failures.append(
                f"{path / rel}: not in {name}; a release folder holds only copies of its "
                "tarball's files"
            )
        elif not filecmp.cmp(path / rel, root / rel, shallow=False):
            failures.append(f"{path / rel}: differs from the copy inside {name}")
        else:
            copies += 1
    expected = {f for f in inside if f in RELEASE_COPIES or f.split("/")[0] in RELEASE_COPY_FOLDERS}
    for rel in sorted(expected - set(present)):
        failures.append(f"{path / rel}: missing; a release folder holds a copy of {name}'s {rel}")
    return failures, copies


def _check_names(path: Path, rel: JsonObject, name: str, root: Path) -> list[str]:
    """release.json's experiment is the bundle's (provenance.json), its tag the tarball's."""
    failures = []
    try:
        experiment = read_json(root / "provenance.json").get("experiment")
    except (ServelabError, AttributeError):
        experiment = None  # unreadable: the bundle's own checks name it
    if experiment is not None and rel.get("experiment") != experiment:
        failures.append(
            f"{path / RELEASE_FILE}: experiment {rel.get('experiment')!r} is not the bundle's "
            f"({experiment!r} in provenance.json)"
        )
    if f"{rel.get('tag')}.tar.gz" != name:
        failures.append(
            f"{path / RELEASE_FILE}: tag {rel.get('tag')!r} does not name the tarball {name}"
        )
    return failures


def _open_checked(
    path: Path, workdir: Path, do_rebuild: bool
) -> tuple[Path | None, list[str], ReleaseFolder | None]:
    """The bundle of `path` (a bundle folder, a tarball extracted into workdir, or a release
    folder's tarball; None when a release's could not be opened) and its failures, with the
    release folder's check when it is one."""
    if is_release_folder(path):
        release = check_release_folder(path, workdir, do_rebuild)
        return release.root, release.failures, release
    root = open_bundle(path, workdir)
    return root, _check(root, do_rebuild), None


def _check(root: Path, do_rebuild: bool) -> list[str]:
    """The failures of the bundle folder `root` on its own."""
    files = walk_files(root)
    failures = check_sums(root, files) + check_manifest(root, files)
    failures += check_all_json(root, [f for f in files if f != "SHA256SUMS"])
    if do_rebuild and not failures:
        failures += rebuild(root)
    return failures


def _confirms_of(root: Path) -> ConfirmsFacts | None:
    """provenance.json's `confirms`: None for any bundle but a confirmation's, and when
    provenance.json is unreadable (the checks name it then)."""
    try:
        provenance: Provenance = read_json(root / "provenance.json")
        confirms = provenance.get("confirms")
    except (ServelabError, AttributeError):
        return None
    return confirms if isinstance(confirms, dict) else None


def _beside(path: Path, confirms: ConfirmsFacts) -> Path | None:
    """Where the diagnosing bundle of the confirmation bundle folder `path` lives: both
    experiments' folders are in one results folder, so <path>/../../<experiment>/bundle
    (None for a tarball or a release folder, which have nothing beside them)."""
    if not path.is_dir() or is_release_folder(path):
        return None
    return Path(os.path.normpath(path / ".." / ".." / str(confirms.get("experiment")) / "bundle"))


def _check_diagnosing(where: Path, recorded: str, workdir: Path, do_rebuild: bool) -> list[str]:
    """The failures of the diagnosing bundle `where` (a folder, a tarball or a release folder):
    not there, not the one the confirmation recorded (its manifest.json sha256 differs: the one
    line, since checking another bundle says nothing of the diagnosis), or its own, prefixed
    with its path (a release folder's name their files in full)."""
    if not where.exists():
        return [
            f"{where}: the diagnosing bundle of this confirmation is not there; "
            "pass --diagnosing DIR"
        ]
    release = check_release_folder(where, workdir, do_rebuild) if is_release_folder(where) else None
    if release is not None and release.root is None:
        return release.failures
    root = release.root if release is not None and release.root else open_bundle(where, workdir)
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
    if release is not None:
        return release.failures
    return [f"{where}: {line}" for line in _check(root, do_rebuild)]
