"""Archives are checked against their manifest before anything is extracted, with memory
bounded whatever their members hold: bombs, members not in the manifest, a manifest that lies
about sizes, and members written before the manifest are refused, naming the member."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest

from servelab.cli import main
from servelab.errors import ServelabError
from servelab.evidence.files import safe_extract
from servelab.evidence.verify import verify

TOP = "quickstart-cpu-v9"
BOMB = 200 << 20  # 200 MB of zeros: about 200 KB compressed


class Zeros(io.RawIOBase):
    """`size` zero bytes, produced a block at a time (never held whole)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return bytes(n)


Member = tuple[str, bytes | int]  # (path below the top folder, content or a count of zeros)


def manifest_of(files: dict[str, int]) -> bytes:
    entries = [{"path": p, "bytes": n, "sha256": "0" * 64} for p, n in sorted(files.items())]
    return json.dumps({"format_version": 1, "experiment": "x", "files": entries}).encode()


def build(path: Path, members: list[Member]) -> Path:
    """A .tar.gz holding `members` in the order given, each under TOP/."""
    with tarfile.open(path, "w:gz", compresslevel=1) as tar:
        for rel, content in members:
            info = tarfile.TarInfo(f"{TOP}/{rel}")
            if isinstance(content, int):
                info.size = content
                tar.addfile(info, Zeros(content))
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return path


def honest(extra: list[Member] | None = None) -> list[Member]:
    """A small consistent archive: manifest.json first, then what it lists."""
    report = b"# report\n"
    sums = f"{hashlib.sha256(report).hexdigest()}  report.md\n".encode()
    return [
        ("SHA256SUMS", sums),
        ("manifest.json", manifest_of({"report.md": len(report)})),
        ("report.md", report),
        *(extra or []),
    ]


def refused(
    archive: Path, target: Path, member: str, call: Callable[[], object] | None = None
) -> str:
    """The one-line refusal of `archive`, which must name `member` and write nothing."""
    with pytest.raises(ServelabError) as exc:
        (call or (lambda: safe_extract(archive, target)))()
    msg = str(exc.value)
    assert f"{TOP}/{member}" in msg and "refused" in msg and "\n" not in msg
    assert not target.exists()
    return msg


@pytest.mark.parametrize("where", ["after", "without"])
def test_a_bomb_is_refused_fast_in_bounded_memory(tmp_path: Path, where: str) -> None:
    """200 MB of zeros under raw/: after a manifest that declares 10 bytes for it, or in an
    archive with no manifest at all."""
    bomb: Member = ("raw/a/rep01/c0001/requests.jsonl.gz", BOMB)
    if where == "after":
        members = [("manifest.json", manifest_of({bomb[0]: 10})), bomb]
    else:
        members = [("config.resolved.yaml", b"a: 1\n"), bomb]
    archive = build(tmp_path / "bomb.tar.gz", members)
    assert archive.stat().st_size < BOMB // 100
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        msg = refused(archive, tmp_path / "out", bomb[0])
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 10, elapsed
    assert peak < 32 << 20, peak  # far below the member's 200 MB
    assert ("manifest.json declares 10" if where == "after" else "before manifest.json") in msg


def test_cli_verify_refuses_a_bomb_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bomb: Member = ("raw/big.bin", BOMB)
    archive = build(tmp_path / "bomb.tar.gz", [("manifest.json", manifest_of({})), bomb])
    assert main(["verify", str(archive)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and f"{TOP}/raw/big.bin" in err and "refused" in err


def test_a_member_not_in_the_manifest_is_refused(tmp_path: Path) -> None:
    root = safe_extract(build(tmp_path / "ok.tar.gz", honest()), tmp_path / "ok")
    assert (root / "report.md").read_bytes() == b"# report\n"
    archive = build(tmp_path / "extra.tar.gz", honest([("raw/extra.bin", b"x" * 100)]))
    msg = refused(archive, tmp_path / "out", "raw/extra.bin")
    assert "not listed in manifest.json" in msg
    refused(archive, tmp_path / "out", "raw/extra.bin", lambda: verify(archive))


def test_a_manifest_that_lies_about_sizes_is_refused(tmp_path: Path) -> None:
    report = b"# a longer report than declared\n"
    archive = build(
        tmp_path / "lies.tar.gz",
        [("manifest.json", manifest_of({"report.md": 3})), ("report.md", report)],
    )
    msg = refused(archive, tmp_path / "out", "report.md")
    assert f"is {len(report)} bytes, manifest.json declares 3" in msg


@pytest.mark.parametrize("kind", ["unlisted", "oversized"])
def test_a_member_written_before_the_manifest_is_checked(tmp_path: Path, kind: str) -> None:
    """Members that precede manifest.json are checked once it is read, before any is written."""
    declared = {"report.md": 9} if kind == "unlisted" else {"figures/a.png": 10, "report.md": 9}
    first: Member = ("figures/a.png", b"p" * 4096)
    archive = build(
        tmp_path / "early.tar.gz",
        [first, ("manifest.json", manifest_of(declared)), ("report.md", b"# report\n")],
    )
    msg = refused(archive, tmp_path / "out", "figures/a.png")
    assert ("not listed" if kind == "unlisted" else "manifest.json declares 10") in msg


def test_an_oversized_sha256sums_is_refused(tmp_path: Path) -> None:
    archive = build(
        tmp_path / "sums.tar.gz",
        [("manifest.json", manifest_of({})), ("SHA256SUMS", b"0" * (200 << 10))],
    )
    assert "a SHA256SUMS may take" in refused(archive, tmp_path / "out", "SHA256SUMS")


def test_an_archive_without_a_manifest_is_refused(tmp_path: Path) -> None:
    archive = build(tmp_path / "nomani.tar.gz", [("report.md", b"# report\n")])
    with pytest.raises(ServelabError, match=r"no quickstart-cpu-v9/manifest\.json"):
        safe_extract(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_release_is_held_to_the_sizes_beside_its_tarball(tmp_path: Path) -> None:
    """A release's tarball (pinned in release.json) is also checked, before extraction,
    against the sizes its release folder's manifest.json declares."""
    from servelab.reproduce.sides import open_side
    from servelab.store.hashing import sha256_file
    from servelab.store.jsonio import write_json

    folder = tmp_path / "v9"
    folder.mkdir()
    tarball = build(folder / "v9.tar.gz", honest())
    write_json(
        folder / "release.json",
        {"tarball": "v9.tar.gz", "tarball_sha256": sha256_file(tarball), "tag": "v9"},
    )
    (folder / "manifest.json").write_bytes(manifest_of({"report.md": 2}))
    msg = refused(
        tarball, tmp_path / "work", "report.md", lambda: open_side(folder, tmp_path / "work")
    )
    assert "the release's manifest.json declares 2" in msg
