"""Seeded synthetic workloads: prompts of an exact token length (one length, or lengths drawn
per request), shared prefixes, multi-turn conversations, all checked against the server's
tokenizer; and which items the warm-up and every point send.

Random token ids (drawn from the model's vocabulary, `vocab_ids`) are detokenized by the
server, the text is tokenized again, and the ids are trimmed or extended until the text
tokenizes to exactly the requested length. The same seed and tokenizer always give the same
prompts. The sweep and the profile capture build their prompts here (`build_workload`; the
default workload's plain strings are `build_prompts`'s, unchanged).

Random streams, each seeded from workload.seed (a string seed hashes the same way in every
Python process), so that changing one part of the workload leaves the others as they were:
- the prompts' token ids: `random.Random(seed)`, the stream the default workload has always
  used, so prompts of one exact length (no shared prefix) are the default's texts whatever the
  output lengths;
- input lengths: `random.Random(f"{seed}:input")`; output lengths (max_tokens):
  `random.Random(f"{seed}:output")`: another output distribution changes no prompt text;
- the shared prefixes' token ids: `random.Random(f"{seed}:prefix")`.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, overload

from servelab.client.prompt import Conversation, Prompt, PromptLike
from servelab.design.schedule import Slot
from servelab.documents.declared import IntendedReuse
from servelab.env.model import RECORD as MODEL_RECORD
from servelab.errors import ServelabError
from servelab.experiment import Lengths, SharedPrefixSection, WorkloadSection

if TYPE_CHECKING:
    from servelab.launch.server import Server

Tokenize = Callable[[str], list[int]]
Detokenize = Callable[[list[int]], str]
Item = PromptLike | Conversation

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


def _seam(text: str) -> str:
    """What goes between a shared prefix and the text after it: nothing when the text opens
    with white space (a synthetic prompt's word tokens carry their leading space: "Ġword"),
    else a space (a decoded text whose first space was dropped: "▁word"), so that neither
    the prefix's last word nor the text's first runs into the other."""
    return "" if text[:1].isspace() else " "


def exact_after(
    rng: random.Random,
    lead: tuple[str, int],
    length: int,
    vocab: Sequence[int],
    tokenize: Tokenize,
    detokenize: Detokenize,
) -> str:
    """A prompt that starts with `lead` (a shared prefix's text and its length in tokens),
    then `_seam`, then `length` tokens of random ids: the whole tokenizes to exactly the lead's
    tokens + length, checked on the whole (tokens at the seam may merge), the ids after the
    lead trimmed or extended as in `exact_prompt`."""
    lead_text, lead_tokens = lead
    ids = [rng.choice(vocab) for _ in range(length)]
    for _ in range(MAX_ROUNDS):
        own = detokenize(ids)
        whole = lead_text + _seam(own) + own
        got = len(tokenize(whole)) - lead_tokens
        if got == length:
            return whole
        own_ids = tokenize(own)
        if got > length:
            ids = own_ids[: max(0, len(own_ids) - (got - length))]
        else:
            ids = own_ids + [rng.choice(vocab) for _ in range(length - got)]
    raise ServelabError(
        f"workload: could not build a prompt of exactly {length} tokens after a shared prefix "
        f"of {lead_tokens} in {MAX_ROUNDS} rounds; try another workload.seed"
    )


def draw_lengths(spec: int | Lengths, count: int, rng: random.Random) -> list[int]:
    """Every request's length: the int itself `count` times, or one draw per request from
    `rng`: uniform over [min, max] (both included, `rng.randint`), or one of `values`, each
    equally likely (`rng.choice`)."""
    if isinstance(spec, int):
        return [spec] * count
    if spec.values is not None:
        values = spec.values
        return [rng.choice(values) for _ in range(count)]
    assert spec.min is not None and spec.max is not None  # the schema: min and max, or values
    lo, hi = spec.min, spec.max
    return [rng.randint(lo, hi) for _ in range(count)]


def _drawn(wl: WorkloadSection, count: int) -> tuple[list[int], list[int]]:
    """`count` input and output lengths, each from its own stream (the module docstring)."""
    if wl.input_tokens is None or wl.output_tokens is None:
        raise ValueError("a synthetic workload needs workload.input_tokens and output_tokens")
    inputs = draw_lengths(wl.input_tokens, count, random.Random(f"{wl.seed}:input"))
    outputs = draw_lengths(wl.output_tokens, count, random.Random(f"{wl.seed}:output"))
    return inputs, outputs


def _prefix_texts(wl: WorkloadSection, prefixes: Sequence[str]) -> Sequence[str]:
    """The prefix texts requests start with: `prefixes` with workload.shared_prefix, none
    without."""
    if wl.shared_prefix is None:
        return ()
    if len(prefixes) != wl.shared_prefix.prefixes:
        raise ValueError(
            f"workload.shared_prefix asks for {wl.shared_prefix.prefixes} prefixes, "
            f"{len(prefixes)} given"
        )
    return prefixes


def synthetic_prompts(
    wl: WorkloadSection,
    count: int,
    vocab: Sequence[int],
    *,
    tokenize: Tokenize,
    detokenize: Detokenize,
    prefixes: Sequence[str] = (),
) -> list[PromptLike]:
    """`count` synthetic prompts of workload.seed.

    The default workload (`wl.fixed_lengths`): `make_prompts`'s plain strings, the same bytes
    as always. Otherwise one `Prompt` per request: its own part `input_tokens[i]` tokens long
    and its `max_tokens` the drawn output length (`draw_lengths`, each from its own stream).
    With workload.shared_prefix (`prefixes`: its texts, from `shared_prefixes`) request i
    starts with prefix i mod K, its own part after it: workload.input_tokens is the length of
    that own part, and the Prompt's `input_tokens` the whole prompt's, prefix included
    (prefix_tokens + own part), as the server's usage.prompt_tokens counts it; the whole
    text tokenizes to exactly that (`exact_after`)."""
    if wl.fixed_lengths:
        assert isinstance(wl.input_tokens, int)
        strings = make_prompts(
            wl.seed, count, wl.input_tokens, vocab, tokenize=tokenize, detokenize=detokenize
        )
        return list(strings)
    shared = _prefix_texts(wl, prefixes)
    leads = [(text, len(tokenize(text))) for text in shared]  # prefix_tokens each, as built
    inputs, outputs = _drawn(wl, count)
    rng = random.Random(wl.seed)
    out: list[PromptLike] = []
    for i in range(count):
        if not shared:
            text = exact_prompt(rng, inputs[i], vocab, tokenize, detokenize)
            out.append(Prompt(text, max_tokens=outputs[i], input_tokens=inputs[i]))
            continue
        k = i % len(leads)
        text = exact_after(rng, leads[k], inputs[i], vocab, tokenize, detokenize)
        whole = leads[k][1] + inputs[i]
        out.append(Prompt(text, max_tokens=outputs[i], input_tokens=whole, prefix=k))
    return out


def shared_prefixes(
    spec: SharedPrefixSection,
    seed: int,
    vocab: Sequence[int],
    *,
    tokenize: Tokenize,
    detokenize: Detokenize,
) -> list[str]:
    """The workload's `spec.prefixes` shared prefixes, each exactly `spec.prefix_tokens` tokens,
    from their own stream (`random.Random(f"{seed}:prefix")`): the same for every item of a
    launch, the warm-up's included."""
    rng = random.Random(f"{seed}:prefix")
    return [
        exact_prompt(rng, spec.prefix_tokens, vocab, tokenize, detokenize)
        for _ in range(spec.prefixes)
    ]


def _joins(prefix: str, text: str) -> list[str]:
    """Ways to put `prefix` before `text`, the likeliest to keep both tokenizations first: with
    `_seam` between them, then the other of nothing and a space, then a line break."""
    seams = ("", " ", "\n") if _seam(text) == "" else (" ", "", "\n")
    return [prefix + seam + text for seam in seams]


def with_prefixes(
    prompts: Sequence[Prompt], prefixes: Sequence[str], prefix_tokens: int, *, tokenize: Tokenize
) -> list[Prompt]:
    """Prompts (a dataset's, their `input_tokens` measured) that start with a shared prefix:
    prompt i gets prefix i mod K before it, joined so that the token counts add up
    (prefix_tokens + the prompt's own) where a seam does (`_joins`, tried in order; else the
    first). Every whole prompt is measured with `tokenize`, and its `input_tokens` is that
    measured length, prefix included; its `prefix` the index."""
    if not prefixes:
        raise ValueError("with_prefixes: no shared prefixes given")
    out: list[Prompt] = []
    for i, p in enumerate(prompts):
        k = i % len(prefixes)
        joins = _joins(prefixes[k], p.text)
        text, n = joins[0], len(tokenize(joins[0]))
        if p.input_tokens is not None and n != prefix_tokens + p.input_tokens:
            for other in joins[1:]:
                m = len(tokenize(other))
                if m == prefix_tokens + p.input_tokens:
                    text, n = other, m
                    break
        out.append(Prompt(text, max_tokens=p.max_tokens, input_tokens=n, prefix=k))
    return out


def synthetic_conversations(
    wl: WorkloadSection,
    count: int,
    vocab: Sequence[int],
    *,
    tokenize: Tokenize,
    detokenize: Detokenize,
    prefixes: Sequence[str] = (),
) -> list[Conversation]:
    """`count` conversations of workload.chat.turns turns: each turn a user message of exactly
    its drawn input length and its drawn `max_tokens` (lengths drawn conversation by
    conversation, turn by turn, from the streams of the module docstring). With
    workload.shared_prefix, conversation i opens with prefix i mod K as its system message
    (`system`, `prefix` its index).

    A turn's `input_tokens` is None: the prompt the server counts for a turn holds the chat
    template, the system message and the whole history besides the user message, so the
    per-request prompt-length check has nothing to compare it with."""
    if wl.chat is None:
        raise ValueError("synthetic_conversations: the workload has no workload.chat")
    turns = wl.chat.turns
    shared = _prefix_texts(wl, prefixes)
    inputs, outputs = _drawn(wl, count * turns)
    rng = random.Random(wl.seed)
    out: list[Conversation] = []
    for c in range(count):
        msgs = []
        for j in range(c * turns, (c + 1) * turns):
            text = exact_prompt(rng, inputs[j], vocab, tokenize, detokenize)
            msgs.append(Prompt(text, max_tokens=outputs[j]))
        k = c % len(shared) if shared else None
        system = shared[k] if k is not None else None
        out.append(Conversation(tuple(msgs), system=system, prefix=k))
    return out


@overload
def intended_reuse(items: Sequence[Item], prefix_tokens: int) -> IntendedReuse: ...


@overload
def intended_reuse(items: Sequence[Item], prefix_tokens: None) -> None: ...


def intended_reuse(items: Sequence[Item], prefix_tokens: int | None) -> IntendedReuse | None:
    """What the workload means the prefix cache to serve over `items` (a point's prompts or
    conversations, in order): every request whose shared prefix an earlier request of `items`
    already sent has its `prefix_tokens` served from the cache; None without shared prefixes.

    `requests`: the requests (a conversation's turns each count); `requests_with_prefix`:
    those that start with a shared prefix; `prefixes`: the distinct prefixes among them;
    `reused_tokens`: prefix tokens sent after the first request with their prefix;
    `prompt_tokens`: every request's prompt tokens (its `input_tokens`, prefix included);
    `reuse_ratio`: reused_tokens / prompt_tokens. Counted as if the point began with an empty
    cache (the warm-up and earlier points send the same prefixes, so their first requests may
    hit as well); the server caches whole blocks only, so a prefix's last partial block is
    counted here but not served. `prompt_tokens` and `reuse_ratio` are None when a request's
    length is not known: a plain string, or a chat turn (the server's prompt for it holds the
    template and the history, which the cache may serve too)."""
    if prefix_tokens is None:
        return None
    seen: set[int] = set()
    requests = with_prefix = reused = total = 0
    known = True
    for item in items:
        sends: list[tuple[int | None, int | None]]  # (prefix, input_tokens) of each request
        if isinstance(item, Conversation):
            sends = [(item.prefix, None) for _ in item.turns]
        elif isinstance(item, Prompt):
            sends = [(item.prefix, item.input_tokens)]
        else:
            sends = [(None, None)]
        for k, n in sends:
            requests += 1
            if n is None:
                known = False
            else:
                total += n
            if k is None:
                continue
            with_prefix += 1
            if k in seen:
                reused += prefix_tokens
            seen.add(k)
    ratio = round(reused / total, 6) if known and total else None
    return {
        "prefix_tokens": prefix_tokens,
        "prefixes": len(seen),
        "requests": requests,
        "requests_with_prefix": with_prefix,
        "reused_tokens": reused,
        "prompt_tokens": total if known else None,
        "reuse_ratio": ratio,
    }


def vocab_ids(model_dir: Path) -> list[int]:
    """Token ids that are whole words with a leading space ("Ġword" / "▁word").

    Text made of such tokens re-tokenizes to the same ids, so exact-length prompts converge
    at once; the /tokenize check still decides.
    """
    path = model_dir / "tokenizer.json"
    if not path.is_file() and (model_dir / MODEL_RECORD).is_file():
        # a running server's model (model.source endpoint): no tokenizer.json here; the model
        # stage found the ids with the server's /tokenize (servelab.env.model.word_ids)
        ids = json.loads((model_dir / MODEL_RECORD).read_text(encoding="utf-8")).get("vocab_ids")
        if isinstance(ids, list) and ids:
            return [int(i) for i in ids]
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


def server_tokenizer(
    server: Server, model: str, *, special: bool = False
) -> tuple[Tokenize, Detokenize]:
    """The server's own /tokenize and /detokenize for `model`. `special`: with the special
    tokens its tokenizer adds to a prompt (a BOS token), as the server's usage.prompt_tokens
    and vllm bench serve's dataset filters count; else the text's own tokens."""

    def tokenize(text: str) -> list[int]:
        body = server.post_json(
            "/tokenize", {"model": model, "prompt": text, "add_special_tokens": special}
        )
        return list(body["tokens"])

    def detokenize(ids: list[int]) -> str:
        return str(server.post_json("/detokenize", {"model": model, "tokens": ids})["prompt"])

    return tokenize, detokenize


def build_prompts(
    server: Server, model: str, count: int, vocab: list[int], *, seed: int, input_tokens: int
) -> list[str]:
    """`count` prompts of exactly `input_tokens` tokens, checked with the server's own
    /tokenize and /detokenize."""
    tokenize, detokenize = server_tokenizer(server, model)
    return make_prompts(seed, count, input_tokens, vocab, tokenize=tokenize, detokenize=detokenize)


def build_workload(
    server: Server, model: str, wl: WorkloadSection, count: int, vocab: Sequence[int]
) -> list[Item]:
    """A synthetic workload's `count` items, built and checked with the server's tokenizer: the
    shared prefixes first (workload.shared_prefix), then `count` conversations (workload.chat)
    or prompts. The default workload gives `build_prompts`'s plain strings. A dataset workload
    is sampled by servelab.workload.datasets instead, and its prompts given their prefixes by
    `with_prefixes`."""
    if wl.dataset is not None:
        raise ValueError("build_workload: a dataset workload's prompts come from its dataset")
    tokenize, detokenize = server_tokenizer(server, model)
    prefixes: list[str] = []
    if wl.shared_prefix is not None:
        prefixes = shared_prefixes(
            wl.shared_prefix, wl.seed, vocab, tokenize=tokenize, detokenize=detokenize
        )
    if wl.chat is not None:
        convs = synthetic_conversations(
            wl, count, vocab, tokenize=tokenize, detokenize=detokenize, prefixes=prefixes
        )
        return list(convs)
    prompts = synthetic_prompts(
        wl, count, vocab, tokenize=tokenize, detokenize=detokenize, prefixes=prefixes
    )
    return list(prompts)


class PromptPlan(NamedTuple):
    """Which items (prompts, or conversations) of raw/<sc>/prompts.jsonl.gz the warm-up and
    every point send."""

    total: int  # prompts to build
    offsets: dict[tuple[int, int | float], int]  # (repeat, level) -> index of its first prompt
    warmup_offset: int


def prompt_plan(
    slots: list[Slot], requests: Callable[[Slot], int], warmup_requests: int, unique: bool
) -> PromptPlan:
    """`requests(slot)`: how many items a point sends (concurrency x waves, or a rate's
    requests), prompts or, in a chat workload, conversations. Unique: the warm-up takes items
    [0, warmup_requests) and each slot of the full plan, in plan order, its own items after
    them, so no prompt is sent twice and a resumed run gives every point the items a fresh run
    would. Not unique: every point starts at item 0, as does the warm-up."""
    if not unique:
        total = max([warmup_requests, *(requests(s) for s in slots)])
        return PromptPlan(total, {s.key: 0 for s in slots}, 0)
    offsets: dict[tuple[int, int | float], int] = {}
    at = warmup_requests
    for s in slots:
        offsets[s.key] = at
        at += requests(s)
    return PromptPlan(at, offsets, 0)
