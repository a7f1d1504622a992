"""The record of one request, exactly the fields of the raw data contract (docs/raw-data.md).

`ResponseParser` fills it as the response streams in; `requests.jsonl` holds one per line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

from servelab.documents import JsonValue


class RequestJson(TypedDict):
    """One row of requests.jsonl (`RequestRecord.to_json`): the fields written after
    `cached_tokens` only when set (_ONLY_WHEN_SET)."""

    request_id: str
    sent_epoch_ns: int
    chunk_offsets_us: list[int]
    done_offset_us: int | None
    prompt_tokens: int | None
    output_tokens: int | None
    ok: bool
    error: str | None
    http_status: int | None
    first_byte_offset_us: int | None
    chunk_tokens: list[int] | None
    empty_chunks: list[int] | None
    queued_us: int | None
    cached_tokens: int | None
    send_slip_us: NotRequired[int]
    max_tokens: NotRequired[int]
    input_tokens: NotRequired[int]
    prefix: NotRequired[int]
    conversation: NotRequired[int]
    turn: NotRequired[int]
    output_ids: NotRequired[list[int]]


@dataclass
class RequestRecord:
    request_id: str
    sent_epoch_ns: int
    chunk_offsets_us: list[int] = field(default_factory=list)
    done_offset_us: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    ok: bool = False
    error: str | None = None
    http_status: int | None = None
    # Added later: raw data written before them lacks these, and reads back None.
    first_byte_offset_us: int | None = None
    chunk_tokens: list[int] | None = None
    empty_chunks: list[int] | None = None
    queued_us: int | None = None
    cached_tokens: int | None = None
    # Written by the open loop only (its records carry it; a closed loop's do not).
    send_slip_us: int | None = None
    # Written when the request's prompt asked for them (client.prompt.Prompt): its own
    # max_tokens, its length as built (tokens), the shared prefix it starts with.
    max_tokens: int | None = None
    input_tokens: int | None = None
    prefix: int | None = None
    # Written for a turn of a multi-turn chat (client.prompt.Conversation): the conversation's
    # index among the point's items, and the turn's number in it (from 1).
    conversation: int | None = None
    turn: int | None = None
    # Written when the workload records the generated tokens (workload.record_output_ids) and
    # the server returned them: the output's token ids, in order, gathered over the chunks.
    output_ids: list[int] | None = None

    def to_json(self) -> RequestJson:
        d: RequestJson = {
            "request_id": self.request_id,
            "sent_epoch_ns": self.sent_epoch_ns,
            "chunk_offsets_us": list(self.chunk_offsets_us),
            "done_offset_us": self.done_offset_us,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "ok": self.ok,
            "error": self.error,
            "http_status": self.http_status,
            "first_byte_offset_us": self.first_byte_offset_us,
            "chunk_tokens": None if self.chunk_tokens is None else list(self.chunk_tokens),
            "empty_chunks": None if self.empty_chunks is None else list(self.empty_chunks),
            "queued_us": self.queued_us,
            "cached_tokens": self.cached_tokens,
        }
        # _ONLY_WHEN_SET, in the fields' order
        if self.send_slip_us is not None:
            d["send_slip_us"] = self.send_slip_us
        if self.max_tokens is not None:
            d["max_tokens"] = self.max_tokens
        if self.input_tokens is not None:
            d["input_tokens"] = self.input_tokens
        if self.prefix is not None:
            d["prefix"] = self.prefix
        if self.conversation is not None:
            d["conversation"] = self.conversation
        if self.turn is not None:
            d["turn"] = self.turn
        if self.output_ids is not None:
            d["output_ids"] = list(self.output_ids)
        return d

    @staticmethod
    def from_json(d: Mapping[str, JsonValue]) -> RequestRecord:
        """The record of one row of requests.jsonl; a field of the wrong type, or a required
        one missing: RecordFieldError naming the field. Cheap type checks (no jsonschema):
        they run on every row the analysis reads."""
        fields: dict[str, Any] = {k: d.get(k) for k in RequestRecord.__dataclass_fields__}
        for name, (kind, nullable) in _ROW_FIELDS.items():
            v = fields[name]
            if v is None:
                if not nullable:
                    raise RecordFieldError(name, "required, missing or null")
                continue
            if not _is(v, kind):
                raise RecordFieldError(name, f"{v!r} is not {_KIND_TEXT[kind]}")
            if kind == "ints" and not all(_is(x, "int") for x in v):
                bad = next(x for x in v if not _is(x, "int"))
                raise RecordFieldError(name, f"holds {bad!r}, not an integer")
        return RequestRecord(**fields)


class RecordFieldError(ValueError):
    """A field of a requests.jsonl row that is not what the raw data contract says."""

    def __init__(self, field: str, what: str) -> None:
        self.field = field
        self.what = what
        super().__init__(f"$.{field}: {what}")


# field -> (kind, may be null or missing); docs/raw-data.md
_ROW_FIELDS: dict[str, tuple[str, bool]] = {
    "request_id": ("str", False),
    "sent_epoch_ns": ("int", False),
    "chunk_offsets_us": ("ints", False),
    "done_offset_us": ("int", True),
    "prompt_tokens": ("int", True),
    "output_tokens": ("int", True),
    "ok": ("bool", False),
    "error": ("str", True),
    "http_status": ("int", True),
    "first_byte_offset_us": ("int", True),
    "chunk_tokens": ("ints", True),
    "empty_chunks": ("ints", True),
    "queued_us": ("int", True),
    "cached_tokens": ("int", True),
    "send_slip_us": ("int", True),
    "max_tokens": ("int", True),
    "input_tokens": ("int", True),
    "prefix": ("int", True),
    "conversation": ("int", True),
    "turn": ("int", True),
    "output_ids": ("ints", True),
}
# left out of a row when None, so that records without them are written as before
_ONLY_WHEN_SET = (
    "send_slip_us",
    "max_tokens",
    "input_tokens",
    "prefix",
    "conversation",
    "turn",
    "output_ids",
)
_KIND_TEXT = {"str": "a string", "int": "an integer", "ints": "a list", "bool": "a boolean"}


def _is(v: JsonValue, kind: str) -> bool:
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if kind == "bool":
        return isinstance(v, bool)
    if kind == "str":
        return isinstance(v, str)
    return isinstance(v, list)
