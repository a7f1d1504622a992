from __future__ import annotations

import pytest

from servelab.errors import ServelabError
from servelab.workload import make_prompts


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
