"""Seeded random prompts of an exact token length, checked against the server's tokenizer,
and which of them the warm-up and every point send.

Random token ids (drawn from the model's vocabulary, `vocab_ids`) are detokenized by the
server, the text is tokenized again, and the ids are trimmed or extended until the text
tokenizes to exactly the requested length. The same seed and tokenizer always give the same
prompts. The sweep and the profile capture both build their prompts here (`build_prompts`).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from servelab.errors import ServelabError
from servelab.schedule import Slot

if TYPE_CHECKING:
    from servelab.server import Server

Tokenize = Callable[[str], list[int]]
Detokenize = Callable[[list[int]], str]

MAX_ROUNDS = 20
_WORD = re.compile("^(\u0120|\u2581)[A-Za-z]{2,}$")


def exact_prompt(
    rng: random.Random,
    length: int,
    vocab: Sequence[int],
    tokenize: Tokenize,
    detokenize: Detokenize,
) -> str:
    ids = [rng.choice(vocab) for _ in range(length)]
    for _ in range(MAX_ROUNDS):
        text = detokenize(ids)
        got = tokenize(text)
        if len(got) == length:
            return text
        if len(got) > length:
            ids = got[:length]
        else:
            ids = got + [rng.choice(vocab) for _ in range(length - len(got))]
    raise ServelabError(
        f"workload: could not build a prompt of exactly {length} tokens in {MAX_ROUNDS} rounds; "
        "try another workload.seed"
    )


def make_prompts(
    seed: int,
    count: int,
    length: int,
    vocab: Sequence[int],
    *,
    tokenize: Tokenize,
    detokenize: Detokenize,
) -> list[str]:
    rng = random.Random(seed)
    return [exact_prompt(rng, length, vocab, tokenize, detokenize) for _ in range(count)]


def vocab_ids(model_dir: Path) -> list[int]:
    """Token ids that are whole words with a leading space ("Ġword" / "▁word").

    Text made of such tokens re-tokenizes to the same ids, so exact-length prompts converge
    at once; the /tokenize check still decides.
    """
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        raise ServelabError(
            f"{path}: missing; prompts are built from the model's tokenizer.json (choose a "
            "model that has one, or add it to model.allow_patterns)"
        )
    tok = json.loads(path.read_text(encoding="utf-8"))
    special = {t["id"] for t in tok.get("added_tokens", [])}
    vocab: dict[str, int] = tok["model"]["vocab"]
    words = sorted(i for s, i in vocab.items() if _WORD.match(s) and i not in special)
    if len(words) >= 50:
        return words
    return sorted(i for i in vocab.values() if i not in special)


def build_prompts(
    server: Server, model: str, count: int, vocab: list[int], *, seed: int, input_tokens: int
) -> list[str]:
    """`count` prompts of exactly `input_tokens` tokens, checked with the server's own
    /tokenize and /detokenize."""

    def tokenize(text: str) -> list[int]:
        body = server.post_json(
            "/tokenize", {"model": model, "prompt": text, "add_special_tokens": False}
        )
        return list(body["tokens"])

    def detokenize(ids: list[int]) -> str:
        return str(server.post_json("/detokenize", {"model": model, "tokens": ids})["prompt"])

    return make_prompts(seed, count, input_tokens, vocab, tokenize=tokenize, detokenize=detokenize)


class PromptPlan(NamedTuple):
    """Which prompts of raw/<sc>/prompts.jsonl.gz the warm-up and every point send."""

    total: int  # prompts to build
    offsets: dict[tuple[int, int | float], int]  # (repeat, level) -> index of its first prompt
    warmup_offset: int


def prompt_plan(
    slots: list[Slot], requests: Callable[[Slot], int], warmup_requests: int, unique: bool
) -> PromptPlan:
    """`requests(slot)`: how many prompts a point sends (concurrency x waves, or a rate's
    requests). Unique: the warm-up takes prompts [0, warmup_requests) and each slot of the
    full plan, in plan order, its own prompts after them, so no prompt is sent twice and a
    resumed run gives every point the prompts a fresh run would. Not unique: every point
    starts at prompt 0, as does the warm-up."""
    if not unique:
        total = max([warmup_requests, *(requests(s) for s in slots)])
        return PromptPlan(total, {s.key: 0 for s in slots}, 0)
    offsets: dict[tuple[int, int | float], int] = {}
    at = warmup_requests
    for s in slots:
        offsets[s.key] = at
        at += requests(s)
    return PromptPlan(at, offsets, 0)
