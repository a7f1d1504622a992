"""The record of one request, exactly the fields of the raw data contract (docs/raw-data.md).

`ResponseParser` fills it as the response streams in; `requests.jsonl` holds one per line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> RequestRecord:
        fields: dict[str, Any] = {k: d.get(k) for k in RequestRecord.__dataclass_fields__}
        return RequestRecord(**fields)
