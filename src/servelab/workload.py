"""Seeded random prompts of an exact token length, checked against the server's tokenizer.

Random token ids are detokenized by the server, the text is tokenized again, and the ids are
trimmed or extended until the text tokenizes to exactly the requested length. The same seed
and tokenizer always give the same prompts.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from servelab.errors import ServelabError

Tokenize = Callable[[str], list[int]]
Detokenize = Callable[[list[int]], str]

MAX_ROUNDS = 20


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
    tokenize: Tokenize,
    detokenize: Detokenize,
) -> list[str]:
    rng = random.Random(seed)
    return [exact_prompt(rng, length, vocab, tokenize, detokenize) for _ in range(count)]
