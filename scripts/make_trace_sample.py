"""Make datasets/mooncake-sample.jsonl: a small request trace in the Mooncake format, without
any download.

    python scripts/make_trace_sample.py --out datasets/mooncake-sample.jsonl

60 requests over 60 s (a recorded rate of exactly 1 request per second), shaped like the
conversation trace of the Mooncake FAST'25 release (kvcache-ai/Mooncake,
FAST25-release/traces/conversation_trace.jsonl; datasets/README.md gives its statistics) but
scaled down for a 2-vCPU host, the default tiny model and a server with max-model-len 1024:

- arrivals in bursts: the requests arrive in slots 3 s apart (the conversation trace's
  timestamps step by 2999-3001 ms, about ten requests at one timestamp), 0-2 ms of jitter on
  each slot's time; how many requests a slot gets is drawn with uneven weights, so slots hold
  from none to several;
- blocks of 128 tokens (block_tokens: 128, the tiny server's KV cache block; Mooncake's are
  512): every request starts with block 0, a system prompt all share (as in the conversation
  trace); about two requests in five continue a recent conversation: they repeat its full
  blocks and add one or two of their own (a turn), the rest start a conversation of 3-6
  blocks. A request's last block is partial, and len(hash_ids) = ceil(input_length / 128);
- output lengths of 4-40 tokens.

The bytes are the same on every host: only integer draws of random.Random(0) (randint, choice),
no floating-point math, one json.dumps line per request, sorted as the trace's timestamps.
The script prints the file's sha256 (datasets/README.md gives it; the config pins it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "datasets" / "mooncake-sample.jsonl"
REQUESTS = 60
SLOT_MS = 3000  # the conversation trace's step between timestamps
SLOTS = 20  # 60 s
BLOCK = 128
MAX_BLOCKS = 7  # 7 x 128 = 896 prompt tokens + up to 40 output <= 1024
CONTINUE_PCT = 39  # requests that continue a conversation (the conversation trace: 38.7%)
RECENT = 8  # a continued conversation is one of the last 8 requests


def slot_sizes(rng: random.Random) -> list[int]:
    """How many requests each 3 s slot gets: every request draws a slot from a pool where
    slot s appears 1-5 times (its weight), so some slots burst and some are empty."""
    pool = [s for s in range(SLOTS) for _ in range(rng.randint(1, 5))]
    sizes = [0] * SLOTS
    for _ in range(REQUESTS):
        sizes[rng.choice(pool)] += 1
    return sizes


def make(rng: random.Random) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    next_id = 1  # block 0 is the shared system prompt
    sizes = slot_sizes(rng)
    for s, size in enumerate(sizes):
        t = s * SLOT_MS + rng.randint(0, 2)
        for _ in range(size):
            parent = rows[-rng.randint(1, min(RECENT, len(rows)))] if rows else None
            if parent is not None and rng.randint(1, 100) <= CONTINUE_PCT:
                full = parent["hash_ids"][:-1]  # its last block was partial: the turn extends it
                extra = rng.choice([1, 1, 2])
                if len(full) + extra > MAX_BLOCKS:
                    full = full[: MAX_BLOCKS - extra]
            else:
                full, extra = [0], rng.choice([2, 3, 3, 4, 4, 5])
            ids = [*full, *range(next_id, next_id + extra)]
            next_id += extra
            n_in = (len(ids) - 1) * BLOCK + rng.randint(1, BLOCK)
            rows.append(
                {
                    "timestamp": t,
                    "input_length": n_in,
                    "output_length": rng.randint(4, 40),
                    "hash_ids": ids,
                }
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    rows = make(random.Random(0))
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    args.out.write_bytes(data)
    print(f"sha256 {hashlib.sha256(data).hexdigest()}  ({len(data)} bytes, {len(rows)} requests)")


if __name__ == "__main__":
    main()
