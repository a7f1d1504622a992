"""Model source hf, offline: huggingface_hub's own snapshot_download against a local server that
replays a recorded repository listing (tests/fake_hf_hub.py), and a recorded file list in
process. No request leaves the machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fake_hf_hub import COMMIT, FIXTURE, REPO, FakeHub, recorded_tree

from servelab import config
from servelab.env.model import (
    HfHub,
    HubFile,
    build_model,
    model_dir,
    select_files,
    tree_digest,
)
from servelab.errors import ServelabError
from servelab.experiment import ModelSection


def hf_cfg(**over: object) -> ModelSection:
    raw = {"source": "hf", "repo": REPO, "revision": COMMIT, **over}
    return config.validate({**minimal_hf(), "model": raw}).model


class RecordedHub:
    """The recorded listing; downloads copy the fixture's files (or the given bytes)."""

    def __init__(self, files: dict[str, bytes] | None = None) -> None:
        self.files = files or {p.name: p.read_bytes() for p in (FIXTURE / "repo").iterdir()}
        self.calls: list[str] = []

    def list_files(self, repo: str, revision: str) -> list[HubFile]:
        self.calls.append("list")
        return [
            HubFile(e["path"], e["size"], e["oid"], e.get("lfs", {}).get("oid"))
            for e in recorded_tree()
        ]

    def download(
        self, repo: str, revision: str, local_dir: Path, allow_patterns: list[str] | None
    ) -> None:
        self.calls.append("download")
        listed = [HubFile(e["path"], None, None, None) for e in recorded_tree()]
        for f in select_files(listed, allow_patterns):
            (local_dir / f.path).write_bytes(self.files[f.path])


class NoHub:
    def list_files(self, repo: str, revision: str) -> list[HubFile]:
        raise AssertionError("the hub was asked although the files are on disk")

    def download(self, *a: object) -> None:
        raise AssertionError("the hub was asked although the files are on disk")


def test_snapshot_download_against_recorded_hub_writes_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = "hf_servelabTESTtoken0123456789"
    monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    said: list[str] = []
    with FakeHub() as hub:
        rec = build_model(
            hf_cfg(),
            tmp_path / "exp" / "model",
            tmp_path / "cache",
            HfHub.from_env(endpoint=hub.url),
            say=said.append,
        )
    folder = tmp_path / "cache" / "models" / "servelab-test--tiny-hf" / COMMIT
    assert rec["source"] == "hf" and rec["repo"] == REPO and rec["revision"] == COMMIT
    assert rec["path"] == str(folder.resolve())
    assert model_dir(tmp_path / "exp" / "model" / "servelab-model.json") == folder.resolve()
    tree = recorded_tree()
    assert sorted(rec["files"]) == sorted(e["path"] for e in tree)
    lfs = next(e for e in tree if "lfs" in e)
    assert rec["files"][lfs["path"]] == lfs["lfs"]["oid"]
    assert rec["checked"] == {"lfs_sha256": 1, "git_blob_sha1": len(tree) - 1}
    assert rec["tree_sha256"] == tree_digest(rec["files"])
    on_disk = json.loads((tmp_path / "exp" / "model" / "servelab-model.json").read_text())
    assert on_disk == rec == json.loads((folder / "servelab-model.json").read_text())
    # the token went to the hub, from HF_TOKEN, and nowhere else
    assert hub.auth and set(hub.auth) == {f"Bearer {token}"}
    assert not any(token in s for s in said)
    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert leaks == []


def test_token_only_from_hf_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A token file from `hf auth login` is not used: HF_TOKEN or no token."""
    home = tmp_path / "hf-home"
    home.mkdir()
    (home / "token").write_text("hf_fromTHEtokenFILE000000000")
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with FakeHub() as hub:
        build_model(hf_cfg(), tmp_path / "m", tmp_path / "cache", HfHub.from_env(hub.url), say=str)
    assert hub.auth and set(hub.auth) == {None}


def test_corrupted_download_is_refused(tmp_path: Path) -> None:
    files = {p.name: p.read_bytes() for p in (FIXTURE / "repo").iterdir()}
    files["model.safetensors"] = b"\0" * len(files["model.safetensors"])
    with pytest.raises(ServelabError) as err:
        build_model(hf_cfg(), tmp_path / "m", tmp_path / "c", RecordedHub(files), say=str)
    msg = str(err.value)
    assert "model.safetensors" in msg and "differs from the hub's LFS sha256" in msg
    assert "delete" in msg and "\n" not in msg
    files = {p.name: p.read_bytes() for p in (FIXTURE / "repo").iterdir()}
    files["config.json"] = b"{}\n" + files["config.json"][3:]
    with pytest.raises(ServelabError, match="config.json: git blob sha1 .* differs"):
        build_model(hf_cfg(), tmp_path / "m2", tmp_path / "c2", RecordedHub(files), say=str)


def test_reuse_without_the_hub_and_files_outside_the_commit(tmp_path: Path) -> None:
    hub = RecordedHub()
    first = build_model(hf_cfg(), tmp_path / "a", tmp_path / "c", hub, say=str)
    assert hub.calls == ["list", "download"]
    said: list[str] = []
    again = build_model(hf_cfg(), tmp_path / "b", tmp_path / "c", NoHub(), say=said.append)
    assert again == first and "reusing" in said[0]
    # a file the commit does not list would be loaded by vLLM: refused
    folder = Path(first["path"])
    (folder / "extra.safetensors").write_bytes(b"x")
    with pytest.raises(ServelabError, match="does not list .*extra.safetensors"):
        build_model(hf_cfg(), tmp_path / "d", tmp_path / "c", RecordedHub(), say=str)


def test_allow_patterns_and_local_dir(tmp_path: Path) -> None:
    cfg = hf_cfg(allow_patterns=["*.json"], local_dir=str(tmp_path / "mine"))
    rec = build_model(cfg, tmp_path / "m", None, RecordedHub(), say=str)
    assert sorted(rec["files"]) == ["config.json", "tokenizer_config.json"]
    assert rec["path"] == str((tmp_path / "mine").resolve()) and rec["allow_patterns"] == ["*.json"]
    with pytest.raises(ServelabError, match="model.allow_patterns: .* matches no file"):
        build_model(hf_cfg(allow_patterns=["*.bin"]), tmp_path / "n", tmp_path, RecordedHub())


def test_revision_unknown_to_the_hub_is_one_line(tmp_path: Path) -> None:
    other = "f" * 40
    with FakeHub() as hub, pytest.raises(ServelabError) as err:
        build_model(hf_cfg(revision=other), tmp_path / "m", tmp_path, HfHub(None, hub.url))
    assert str(err.value).startswith(f"model: {REPO}@{other}: ")
    assert "\n" not in str(err.value)


def minimal_hf(**model: object) -> dict:
    return {
        "experiment": "t",
        "model": {"source": "hf", "repo": REPO, **model},
        "runtime": {"kind": "venv"},
        "server": {"configs": [{"name": "a"}]},
        "sweep": {"concurrency": [1]},
        "workload": {},
    }


@pytest.mark.parametrize("revision", ["main", "v1.0", COMMIT[:12], COMMIT.upper()])
def test_unpinned_revision_is_refused(revision: str) -> None:
    with pytest.raises(ServelabError) as err:
        config.validate(minimal_hf(revision=revision), source="exp.yaml")
    msg = str(err.value)
    assert msg.startswith(f"exp.yaml: model.revision: {revision!r} is not a commit")
    assert "pin the commit" in msg and "40-hex" in msg and "\n" not in msg


def test_missing_revision_and_repo_are_refused() -> None:
    with pytest.raises(ServelabError, match="model.revision: not set; pin the commit"):
        config.validate(minimal_hf(), source="exp.yaml")
    raw = minimal_hf(revision=COMMIT)
    del raw["model"]["repo"]
    with pytest.raises(ServelabError, match="model.repo: model.source hf needs a repository"):
        config.validate(raw, source="exp.yaml")


def test_served_name_defaults_to_the_repo() -> None:
    cfg = config.validate(minimal_hf(revision=COMMIT)).to_dict()
    assert cfg["model"]["served_name"] == REPO
    cfg = config.validate(minimal_hf(revision=COMMIT, served_name="short")).to_dict()
    assert cfg["model"]["served_name"] == "short"
    tiny = config.validate({**minimal_hf(), "model": {"source": "tiny"}}).to_dict()
    assert tiny["model"]["served_name"] == "servelab-tiny"
    with pytest.raises(ServelabError, match="model.repo: only for model.source hf"):
        config.validate({**minimal_hf(), "model": {"source": "tiny", "repo": REPO}})
