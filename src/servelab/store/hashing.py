"""Content hashes: of files (sha256, git's blob id) and the check of a pinned digest."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from servelab.errors import ServelabError

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def pinned_bytes(path: Path, sha256: str) -> bytes | None:
    """The bytes of `path` where it is a file whose sha256 is `sha256`; None otherwise (a
    hashed lock found again by its digest)."""
    if not path.is_file():
        return None
    data = path.read_bytes()
    return data if hashlib.sha256(data).hexdigest() == sha256 else None


def git_blob_sha1(path: Path) -> str:
    """The id git (and the hub) gives a file's content: sha1 of "blob <size>\\0" + content."""
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def check_pinned(path: Path, pinned: object, mismatch: Callable[[str], str]) -> str:
    """The sha256 of `path` when it equals `pinned`; otherwise a ServelabError whose message
    is `mismatch(actual digest)`."""
    digest = sha256_file(path)
    if digest != pinned:
        raise ServelabError(mismatch(digest))
    return digest
