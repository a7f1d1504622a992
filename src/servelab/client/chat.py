"""Multi-turn chat: what each turn of a conversation (client.prompt.Conversation) sends over
the chat completions endpoint, and the records of its turns.

A conversation is sent one turn at a time, each turn one POST `<base_url>/v1/chat/completions`
whose `messages` are the conversation so far: the system message (where it has one), then
every earlier turn's user message and the model's reply to it (the text the server streamed),
then this turn's user message. Turn k of a conversation with a system message thus sends 2k
messages, 2k - 1 without one. The loops (client.closed_loop.Sender.converse) send the turns in
order, the next one `think_time_s` after the previous reply's end.

Each turn has its own record: request id `<label>-<index:05d>-t<turn>` (the turn from 1,
zero-padded to the width of the conversation's last turn, so the ids of a point sort by
conversation, then turn), `conversation` (the item's index) and `turn`, and what its prompt
asked (`max_tokens`, `input_tokens`, `prefix`: the turn's, else the conversation's prefix). A
turn that fails ends its conversation: every turn after it is recorded as failed, with the error
"not sent: turn <k> failed", and never sent.
"""

from __future__ import annotations

from dataclasses import replace

from servelab.client.connection import Target
from servelab.client.prompt import Conversation, Prompt
from servelab.store.request import RequestRecord

COMPLETIONS_PATH = "/v1/completions"
CHAT_PATH = "/v1/chat/completions"


def chat_target(target: Target) -> Target:
    """The chat completions endpoint of the server whose completions endpoint is `target`."""
    return replace(target, path=target.path.removesuffix(COMPLETIONS_PATH) + CHAT_PATH)


def turn_id(label: str, index: int, turn: int, turns: int) -> str:
    """The request id of turn `turn` (from 1) of conversation `index`, of `turns` turns."""
    return f"{label}-{index:05d}-t{turn:0{len(str(turns))}d}"


class Talk:
    """One conversation as it is sent: the turns sent so far and the messages they make.

    `next_turn()` takes the next turn (its user message joins the history), `answer(reply)`
    adds the model's reply to it; `messages()` is what the turn sends."""

    def __init__(self, conv: Conversation, label: str, index: int) -> None:
        self.conv = conv
        self.label = label
        self.index = index
        self.sent = 0  # turns taken so far; the current turn's number
        self.history: list[dict[str, str]] = []
        if conv.system is not None:
            self.history.append({"role": "system", "content": conv.system})

    @property
    def over(self) -> bool:
        """Every turn has been taken."""
        return self.sent >= len(self.conv.turns)

    def next_turn(self) -> Prompt:
        turn = self.conv.turns[self.sent]
        self.sent += 1
        self.history.append({"role": "user", "content": turn.text})
        return turn

    def answer(self, reply: str) -> None:
        """The model's reply to the current turn, for the turns after it."""
        self.history.append({"role": "assistant", "content": reply})

    def messages(self) -> list[dict[str, str]]:
        return self.history

    def request_id(self, turn: int | None = None) -> str:
        """The id of turn `turn` (None: the current one)."""
        k = self.sent if turn is None else turn
        return turn_id(self.label, self.index, k, len(self.conv.turns))

    def record(self, sent_epoch_ns: int, turn: int | None = None) -> RequestRecord:
        """A fresh record of turn `turn` (None: the current one), with what it asked."""
        k = self.sent if turn is None else turn
        p = self.conv.turns[k - 1]
        return RequestRecord(
            request_id=self.request_id(k),
            sent_epoch_ns=sent_epoch_ns,
            max_tokens=p.max_tokens,
            input_tokens=p.input_tokens,
            prefix=p.prefix if p.prefix is not None else self.conv.prefix,
            conversation=self.index,
            turn=k,
        )

    def not_sent(self, at_epoch_ns: int) -> list[RequestRecord]:
        """The records of the turns after the current one, which failed: each failed, not
        sent, `sent_epoch_ns` the moment the conversation ended (`at_epoch_ns`)."""
        failed = self.sent
        out = []
        for k in range(failed + 1, len(self.conv.turns) + 1):
            rec = self.record(at_epoch_ns, k)
            rec.error = f"not sent: turn {failed} failed"
            out.append(rec)
        self.sent = len(self.conv.turns)
        return out
