from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from servelab.config import default_section
from servelab.errors import ServelabError
from servelab.experiment import ModelSection, TinySpec
from servelab.model import build_model, build_tiny, file_digests, tree_digest

TINY = default_section(TinySpec, "model", "tiny")


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
    rec = build_model(replace(model, tiny=replace(model.tiny, layers=3)), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["num_hidden_layers"] == 3 and cfg["head_dim"] == 64
    assert cfg["vocab_size"] == rec["vocab_size"]
    assert rec["revision"] == tree_digest(file_digests(tmp_path))
    tok_cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_cfg["chat_template"]
    from safetensors.numpy import load_file

    w = load_file(str(tmp_path / "model.safetensors"))
    assert w["model.embed_tokens.weight"].shape == (rec["vocab_size"], 128)
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
