"""Closed-loop streaming load generator for the OpenAI completions API (SSE), and the chat
completions API for multi-turn conversations.

Every request gets exactly the fields of the raw data contract. Times within a point are taken
from one monotonic clock and bridged to the wall clock once, at the start of the point, so
`sent_epoch_ns + done_offset_us` of different requests compare exactly.
Failed requests (HTTP errors, broken streams, timeouts) are recorded with their error, never
dropped.

The client speaks HTTP/1.1 itself, on one keep-alive connection per concurrency slot: an
`asyncio.BufferedProtocol` receives each read from the event loop, timestamps it, and hands it
to a `ResponseParser`, which reads the HTTP framing with llhttp (through `httptools`), splits
the server-sent events by the WHATWG rules and records each chunk there (docs/client.md says
what it accepts). The request's coroutine is woken once, when its response is over, not once
per chunk (a client's own cost per streamed token bounds how fast, and how accurately, it can
measure a server). The event loop is uvloop's where it is installed, else asyncio's.

The package, by concern: `record` (RequestRecord, one request's fields), `prompt` (Prompt, what
one request sends; Conversation, a multi-turn chat; Item, either), `parser` (the HTTP/1.1
response and its SSE events, completions and chat chunks), `connection` (one keep-alive
connection), `chat` (what each turn of a conversation sends, and its records), `closed_loop`
(the concurrency driver: RequestSettings, PointRun, run_closed_loop), `open_loop` (the
arrival-schedule driver: OpenLoop, run_open_loop), `workers` (running a point, in this process
or spread over worker processes: run_point, for either loop) and `signals` (stop signals cancel
a point).
"""

from servelab.client.closed_loop import (
    PointRun,
    RequestMarks,
    RequestSettings,
    _payload as _payload,
    run_closed_loop,
)
from servelab.client.open_loop import OpenLoop, run_open_loop
from servelab.client.parser import ChatResponseParser, MalformedResponse, ResponseParser
from servelab.client.prompt import Conversation, Item, Prompt, PromptLike
from servelab.client.signals import STOP_SIGNALS
from servelab.client.workers import PointOptions, run_point
from servelab.store.request import RequestRecord

__all__ = [
    "STOP_SIGNALS",
    "ChatResponseParser",
    "Conversation",
    "Item",
    "MalformedResponse",
    "OpenLoop",
    "PointOptions",
    "PointRun",
    "Prompt",
    "PromptLike",
    "RequestMarks",
    "RequestRecord",
    "ResponseParser",
    "RequestSettings",
    "run_closed_loop",
    "run_open_loop",
    "run_point",
]
