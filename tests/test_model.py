from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from servelab.config import default_section
from servelab.env.model import (
    RECORD,
    build_model,
    build_tiny,
    build_tiny_shared,
    file_digests,
    model_dir,
    tree_digest,
)
from servelab.errors import ServelabError
from servelab.experiment import ModelSection, TinySpec

# a small shape: the default's (4 layers, hidden size 512) is 56 MB a build
TINY = replace(
    default_section(TinySpec, "model", "tiny"),
    layers=2,
    hidden_size=128,
    heads=2,
    kv_heads=2,
    intermediate_size=256,
)


def test_tiny_model_is_byte_identical_for_the_same_seed(tmp_path: Path) -> None:
    a = build_tiny(TINY, tmp_path / "a")
    b = build_tiny(TINY, tmp_path / "b")
    assert a["revision"] == b["revision"]
    for name in a["files"]:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    c = build_tiny(replace(TINY, seed=1), tmp_path / "c")
    assert c["revision"] != a["revision"]
    assert c["files"]["tokenizer.json"] == a["files"]["tokenizer.json"]


def test_tiny_model_shape_and_revision(tmp_path: Path) -> None:
    model = default_section(ModelSection, "model")
    assert model.source == "tiny"
    rec = build_model(replace(model, tiny=replace(model.tiny, layers=3)), tmp_path, tmp_path)
    folder = model_dir(tmp_path / RECORD)
    assert folder == tmp_path / "models" / "tiny" / rec["revision"][:16]
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["num_hidden_layers"] == 3 and cfg["head_dim"] == 64
    assert cfg["vocab_size"] == rec["vocab_size"]
    assert rec["revision"] == tree_digest(file_digests(folder))
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_cfg["chat_template"]
    from safetensors.numpy import load_file

    w = load_file(str(folder / "model.safetensors"))
    assert w["model.embed_tokens.weight"].shape == (rec["vocab_size"], 512)  # the default
    assert "model.layers.2.mlp.down_proj.weight" in w


def test_tokenizer_round_trips_text(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    build_tiny(TINY, tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = "The server is serialized at concurrency 16."
    assert tok.decode(tok.encode(text).ids) == text


def test_unsupported_head_dim_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ServelabError, match="head_dim 16"):
        build_tiny(replace(TINY, hidden_size=64, heads=4), tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_the_model_stage_serves_a_tiny_model_from_one_folder_per_digest(tmp_path: Path) -> None:
    """Two experiments (or two fresh clones) that build the same tiny model get the same folder,
    so vLLM's compile cache, keyed by the model's path, hits across them; another model gets
    another folder, and a folder whose files were changed is rebuilt, never served."""
    cache = tmp_path / "cache"
    a = build_tiny_shared(TINY, tmp_path / "exp-a" / "model", cache)
    b = build_tiny_shared(TINY, tmp_path / "exp-b" / "model", cache)
    assert a == b and Path(a["path"]).parent == cache / "models" / "tiny"
    assert model_dir(tmp_path / "exp-b" / "model" / RECORD) == Path(a["path"])
    assert json.loads((Path(a["path"]) / RECORD).read_text()) == a
    c = build_tiny_shared(replace(TINY, seed=1), tmp_path / "exp-c" / "model", cache)
    assert c["path"] != a["path"]
    assert sorted(p.name for p in (cache / "models" / "tiny").iterdir()) == sorted(
        Path(r["path"]).name for r in (a, c)
    )  # no staging folder left behind
    weights = Path(a["path"]) / "model.safetensors"
    weights.write_bytes(b"changed")
    again = build_tiny_shared(TINY, tmp_path / "exp-d" / "model", cache)
    assert again["path"] == a["path"] and file_digests(Path(a["path"])) == a["files"]
