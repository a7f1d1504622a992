"""servelab.env.compilecache: one compile-cache folder per runtime, its environment, its mount and
its state before a start."""

from __future__ import annotations

from pathlib import Path

from servelab.env.compilecache import CONTAINER_ROOT, compile_cache_for, runtime_key

VENV = {"kind": "venv", "lock_sha256": "83e22e209e2ceb6945c85627f28fcf98d0763031"}
DOCKER = {
    "kind": "container",
    "image_ref": "vllm/vllm-openai@sha256:" + "6" * 64,
    "image_digest": "sha256:" + "6" * 64,
}


def test_the_folder_is_keyed_by_the_runtime(tmp_path: Path) -> None:
    assert runtime_key(VENV) == "venv-83e22e209e2ceb69"
    assert runtime_key(DOCKER) == "image-6666666666666666"
    sif = {"kind": "container", "image_ref": "/x/a.sif", "image_sha256": "ab" * 32}
    assert runtime_key(sif) == "image-" + ("ab" * 8)
    assert runtime_key({"kind": "venv"}) is None
    assert compile_cache_for({"kind": "venv"}, tmp_path) is None
    a = compile_cache_for(VENV, tmp_path)
    b = compile_cache_for({**VENV, "lock_sha256": "ff" * 32}, tmp_path)
    assert a is not None and b is not None
    assert a.root == tmp_path / "compile" / "venv-83e22e209e2ceb69"
    assert a.root != b.root  # another lock never reuses what this one compiled


def test_environment_and_mount(tmp_path: Path) -> None:
    cc = compile_cache_for(VENV, tmp_path)
    assert cc is not None
    env = cc.env(container=False)
    assert env == {
        "VLLM_CACHE_ROOT": str((cc.root / "vllm").resolve()),
        "TORCHINDUCTOR_CACHE_DIR": str((cc.root / "inductor").resolve()),
    }
    inside = cc.env(container=True)
    assert inside["VLLM_CACHE_ROOT"] == f"{CONTAINER_ROOT}/vllm"
    m = cc.mount()
    assert m.host == str(cc.root.resolve()) and m.container == CONTAINER_ROOT
    assert not m.read_only  # the server writes what it compiles


def test_state_tells_a_cold_cache_from_a_warm_one(tmp_path: Path) -> None:
    cc = compile_cache_for(VENV, tmp_path)
    assert cc is not None
    cc.prepare()
    cold = cc.state()
    assert cold["warm"] is False
    assert cold["vllm"] == {"env": "VLLM_CACHE_ROOT", "files": 0, "bytes": 0}
    (cc.root / "inductor" / "fx").mkdir()
    (cc.root / "inductor" / "fx" / "entry").write_bytes(b"x" * 10)
    warm = cc.state()
    assert warm["warm"] is True
    assert warm["inductor"] == {"env": "TORCHINDUCTOR_CACHE_DIR", "files": 1, "bytes": 10}
    assert warm["key"] == "venv-83e22e209e2ceb69"
