from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest

from servelab.client.prompt import Conversation, Prompt
from servelab.config import default_section
from servelab.errors import ServelabError
from servelab.experiment import ChatSection, Lengths, SharedPrefixSection, WorkloadSection
from servelab.workload.synthetic import (
    build_prompts,
    build_workload,
    draw_lengths,
    exact_after,
    intended_reuse,
    make_prompts,
    shared_prefixes,
    synthetic_conversations,
    synthetic_prompts,
    with_prefixes,
)


class ToyTokenizer:
    """Words are tokens, but 'x' and 'y' next to each other merge into one token."""

    words = ["x", "y", "cat", "dog", "sun"]

    def tokenize(self, text: str) -> list[int]:
        out: list[int] = []
        for w in text.split():
            if out and w == "y" and out[-1] == 0:
                out[-1] = 99  # merged
            else:
                out.append(self.words.index(w))
        return out

    def detokenize(self, ids: list[int]) -> str:
        return " ".join("x" if i == 99 else self.words[i] for i in ids)


def test_prompts_have_exact_length_and_are_seeded() -> None:
    t = ToyTokenizer()
    a = make_prompts(3, 20, 7, range(5), tokenize=t.tokenize, detokenize=t.detokenize)
    assert len(a) == 20
    assert all(len(t.tokenize(p)) == 7 for p in a)
    assert a == make_prompts(3, 20, 7, range(5), tokenize=t.tokenize, detokenize=t.detokenize)
    assert a != make_prompts(4, 20, 7, range(5), tokenize=t.tokenize, detokenize=t.detokenize)


def test_unreachable_length_is_a_clear_error() -> None:
    with pytest.raises(ServelabError, match="exactly 5 tokens"):
        make_prompts(0, 1, 5, [0], tokenize=lambda s: [0] * 6, detokenize=lambda ids: "x")


# Synthetic workloads beyond the default: drawn lengths, shared prefixes, conversations


class WordTokenizer:
    """Every whitespace-separated word is one token (ids by first appearance)."""

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}

    def tokenize(self, text: str) -> list[int]:
        return [self.ids.setdefault(w, len(self.ids)) for w in text.split()]


class FakeServer:
    """/tokenize and /detokenize of a tokenizer, as Server.post_json answers them."""

    def __init__(self, tok: ToyTokenizer) -> None:
        self.tok = tok
        self.calls = 0

    def post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        if path == "/tokenize":
            assert body["add_special_tokens"] is False
            return {"tokens": self.tok.tokenize(body["prompt"])}
        assert path == "/detokenize"
        return {"prompt": self.tok.detokenize(body["tokens"])}


VOCAB = range(5)


def workload(**kw: Any) -> WorkloadSection:
    return replace(default_section(WorkloadSection, "workload"), **kw)


def build(wl: WorkloadSection, count: int, prefixes: list[str] | None = None) -> list[Any]:
    t = ToyTokenizer()
    if prefixes is None and wl.shared_prefix is not None:
        prefixes = shared_prefixes(
            wl.shared_prefix, wl.seed, VOCAB, tokenize=t.tokenize, detokenize=t.detokenize
        )
    fn = synthetic_conversations if wl.chat is not None else synthetic_prompts
    return list(
        fn(wl, count, VOCAB, tokenize=t.tokenize, detokenize=t.detokenize, prefixes=prefixes or ())
    )


def test_draw_lengths_each_form() -> None:
    assert draw_lengths(7, 4, random.Random(0)) == [7, 7, 7, 7]
    uniform = draw_lengths(Lengths(3, 6, None), 400, random.Random(1))
    assert set(uniform) == {3, 4, 5, 6}  # both ends included
    listed = draw_lengths(Lengths(None, None, (16, 512)), 200, random.Random(1))
    assert set(listed) == {16, 512}
    assert 60 < listed.count(16) < 140  # each about equally likely
    assert draw_lengths(Lengths(3, 6, None), 50, random.Random(2)) == draw_lengths(
        Lengths(3, 6, None), 50, random.Random(2)
    )
    assert draw_lengths(Lengths(3, 60, None), 50, random.Random(2)) != draw_lengths(
        Lengths(3, 60, None), 50, random.Random(3)
    )


def test_the_default_workload_gives_the_prompts_it_always_gave() -> None:
    """Pinned: make_prompts(0, 4, 6) with ToyTokenizer, as servelab built them before drawn
    lengths existed."""
    wl = workload(input_tokens=6, output_tokens=8)
    assert wl.fixed_lengths
    assert build(wl, 4) == [
        "dog dog x cat sun dog",
        "dog cat dog cat sun y",
        "sun y cat y x sun",
        "cat sun sun y cat x",
    ]


def test_drawn_lengths_give_prompts_of_exactly_their_length() -> None:
    t = ToyTokenizer()
    wl = workload(input_tokens=Lengths(2, 9, None), output_tokens=Lengths(None, None, (4, 32)))
    prompts = build(wl, 40)
    assert all(isinstance(p, Prompt) for p in prompts)
    inputs = draw_lengths(Lengths(2, 9, None), 40, random.Random("0:input"))
    outputs = draw_lengths(Lengths(None, None, (4, 32)), 40, random.Random("0:output"))
    assert [p.input_tokens for p in prompts] == inputs
    assert [len(t.tokenize(p.text)) for p in prompts] == inputs
    assert [p.max_tokens for p in prompts] == outputs
    assert {p.prefix for p in prompts} == {None}
    assert len(set(inputs)) > 3 and set(outputs) == {4, 32}
    assert build(wl, 40) == prompts  # same seed, same prompts
    assert build(replace(wl, seed=1), 40) != prompts


def test_input_lengths_output_lengths_and_texts_are_separate_streams() -> None:
    wl = workload(input_tokens=Lengths(2, 9, None), output_tokens=Lengths(4, 64, None))
    a = build(wl, 30)
    b = build(replace(wl, output_tokens=Lengths(None, None, (5, 7, 9))), 30)
    assert [p.text for p in a] == [p.text for p in b]  # another output distribution...
    assert [p.max_tokens for p in a] != [p.max_tokens for p in b]  # ...changes only that
    # one exact input length: the default's texts, whatever the output lengths
    fixed = build(workload(input_tokens=6, output_tokens=Lengths(4, 64, None)), 4)
    assert [p.text for p in fixed] == build(workload(input_tokens=6, output_tokens=8), 4)
    assert all(p.input_tokens == 6 for p in fixed)


def test_shared_prefixes_have_their_exact_length_from_their_own_stream() -> None:
    t = ToyTokenizer()
    spec = SharedPrefixSection(prefixes=3, prefix_tokens=5)
    pre = shared_prefixes(spec, 0, VOCAB, tokenize=t.tokenize, detokenize=t.detokenize)
    assert len(pre) == 3 and len(set(pre)) == 3
    assert all(len(t.tokenize(p)) == 5 for p in pre)
    again = shared_prefixes(spec, 0, VOCAB, tokenize=t.tokenize, detokenize=t.detokenize)
    assert again == pre
    # not the prompts' stream: the first prompt of seed 0 is not the first prefix
    assert make_prompts(0, 1, 5, VOCAB, tokenize=t.tokenize, detokenize=t.detokenize) != pre[:1]


def test_prompts_after_a_shared_prefix_tokenize_to_the_asked_total() -> None:
    t = ToyTokenizer()
    spec = SharedPrefixSection(prefixes=2, prefix_tokens=5)
    wl = workload(input_tokens=Lengths(2, 9, None), output_tokens=16, shared_prefix=spec)
    assert not wl.fixed_lengths
    pre = shared_prefixes(spec, 0, VOCAB, tokenize=t.tokenize, detokenize=t.detokenize)
    prompts = build(wl, 24, pre)
    own = draw_lengths(Lengths(2, 9, None), 24, random.Random("0:input"))
    for i, p in enumerate(prompts):
        assert p.prefix == i % 2
        assert p.text.startswith(pre[i % 2] + " ")
        assert p.input_tokens == 5 + own[i]  # the whole prompt, prefix included
        assert len(t.tokenize(p.text)) == p.input_tokens
        assert p.max_tokens == 16


def test_tokens_merging_at_the_seam_are_made_up_for() -> None:
    """ToyTokenizer merges 'x y': a prefix ending in x and a text opening with y lose a token,
    which the text gains back."""
    t = ToyTokenizer()
    whole = exact_after(random.Random(0), ("cat x", 2), 3, [1], t.tokenize, t.detokenize)
    assert whole == "cat x y y y y"
    assert len(t.tokenize(whole)) == 2 + 3


def test_with_prefixes_measures_the_whole_prompt() -> None:
    w = WordTokenizer()
    data = [Prompt("What is it", 7, 3), Prompt("Why", 9, 1), Prompt("  Say more", 5, 2)]
    out = with_prefixes(data, ["alpha beta", "gamma delta"], 2, tokenize=w.tokenize)
    assert [p.text for p in out] == [
        "alpha beta What is it",
        "gamma delta Why",
        "alpha beta  Say more",  # text that opens with white space: joined as it is
    ]
    assert [(p.input_tokens, p.prefix, p.max_tokens) for p in out] == [
        (5, 0, 7),
        (3, 1, 9),
        (4, 0, 5),
    ]


def test_with_prefixes_tries_another_seam_when_the_counts_do_not_add_up() -> None:
    def chars(text: str) -> list[int]:  # every character a token, spaces too
        return [ord(c) for c in text]

    (joined,) = with_prefixes([Prompt("de", 3, 2)], ["abc"], 3, tokenize=chars)
    assert joined.text == "abcde" and joined.input_tokens == 5  # a space would make it 6
    (unknown,) = with_prefixes([Prompt("de", 3)], ["abc"], 3, tokenize=chars)
    assert unknown.text == "abc de" and unknown.input_tokens == 6  # measured as it is


def test_conversations_turns_and_system_prefixes() -> None:
    t = ToyTokenizer()
    spec = SharedPrefixSection(prefixes=2, prefix_tokens=4)
    wl = workload(
        input_tokens=Lengths(2, 6, None),
        output_tokens=Lengths(None, None, (8, 16)),
        chat=ChatSection(turns=3, think_time_s=0.5),
        shared_prefix=spec,
    )
    pre = shared_prefixes(spec, 0, VOCAB, tokenize=t.tokenize, detokenize=t.detokenize)
    convs = build(wl, 5, pre)
    inputs = draw_lengths(Lengths(2, 6, None), 15, random.Random("0:input"))
    outputs = draw_lengths(Lengths(None, None, (8, 16)), 15, random.Random("0:output"))
    assert len(convs) == 5
    for c, conv in enumerate(convs):
        assert isinstance(conv, Conversation) and len(conv.turns) == 3
        assert conv.system == pre[c % 2] and conv.prefix == c % 2
        for j, turn in enumerate(conv.turns):
            assert len(t.tokenize(turn.text)) == inputs[3 * c + j]
            assert turn.max_tokens == outputs[3 * c + j]
            assert turn.input_tokens is None and turn.prefix is None
    plain = build(replace(wl, shared_prefix=None), 5)
    assert {(c.system, c.prefix) for c in plain} == {(None, None)}
    assert [c.turns for c in plain] == [c.turns for c in convs]  # the turns do not move


def test_intended_reuse_hand_computed() -> None:
    prompts: list[Any] = [
        Prompt("a", input_tokens=15, prefix=0),  # first with prefix 0
        Prompt("b", input_tokens=12, prefix=1),  # first with prefix 1
        Prompt("c", input_tokens=20, prefix=0),  # 10 reused
        Prompt("d", input_tokens=11, prefix=1),  # 10 reused
        Prompt("e", input_tokens=14, prefix=0),  # 10 reused
    ]
    assert intended_reuse(prompts, 10) == {
        "prefix_tokens": 10,
        "prefixes": 2,
        "requests": 5,
        "requests_with_prefix": 5,
        "reused_tokens": 30,
        "prompt_tokens": 72,
        "reuse_ratio": round(30 / 72, 6),
    }
    assert intended_reuse(prompts, None) is None
    one = Prompt("t", max_tokens=4)
    convs: list[Any] = [Conversation((one, one, one), "s", 0), Conversation((one, one), "s", 0)]
    chat = intended_reuse(convs, 10)
    assert chat["requests"] == chat["requests_with_prefix"] == 5
    assert chat["reused_tokens"] == 40  # every turn but the very first
    assert chat["prompt_tokens"] is None and chat["reuse_ratio"] is None


def test_build_workload_is_the_one_entry_point() -> None:
    server: Any = FakeServer(ToyTokenizer())
    fixed = workload(input_tokens=6, output_tokens=8)
    default = build_workload(server, "m", fixed, 4, list(VOCAB))
    assert default == build_prompts(server, "m", 4, list(VOCAB), seed=0, input_tokens=6)
    assert default == build(fixed, 4)
    spec = SharedPrefixSection(prefixes=2, prefix_tokens=3)
    chat = replace(fixed, chat=ChatSection(2, 0.0), shared_prefix=spec)
    convs = build_workload(server, "m", chat, 3, list(VOCAB))
    assert convs == build(chat, 3)
    drawn = replace(fixed, input_tokens=Lengths(2, 5, None), shared_prefix=spec)
    assert build_workload(server, "m", drawn, 6, list(VOCAB)) == build(drawn, 6)
    data = replace(fixed, dataset=object())
    with pytest.raises(ValueError, match="dataset"):
        build_workload(server, "m", data, 1, list(VOCAB))
