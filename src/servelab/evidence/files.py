"""Hashing, SHA256SUMS and deterministic, safe tarballs."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

from servelab.errors import ServelabError
from servelab.hashing import sha256_file


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


def safe_extract(archive: Path, dest: Path) -> Path:
    """Extract a release tarball, refusing absolute paths, '..', links and device files.

    Every member is checked before anything is written; returns the single top folder."""
    try:
        tar = tarfile.open(archive, "r:gz")
    except (tarfile.TarError, OSError) as exc:
        raise ServelabError(f"{archive}: not a readable .tar.gz ({exc})") from None
    with tar:
        members = tar.getmembers()
        tops = set()
        for m in members:
            name = m.name
            parts = PurePosixPath(name).parts
            if name.startswith("/") or PurePosixPath(name).is_absolute() or ".." in parts:
                raise ServelabError(
                    f"{archive}: member {name!r} would write outside the target; refused"
                )
            if m.issym() or m.islnk():
                raise ServelabError(f"{archive}: member {name!r} is a link; refused")
            if not (m.isfile() or m.isdir()):
                raise ServelabError(f"{archive}: member {name!r} is not a regular file; refused")
            if parts:
                tops.add(parts[0])
        if len(tops) != 1:
            raise ServelabError(f"{archive}: expected one top-level folder, found {sorted(tops)}")
        dest.mkdir(parents=True, exist_ok=True)
        root = dest.resolve()
        for m in members:
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
                fh.write(src.read())
            os.chmod(target, stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)
    return dest / next(iter(tops))
