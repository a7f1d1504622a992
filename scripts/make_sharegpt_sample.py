"""Make datasets/sharegpt-sample.json: a small ShareGPT-format dataset, without any download.

    python scripts/make_sharegpt_sample.py --out datasets/sharegpt-sample.json

About 300 conversations of English words drawn from servelab's built-in corpus (the text the
tiny model's tokenizer is trained on, so a word is one or two of its tokens), shaped like
ShareGPT but scaled down for a 2-vCPU host and a server with max-model-len 1024: prompts
mostly 10-150 words with a tail to 400, replies mostly 10-120 words with a tail to 300, both
right-skewed (many short, a few long). About one conversation in five has four or six turns; a
few have a prompt or a reply of one or two words, or no reply at all, so that the sampling
filters (workload.dataset.filter) have something to reject.

The bytes are the same on every host: only integer draws of random.Random (randint, choice),
no floating-point math, and json.dumps(ensure_ascii=False, indent=1) with a trailing newline.
The script prints the file's sha256 (datasets/README.md gives it; the config pins it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
from pathlib import Path
from typing import Any

from servelab.env.model import corpus_text

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "datasets" / "sharegpt-sample.json"


def words() -> list[str]:
    """The corpus's words in corpus order, lowercased, punctuation and numbers dropped: a
    word's chance to be drawn follows its frequency in the corpus ("the" most often)."""
    return re.findall(r"[a-z]+", corpus_text().lower())


def skewed(rng: random.Random, lo: int, hi: int, tail_pct: int, tail_hi: int) -> int:
    """A right-skewed length: with tail_pct percent, uniform in (hi, tail_hi]; else lo plus the
    product of two uniform draws over [0, hi - lo], scaled back (most lengths short)."""
    if rng.randint(1, 100) <= tail_pct:
        return rng.randint(hi + 1, tail_hi)
    span = hi - lo
    return lo + rng.randint(0, span) * rng.randint(0, span) // span


def text(rng: random.Random, vocab: list[str], n: int, question: bool) -> str:
    """n words in sentences of 4-14 words, each capitalized and ended with a period (the last
    with a question mark for a question); paragraphs of 2-4 sentences."""
    sentences: list[str] = []
    left = n
    while left > 0:
        k = min(left, rng.randint(4, 14))
        ws = [rng.choice(vocab) for _ in range(k)]
        sentences.append(" ".join([ws[0].capitalize(), *ws[1:]]) + ".")
        left -= k
    if question:
        sentences[-1] = sentences[-1][:-1] + "?"
    paragraphs, i = [], 0
    while i < len(sentences):
        size = rng.randint(2, 4)
        paragraphs.append(" ".join(sentences[i : i + size]))
        i += size
    return "\n\n".join(paragraphs)


def short(rng: random.Random, vocab: list[str]) -> str:
    """One or two words, no punctuation: a turn under the filter's 4 tokens."""
    return " ".join(rng.choice(vocab) for _ in range(rng.randint(1, 2))).capitalize()


def conversation(rng: random.Random, vocab: list[str], index: int) -> dict[str, Any]:
    r = rng.randint(1, 100)
    turns = 2 if r <= 78 else 4 if r <= 93 else 6
    if rng.randint(1, 100) <= 2:
        turns = 1  # no reply: skipped when read (fewer than two turns)
    convo = []
    for t in range(turns):
        if t % 2 == 0:
            if t == 0 and rng.randint(1, 100) <= 3:
                value = short(rng, vocab)
            else:
                value = text(rng, vocab, skewed(rng, 10, 150, 8, 400), rng.randint(0, 1) == 1)
            convo.append({"from": "human", "value": value})
        else:
            if t == 1 and rng.randint(1, 100) <= 2:
                value = short(rng, vocab)
            else:
                value = text(rng, vocab, skewed(rng, 10, 120, 8, 300), False)
            convo.append({"from": "gpt", "value": value})
    return {"id": f"sample-{index:04d}", "conversations": convo}


def build(seed: int, count: int) -> str:
    rng = random.Random(seed)
    vocab = words()
    data = [conversation(rng, vocab, i) for i in range(count)]
    return json.dumps(data, ensure_ascii=False, indent=1) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the file to write")
    ap.add_argument("--seed", type=int, default=0, help="seed of the draws (default 0)")
    ap.add_argument(
        "--conversations", type=int, default=300, help="how many conversations (default 300)"
    )
    args = ap.parse_args(argv)
    body = build(args.seed, args.conversations).encode("utf-8")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(body)
    digest = hashlib.sha256(body).hexdigest()
    print(f"{args.out}: {args.conversations} conversations, {len(body)} bytes, sha256 {digest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
