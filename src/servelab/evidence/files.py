"""Hashing, SHA256SUMS and deterministic, safe tarballs."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
import zlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path, PurePosixPath

from servelab.errors import ServelabError
from servelab.store.hashing import sha256_file


def walk_files(root: Path) -> list[str]:
    """Every regular file under root as a sorted relative POSIX path; links are refused."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in filenames:
            p = Path(dirpath) / name
            if p.is_symlink():
                raise ServelabError(f"{p}: symbolic links are not allowed in a bundle")
            out.append(p.relative_to(root).as_posix())
    return sorted(out)


def sha256sums_text(root: Path, paths: Iterable[str]) -> str:
    return "".join(f"{sha256_file(root / p)}  {p}\n" for p in sorted(paths))


def write_deterministic_tar(src: Path, dest: Path, prefix: str) -> str:
    """tar.gz of src with sorted entries, zero mtime/uid/gid, no owner names, gzip mtime 0.
    Returns the sha256 of the archive."""
    buf = io.BytesIO()
    files = walk_files(src)
    dirs = {str(a) for f in files for a in PurePosixPath(f).parents} - {"."}
    entries = sorted([(d, True) for d in dirs] + [(f, False) for f in files])
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, is_dir in entries:  # sorted: a folder comes before what it holds
            info = tarfile.TarInfo(f"{prefix}/{rel}")
            if is_dir:
                info.type = tarfile.DIRTYPE
                _normalize(info, 0o755)
                tar.addfile(info)
                continue
            data = (src / rel).read_bytes()
            info.size = len(data)
            _normalize(info, 0o644)
            tar.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as gz:
        gz.write(raw)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(out.getvalue())
    return hashlib.sha256(out.getvalue()).hexdigest()


def _normalize(info: tarfile.TarInfo, mode: int) -> None:
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = mode


# What an archive may hold beyond what its manifest declares, and the bounds on what is read
# before the manifest is known.
MANIFEST_MAX_BYTES = 16 << 20  # manifest.json itself is read into memory: bound it
SMALL_ALLOWANCE = 64 << 10  # SHA256SUMS may take the manifest's own size plus this much
PRE_MANIFEST_MIN = 64 << 20  # members before manifest.json: at most max(this, ...
PRE_MANIFEST_RATIO = 16  # ... this many times the archive's compressed size) in all
_UNLISTED = ("manifest.json", "SHA256SUMS")
_COPY_CHUNK = 1 << 20


def _check_header(archive: Path, m: tarfile.TarInfo) -> tuple[str, ...]:
    """A member's path parts when it may be written at all (a relative path inside the
    target, a regular file or a folder); refused otherwise."""
    name = m.name
    parts = PurePosixPath(name).parts
    if name.startswith("/") or PurePosixPath(name).is_absolute() or ".." in parts:
        raise ServelabError(f"{archive}: member {name!r} would write outside the target; refused")
    if m.issym() or m.islnk():
        raise ServelabError(f"{archive}: member {name!r} is a link; refused")
    if not (m.isfile() or m.isdir()):
        raise ServelabError(f"{archive}: member {name!r} is not a regular file; refused")
    return parts


def _declared_sizes(data: bytes) -> dict[str, int]:
    """path -> bytes of each file a manifest lists (ValueError, KeyError or TypeError when it
    is not a manifest)."""
    files = json.loads(data)["files"]
    return {str(e["path"]): int(e["bytes"]) for e in files}


def release_sizes(manifest: Path) -> dict[str, int]:
    """The sizes a release folder's manifest.json declares, read with its size bounded."""
    try:
        with open(manifest, "rb") as fh:
            data = fh.read(MANIFEST_MAX_BYTES + 1)
        if len(data) > MANIFEST_MAX_BYTES:
            raise ServelabError(
                f"{manifest}: over the {MANIFEST_MAX_BYTES} bytes a manifest may take"
            )
        return _declared_sizes(data)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ServelabError(f"{manifest}: not a readable manifest ({exc})") from None


class _Plan:
    """Pass one over the member headers: what each file member declares, checked against
    manifest.json (read when its header is reached) and the archive's size limits."""

    def __init__(self, archive: Path, release: dict[str, int] | None) -> None:
        self.archive = archive
        self.release = release
        self.top: str | None = None
        self.sizes: dict[str, int] = {}  # file member (relative to the top folder) -> bytes
        self.order: list[tuple[str, int]] = []  # (member name, size) of every member
        self.files: list[tuple[str, str, int]] = []  # (member name, path, size) of each file
        self.declared_total = 0
        self.small = 0
        self.declared: dict[str, int] | None = None
        self.limit = 0
        self.total = 0
        self.pre_limit = max(PRE_MANIFEST_MIN, PRE_MANIFEST_RATIO * archive.stat().st_size)

    def refuse(self, name: str, why: str) -> ServelabError:
        return ServelabError(f"{self.archive}: member {name!r} {why}; refused")

    def header(self, m: tarfile.TarInfo) -> str | None:
        """Check one header; the member's path below the top folder when it is a file."""
        parts = _check_header(self.archive, m)
        self.order.append((m.name, m.size if m.isfile() else 0))
        if not parts:
            return None
        if self.top is None:
            self.top = parts[0]
        elif parts[0] != self.top:
            raise ServelabError(
                f"{self.archive}: expected one top-level folder, found "
                f"{sorted({self.top, parts[0]})}"
            )
        if m.isdir():
            return None
        rel = PurePosixPath(*parts[1:]).as_posix() if len(parts) > 1 else ""
        if rel in self.sizes:
            raise self.refuse(m.name, "appears twice")
        self.sizes[rel] = m.size
        self.files.append((m.name, rel, m.size))
        self.total += m.size
        if rel == "manifest.json" and m.size > MANIFEST_MAX_BYTES:
            raise self.refuse(
                m.name, f"is {m.size} bytes, over the {MANIFEST_MAX_BYTES} a manifest may take"
            )
        if self.declared is None:
            if rel != "manifest.json" and self.total > self.pre_limit:
                raise self.refuse(
                    m.name,
                    f"comes before manifest.json and takes what precedes it past "
                    f"{self.pre_limit} bytes",
                )
        else:
            self.check(m.name, rel, m.size)
        return rel

    def manifest(self, name: str, data: bytes) -> None:
        """manifest.json's bytes: what every file member may be, and the overall limit; the
        members already seen are checked against it."""
        try:
            declared = _declared_sizes(data)
        except (ValueError, KeyError, TypeError) as exc:
            raise self.refuse(name, f"is not a readable manifest ({exc})") from None
        self.declared = declared
        self.declared_total = sum(declared.values())
        self.small = len(data) + SMALL_ALLOWANCE
        self.limit = self.declared_total + len(data) + self.small
        self.total = 0
        for full, rel, size in self.files:
            self.total += size
            self.check(full, rel, size)

    def check(self, name: str, rel: str, size: int) -> None:
        assert self.declared is not None
        if rel == "SHA256SUMS":
            if size > self.small:
                raise self.refuse(
                    name, f"is {size} bytes, over the {self.small} a SHA256SUMS may take"
                )
        elif rel != "manifest.json":
            if rel not in self.declared:
                raise self.refuse(name, "is not listed in manifest.json")
            if size > self.declared[rel]:
                raise self.refuse(
                    name, f"is {size} bytes, manifest.json declares {self.declared[rel]}"
                )
            if self.release is not None and size > self.release.get(rel, -1):
                raise self.refuse(
                    name,
                    f"is {size} bytes, the release's manifest.json declares "
                    f"{self.release.get(rel, 'nothing')}",
                )
        if self.total > self.limit:
            raise self.refuse(
                name,
                f"takes the archive past {self.limit} bytes (manifest.json declares "
                f"{self.declared_total}, plus {self.limit - self.declared_total} allowed for "
                "manifest.json and SHA256SUMS)",
            )


@contextmanager
def _open_stream(archive: Path) -> Iterator[tarfile.TarFile]:
    """The archive as a tar stream read front to back. gzip's reader inflates at most what
    each read asks for, so a block of zeros never expands whole into memory."""
    try:
        gz = gzip.open(archive, "rb")
        tar = tarfile.open(fileobj=gz, mode="r|")
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise ServelabError(f"{archive}: not a readable .tar.gz ({exc})") from None
    with gz, tar:
        yield tar


def _plan(archive: Path, release: dict[str, int] | None) -> _Plan:
    """Pass one: every header checked, manifest.json read (bounded), no member data kept."""
    plan = _Plan(archive, release)
    try:
        with _open_stream(archive) as tar:
            for m in tar:
                rel = plan.header(m)
                if rel == "manifest.json":
                    src = tar.extractfile(m)
                    assert src is not None
                    plan.manifest(m.name, src.read(MANIFEST_MAX_BYTES + 1))
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise ServelabError(f"{archive}: not a readable .tar.gz ({exc})") from None
    if plan.top is None:
        raise ServelabError(f"{archive}: expected one top-level folder, found []")
    if plan.declared is None:
        raise ServelabError(f"{archive}: no {plan.top}/manifest.json in the archive; refused")
    return plan


def safe_extract(archive: Path, dest: Path, release: dict[str, int] | None = None) -> Path:
    """Extract a release tarball in two streaming passes, memory bounded whatever the members
    hold. Pass one reads the headers only: absolute paths, '..', links and device files are
    refused, and so is a file member not listed in manifest.json, larger than it declares, or
    taking the archive past what the manifest declares in all (plus a small allowance for
    manifest.json and SHA256SUMS). Nothing is written before pass one is through. Pass two
    copies each member in chunks, never past its checked size. `release`: the sizes a release
    folder declares beside its tarball (`release_sizes`), which no member may exceed either.
    Returns the top folder."""
    plan = _plan(archive, release)
    assert plan.top is not None
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    expected = iter(plan.order)
    try:
        with _open_stream(archive) as tar:
            for m in tar:
                if next(expected, None) != (m.name, m.size if m.isfile() else 0):
                    raise ServelabError(f"{archive}: changed while it was read; refused")
                _check_header(archive, m)
                target = (dest / m.name).resolve()
                if root not in target.parents and target != root:
                    raise ServelabError(f"{archive}: member {m.name!r} escapes the target; refused")
                if m.isdir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(m)
                assert src is not None
                with open(target, "wb") as fh:
                    left = m.size
                    while left > 0:
                        block = src.read(min(_COPY_CHUNK, left))
                        if not block:
                            break
                        fh.write(block)
                        left -= len(block)
                os.chmod(target, stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise ServelabError(f"{archive}: not a readable .tar.gz ({exc})") from None
    return dest / plan.top
