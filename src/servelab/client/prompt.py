"""What one item of a point sends: a prompt's text, a `Prompt` that also carries its own
output length, the length it was built to and the shared prefix it starts with, or a
`Conversation`, a multi-turn chat sent one turn at a time (client.chat).

A plain string is sent with the workload's `max_tokens` and leaves the record as it always was.
A `Prompt`'s extra fields are copied into its request's record (`max_tokens`, `input_tokens`,
`prefix`), so the per-request length checks and the prefix-cache check know what it asked for;
each turn of a conversation is one request, and its record also says which conversation and
which turn it is (`conversation`, `turn`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Prompt:
    """One request's prompt. `max_tokens`: its own output length (None: the workload's);
    `input_tokens`: its length in tokens as built or measured with the server's tokenizer
    (None: not known); `prefix`: the index of the shared prefix it starts with (None: none)."""

    text: str
    max_tokens: int | None = None
    input_tokens: int | None = None
    prefix: int | None = None


PromptLike = str | Prompt


def text_of(p: PromptLike) -> str:
    return p if isinstance(p, str) else p.text


@dataclass(frozen=True)
class Conversation:
    """A multi-turn chat, sent over the chat completions endpoint: the user's turns in order,
    each sent with the history before it (every earlier turn and the model's reply to it).
    `system`: a system message that opens the conversation (e.g. a shared prefix), None: none;
    `prefix`: the index of that shared prefix (None: none)."""

    turns: tuple[Prompt, ...]
    system: str | None = None
    prefix: int | None = None

    def __post_init__(self) -> None:
        if not self.turns:
            raise ValueError("a conversation without turns: give it one turn or more")


# One item of a point: a prompt (one request) or a conversation (one request per turn).
Item = PromptLike | Conversation
