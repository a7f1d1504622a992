"""Materialize the model a server will load.

`tiny`: a small Qwen2-architecture model built deterministically from a seed (random weights,
a byte-level BPE tokenizer trained on built-in text, a chat template). Its revision is the
digest of its files, so the same settings always give the same bytes and the same revision.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from servelab.errors import ServelabError
from servelab.jsonio import write_json

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@dataclass(frozen=True)
class TinySpec:
    seed: int = 0
    layers: int = 2
    hidden_size: int = 128
    heads: int = 2
    kv_heads: int = 2
    intermediate_size: int = 256
    vocab_size: int = 2048
    max_position_embeddings: int = 4096

    @staticmethod
    def from_config(cfg: dict[str, Any]) -> TinySpec:
        spec = TinySpec(**cfg)
        if spec.hidden_size % spec.heads:
            raise ServelabError(
                f"model.tiny: hidden_size {spec.hidden_size} is not divisible by heads {spec.heads}"
            )
        if spec.heads % spec.kv_heads:
            raise ServelabError(f"model.tiny: heads {spec.heads} must be a multiple of kv_heads")
        if spec.hidden_size // spec.heads not in (32, 64, 80, 96, 112, 128, 256):
            raise ServelabError(
                f"model.tiny: head_dim {spec.hidden_size // spec.heads} is not supported by "
                "vLLM's CPU attention; use hidden_size/heads = 64 (e.g. hidden_size 128, heads 2)"
            )
        return spec

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads


def corpus_text() -> str:
    return resources.files("servelab").joinpath("data/corpus.txt").read_text(encoding="utf-8")


def build_tokenizer_json(vocab_size: int) -> str:
    """Train a byte-level BPE tokenizer on the built-in corpus; returns tokenizer.json text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    lines = corpus_text().splitlines()
    tok.train_from_iterator(lines, trainer=trainer)
    return str(tok.to_str(pretty=False))


def _weights(spec: TinySpec, vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(spec.seed)
    h, i, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    q, kv = spec.heads * hd, spec.kv_heads * hd

    def normal(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    w: dict[str, np.ndarray] = {"model.embed_tokens.weight": normal(vocab, h)}
    for n in range(spec.layers):
        p = f"model.layers.{n}."
        w[p + "input_layernorm.weight"] = np.ones(h, dtype=np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(h, dtype=np.float32)
        w[p + "self_attn.q_proj.weight"] = normal(q, h)
        w[p + "self_attn.q_proj.bias"] = np.zeros(q, dtype=np.float32)
        w[p + "self_attn.k_proj.weight"] = normal(kv, h)
        w[p + "self_attn.k_proj.bias"] = np.zeros(kv, dtype=np.float32)
        w[p + "self_attn.v_proj.weight"] = normal(kv, h)
        w[p + "self_attn.v_proj.bias"] = np.zeros(kv, dtype=np.float32)
        w[p + "self_attn.o_proj.weight"] = normal(h, q)
        w[p + "mlp.gate_proj.weight"] = normal(i, h)
        w[p + "mlp.up_proj.weight"] = normal(i, h)
        w[p + "mlp.down_proj.weight"] = normal(h, i)
    w["model.norm.weight"] = np.ones(h, dtype=np.float32)
    w["lm_head.weight"] = normal(vocab, h)
    return w


def _hf_config(spec: TinySpec, vocab: int, eos_id: int) -> dict[str, Any]:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": spec.max_position_embeddings,
        "max_window_layers": spec.layers,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "vocab_size": vocab,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "use_cache": True,
    }


def file_digests(model_dir: Path) -> dict[str, str]:
    """sha256 of every file under model_dir, keyed by relative POSIX path, sorted."""
    out: dict[str, str] = {}
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(model_dir).as_posix()
        if rel == "servelab-model.json":
            continue
        out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def tree_digest(digests: dict[str, str]) -> str:
    """One digest for a set of files: sha256 over 'sha256  path' lines, sorted by path."""
    lines = "".join(f"{h}  {p}\n" for p, h in sorted(digests.items()))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def build_tiny(spec: TinySpec, out_dir: Path) -> dict[str, Any]:
    """Write the tiny model into out_dir and return its record (written as servelab-model.json)."""
    from safetensors.numpy import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    tok_json = build_tokenizer_json(spec.vocab_size)
    vocab = len(json.loads(tok_json)["model"]["vocab"])
    tok_data = json.loads(tok_json)
    eos_id = next(t["id"] for t in tok_data["added_tokens"] if t["content"] == "<|endoftext|>")
    (out_dir / "tokenizer.json").write_text(tok_json, encoding="utf-8")
    write_json(
        out_dir / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": "<|endoftext|>",
            "pad_token": "<|endoftext|>",
            "unk_token": None,
            "model_max_length": spec.max_position_embeddings,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    write_json(out_dir / "config.json", _hf_config(spec, vocab, eos_id))
    write_json(
        out_dir / "generation_config.json",
        {"bos_token_id": eos_id, "eos_token_id": eos_id, "do_sample": False},
    )
    save_file(_weights(spec, vocab), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    digests = file_digests(out_dir)
    record = {
        "source": "tiny",
        "spec": spec.__dict__,
        "vocab_size": vocab,
        "revision": tree_digest(digests),
        "files": digests,
    }
    write_json(out_dir / "servelab-model.json", record)
    return record


def build_model(model_cfg: dict[str, Any], out_dir: Path) -> dict[str, Any]:
    """Materialize the configured model into out_dir (the `model` stage)."""
    if model_cfg["source"] == "tiny":
        return build_tiny(TinySpec.from_config(model_cfg.get("tiny", {})), out_dir)
    raise ServelabError(f"model.source: {model_cfg['source']!r} is not supported")
