"""What one request sends: a prompt's text, or a `Prompt` that also carries its own output
length, the length it was built to and the shared prefix it starts with.

A plain string is sent with the workload's `max_tokens` and leaves the record as it always was.
A `Prompt`'s extra fields are copied into its request's record (`max_tokens`, `input_tokens`,
`prefix`), so the per-request length checks and the prefix-cache check know what it asked for.
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
