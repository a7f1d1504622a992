"""Reading one HTTP/1.1 response to a streaming completions request: the framing (status
line, headers, chunked transfer encoding, Content-Length, close-delimited) by llhttp through
httptools, and the server-sent events in its body by the WHATWG event-stream rules, each
content chunk recorded on the request's record as the read that completed it arrives. The
per-chunk path is the client's hot path: constant work per chunk. `ChatResponseParser` reads
the chat completions chunk format (a turn of a conversation) with the same machinery, and keeps
the reply's text; the completions path does neither.

What the reader accepts is written down in docs/client.md ("What the client accepts").
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json.scanner import make_scanner
from typing import Any, cast

import httptools

from servelab.store.request import RequestRecord

# Strict JSON (as json.loads): the decoder's scanner (C), called directly, without json.loads's
# per-call encoding detection and wrappers; the caller checks that the value fills the string.
_scan_json: Callable[[str, int], tuple[Any, int]] = make_scanner(cast(Any, json.JSONDecoder()))

MAX_HEAD = 65536  # bytes of one response head: status line, headers, the blank line
MAX_EVENT = 1 << 20  # bytes of one SSE event not ended yet: its data lines and an unended line
_ERROR_BODY_KEEP = 4096
_BOM = b"\xef\xbb\xbf"
_JSON_SPACE = " \t\n\r"


class MalformedResponse(Exception):
    """The response broke HTTP/1.1 framing, or came in a form servelab does not read."""


class MalformedStream(ValueError):
    """The event stream broke the rules of server-sent events or of the completions API."""


class _Stop(Exception):
    """Raised from a callback to stop the HTTP parser: the response is over."""


class ResponseParser:
    """One HTTP/1.1 response to a streaming completions request, fed as bytes arrive.

    `feed(data, now)` takes each read in arrival order with the time it arrived (perf_counter
    ns, the clock of `t0`) and returns True once the response is over, finished or failed;
    the record then says which, exactly as the raw data contract has it:
    - the read that carried the start of the response sets first_byte_offset_us;
    - every SSE event whose data is a JSON object with a non-empty `choices` adds one chunk
      offset, `(now - t0) // 1000`, where `now` is the arrival of the read that completed the
      event (its blank line); its index goes to empty_chunks when its first choice has no
      text; its `usage.completion_tokens` (cumulative, with `continuous_usage_stats`) less the
      previous chunk's goes to chunk_tokens, which becomes None once a content chunk comes
      without usage;
    - `usage` sets prompt_tokens / output_tokens (the last one seen: the final total) and
      cached_tokens (`prompt_tokens_details.cached_tokens`, where the server reports it);
    - with `ids` (the request asked for the output's token ids: vLLM's `return_token_ids`),
      each content chunk's first choice's `token_ids` (the tokens that chunk adds) is appended
      to output_ids; a content chunk without them, or with anything but a list of integers,
      leaves output_ids None (the output's ids unknown), as a server that returns none does;
      data `[DONE]` marks a complete stream;
    - event data that is not JSON, or not a JSON object, fails the request ("malformed
      stream"); an `error` object without choices fails it ("stream error");
    - a status other than 200 fails it with its body ("HTTP <status>: <body>");
    - the end of the body ends the request: ok only with [DONE], usage and a chunk.
    Events follow the WHATWG rules: lines end with CRLF, LF or CR; the data lines of one event
    are joined with LF; a leading byte-order mark is dropped; comments and other fields are
    ignored; an event without data, or with only whitespace, is skipped. The body may come with
    `Transfer-Encoding: chunked` (as uvicorn sends SSE), with a Content-Length, or until the
    server closes the connection (`eof`); any content or transfer coding is refused (the
    request asks for identity). Reads may split the response anywhere: the outcome does not
    depend on where. Any exception while reading fails this request with its reason.
    """

    __slots__ = (
        "rec",
        "t0",
        "offsets",
        "empty",
        "tokens",
        "cum",
        "ended",
        "status",
        "http",
        "head",
        "in_head",
        "interim",
        "headers",
        "to_close",
        "stamp",
        "idle",
        "bom",
        "cr",
        "line",
        "data",
        "held",
        "done",
        "body_over",
        "finished",
        "reusable",
        "error_body",
        "received",
        "ids",
    )

    def __init__(self, rec: RequestRecord, t0: int, ids: bool = False) -> None:
        self.rec = rec
        self.t0 = t0
        self.offsets = rec.chunk_offsets_us
        self.empty: list[int] = []
        rec.empty_chunks = self.empty
        self.tokens: list[int] | None = []  # None: a content chunk came without usage
        rec.chunk_tokens = self.tokens
        self.cum = 0  # the last content chunk's cumulative completion_tokens
        self.ended = 0  # when the response was over (perf_counter ns), 0 until then
        self.status = 0
        # HTTP framing: llhttp, given one whole head at a time, then the body as it comes
        self.http = httptools.HttpResponseParser(self)
        self.head = bytearray()  # bytes of a head whose blank line has not come yet
        self.in_head = True
        self.interim = False  # the head just given was an interim (1xx) response's
        self.headers: dict[str, str] = {}  # the final head's, names lower-case
        self.to_close = False  # the body runs until the server closes the connection
        self.stamp = 0  # the current read's arrival, in µs after t0
        # server-sent events: `idle` when no state is carried between reads (the fast path)
        self.idle = False
        self.bom = True  # no body byte seen yet: a leading byte-order mark is still possible
        self.cr = False  # the last body byte was CR: an LF first in the next read ends no line
        self.line: list[bytes] = []  # an unended line's pieces (or a possible BOM's start)
        self.data: list[bytes] = []  # the current event's data lines
        self.held = 0  # bytes in `line` and `data`: bounded by MAX_EVENT
        self.done = False  # saw data [DONE]
        self.body_over = False
        self.finished = False
        self.reusable = True  # the connection can carry the next request
        self.error_body: list[bytes] = []
        self.received = False
        # the output's token ids so far (`ids`); None: not asked, or a chunk came without them
        self.ids: list[int] | None = [] if ids else None

    # feeding ---------------------------------------------------------------------------------

    def feed(self, data: bytes, now: int) -> bool:
        if self.finished:
            return True
        self.stamp = (now - self.t0) // 1000
        if not self.received:
            self.received = True
            self.rec.first_byte_offset_us = self.stamp
        try:
            if self.in_head:
                data = self._head(data)
            if data and not self.body_over:
                self.http.feed_data(data)
        except Exception as exc:  # noqa: BLE001 - every failure is this request's, with why
            self._failed(exc)
        if self.body_over and not self.finished:
            self._end(now)
        if self.finished:
            if not self.ended:
                self.ended = now
            return True
        return False

    def eof(self, now: int, exc: BaseException | None = None) -> None:
        """The server closed the connection (`exc`: why, when the transport knows)."""
        if self.finished:
            return
        if self.to_close and not self.in_head:
            self.body_over = True
            self._end(now)
            return
        where = "mid-response" if self.received else "before responding"
        why = f" ({type(exc).__name__}: {exc})" if exc is not None else ""
        self._fail(f"server closed the connection {where}{why}")
        self.ended = now

    def _fail(self, error: str) -> None:
        self.rec.error = error[:300]
        self.rec.ok = False
        self.finished = True
        self.reusable = False

    def _failed(self, exc: Exception) -> None:
        """Record why reading stopped: an exception raised while this read was handled (a
        response already whole is ended by `feed`)."""
        if isinstance(exc, httptools.HttpParserCallbackError) and exc.__context__ is not None:
            cause = exc.__context__  # raised in one of the callbacks below
            if isinstance(cause, _Stop):  # the response was over before the read was
                return
            exc = cast(Exception, cause)
        if self.body_over and isinstance(exc, httptools.HttpParserError):
            # bytes after the response that are not a response: the body was whole
            self.reusable = False
            return
        if isinstance(exc, httptools.HttpParserUpgrade):
            self._fail("malformed response: the server switched protocols (Upgrade)")
        elif isinstance(exc, (MalformedResponse, httptools.HttpParserError)):
            self._fail(f"malformed response: {exc}")
        elif isinstance(exc, (ValueError, UnicodeDecodeError)):  # JSONDecodeError is one
            self._fail(f"malformed stream: {exc}")
        elif isinstance(exc, RecursionError):
            self._fail("malformed stream: JSON nested too deeply to read")
        else:
            self._fail(f"client error while reading the response: {type(exc).__name__}: {exc}")

    # HTTP framing ----------------------------------------------------------------------------

    def _head(self, data: bytes) -> bytes:
        """Gather a response head up to its blank line, whatever the reads, and give it whole
        to the HTTP parser (its size is then checked the same way however it was split);
        returns the bytes after the final (not 1xx) response's head."""
        while True:
            head = self.head
            start = max(0, len(head) - 3)
            head += data
            i = head.find(b"\r\n\r\n", start)
            if i < 0:
                if len(head) > MAX_HEAD:
                    raise MalformedResponse(f"response head longer than {MAX_HEAD} bytes")
                return b""
            if i + 4 > MAX_HEAD:
                raise MalformedResponse(f"response head longer than {MAX_HEAD} bytes")
            data = bytes(head[i + 4 :])
            self.head = bytearray()
            self.http.feed_data(bytes(head[: i + 4]))
            if not self.interim:
                self.in_head = False
                return data
            self.interim = False  # an interim response (100 Continue): its head only

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1").strip()
        headers = self.headers
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        status = self.http.get_status_code()
        headers = self.headers
        if 100 <= status < 200:
            self.interim = True
            self.headers = {}
            return
        self.status = status
        self.rec.http_status = status
        te = headers.get("transfer-encoding", "").lower()
        codings = [c.strip() for c in te.split(",") if c.strip() not in ("", "chunked")]
        ce = headers.get("content-encoding", "").lower()
        codings += [c.strip() for c in ce.split(",") if c.strip() not in ("", "identity")]
        if codings:
            raise MalformedResponse(
                f"the body is encoded ({', '.join(codings)}); servelab asks for "
                "Accept-Encoding: identity and reads no coding: turn compression off on the "
                "server or proxy for event streams"
            )
        if not te and "content-length" not in headers and status not in (204, 304):
            self.to_close = True  # the body runs to the connection's close
            self.reusable = False

    def on_message_begin(self) -> None:
        if self.body_over:  # bytes after the response: do not reuse the connection
            self.reusable = False
            raise _Stop

    def on_message_complete(self) -> None:
        if self.interim:
            return
        self.reusable = self.reusable and self.http.should_keep_alive()
        self.body_over = True

    def on_body(self, body: bytes) -> None:
        if self.status != 200:
            if sum(map(len, self.error_body)) < _ERROR_BODY_KEEP:
                self.error_body.append(body)
            return
        # The usual body piece: one whole event, `data: {...}\n\n`, as a server writes one SSE
        # event per chunk and the client keeps up; its JSON read in place. Anything else (and
        # any doubt) goes the general way, which also gives the error message.
        if (
            self.idle
            and body[:7] == b"data: {"
            and body.find(b"\n") == len(body) - 2
            and body[-1] == 10
            and b"\r" not in body
        ):
            try:
                text = body.decode()
                msg, end = _scan_json(text, 6)
            except (StopIteration, ValueError):
                end = -1
            if end == len(text) - 2:
                if not self._message(msg, text):
                    raise _Stop
                return
        self._lines(body)
        if self.finished:
            raise _Stop

    # server-sent events ----------------------------------------------------------------------

    def _lines(self, body: bytes) -> None:
        """The event-stream rules over one piece of the body: lines (CRLF, LF, CR, split
        anywhere), fields, and the dispatch of an event at its blank line."""
        if self.bom:
            if self.line:
                body = self.line.pop() + body
            if len(body) < 3 and _BOM.startswith(body):
                self.line.append(body)  # the stream's first bytes may be a split BOM
                return
            self.bom = False
            if body.startswith(_BOM):
                body = body[3:]
        if self.cr:
            self.cr = False
            if body[:1] == b"\n":  # the LF of a CRLF split between two pieces
                body = body[1:]
        lines = body.splitlines(keepends=True)  # bytes: at CRLF, LF and CR only
        rest = b""
        if lines and lines[-1][-1] not in (10, 13):  # the last line has not ended yet
            rest = lines.pop()
        elif lines:
            self.cr = lines[-1][-1] == 13
        for raw in lines:
            if self.line:  # the end of a line begun in an earlier piece
                self.held -= sum(map(len, self.line))
                self.line.append(raw)
                raw = b"".join(self.line)
                self.line = []
            line = raw.rstrip(b"\r\n")  # exactly its one line ending: splitlines split at each
            if not line:
                if self.data and not self._dispatch():
                    return
            elif line[0] != 58:  # ":" begins a comment
                name, _, value = line.partition(b":")
                if name == b"data":
                    if value[:1] == b" ":
                        value = value[1:]
                    self.data.append(value)
                    self._hold(len(value) + 1)
                # event, id, retry and any other field: nothing servelab reads
        if rest:
            self.line.append(rest)
            self._hold(len(rest))
        self.idle = not (self.line or self.data or self.cr)

    def _hold(self, n: int) -> None:
        self.held += n
        if self.held > MAX_EVENT:
            raise MalformedStream(
                f"an event longer than {MAX_EVENT} bytes without its end (a blank line)"
            )

    def _dispatch(self) -> bool:
        """The event whose blank line just came; False when the stream reported an error."""
        data = self.data
        self.data = []
        self.held = 0
        text = b"\n".join(data).decode("utf-8", "replace")  # the standard's decoding
        body = text.strip(_JSON_SPACE)
        if not body:  # no data (or only whitespace): nothing to read
            return True
        if body == "[DONE]":
            self.done = True
            return True
        try:
            msg, end = _scan_json(body, 0)
        except StopIteration as exc:
            raise json.JSONDecodeError("Expecting value", body, exc.value) from None
        if end != len(body):
            raise json.JSONDecodeError("Extra data", body, end)
        if type(msg) is not dict:
            raise MalformedStream(f"chunk is not a JSON object: {body[:80]}")
        return self._message(msg, body)

    def _message(self, msg: dict[str, Any], text: str) -> bool:
        # Once per chunk, on the client's hot path: constant work only, the content chunk's
        # case inline.
        choices = msg.get("choices")
        if choices:
            offsets = self.offsets
            offsets.append(self.stamp)
            try:
                if not choices[0]["text"]:
                    self.empty.append(len(offsets) - 1)
            except (LookupError, TypeError):  # no text, or not a choice object
                self.empty.append(len(offsets) - 1)
            if self.ids is not None:
                self._gather(choices[0])
            usage = msg.get("usage")
            if usage:
                if type(usage) is not dict:
                    raise MalformedStream(f"usage is not a JSON object: {text[:80]}")
                rec = self.rec
                rec.prompt_tokens = usage.get("prompt_tokens")
                n = rec.output_tokens = usage.get("completion_tokens")
                tokens = self.tokens
                if tokens is not None:
                    if type(n) is int:
                        tokens.append(n - self.cum)
                        self.cum = n
                    else:  # no completion_tokens in this chunk's usage
                        self.tokens = rec.chunk_tokens = None
                if "prompt_tokens_details" in usage:
                    self._cached(usage)
            elif self.tokens is not None:
                self.tokens = self.rec.chunk_tokens = None
            return True
        if "error" in msg:
            err = msg["error"]
            detail = err.get("message", err) if isinstance(err, dict) else err
            self._fail(f"stream error: {detail}")
            return False
        usage = msg.get("usage")
        if usage:
            if type(usage) is not dict:
                raise MalformedStream(f"usage is not a JSON object: {text[:80]}")
            self.rec.prompt_tokens = usage.get("prompt_tokens")
            self.rec.output_tokens = usage.get("completion_tokens")
            if "prompt_tokens_details" in usage:
                self._cached(usage)
        return True

    def _gather(self, choice: Any) -> None:
        """A content chunk's token ids (its choice's `token_ids`) onto the record's
        output_ids; a chunk without them leaves the output's ids unknown (None)."""
        got = choice.get("token_ids") if type(choice) is dict else None
        ids = self.ids
        if ids is not None and type(got) is list and all(type(t) is int for t in got):
            ids.extend(got)
            self.rec.output_ids = ids
        else:
            self.ids = self.rec.output_ids = None

    def _cached(self, usage: dict[str, Any]) -> None:
        details = usage["prompt_tokens_details"]
        cached = details.get("cached_tokens") if type(details) is dict else None
        if type(cached) is int:
            self.rec.cached_tokens = cached

    def _end(self, now: int) -> None:
        rec = self.rec
        self.finished = True
        self.ended = now
        if self.status != 200:
            body = b"".join(self.error_body).decode("utf-8", "replace")
            rec.error = f"HTTP {self.status}: {body[:300].replace(chr(10), ' ')}"
            return
        rec.done_offset_us = (now - self.t0) // 1000
        if not self.done:
            rec.error = "stream ended before [DONE]"
        elif rec.output_tokens is None:
            rec.error = "stream carried no usage (completion_tokens)"
        elif not self.offsets:
            rec.error = "stream carried no content chunks"
        else:
            rec.ok = True


class ChatResponseParser(ResponseParser):
    """One HTTP/1.1 response to a streaming chat completions request: as `ResponseParser`, a
    chunk's text being its first choice's `delta.content`, and the reply's text kept (`reply`)
    for the next turn's history.

    - the role-only chunk a server sends first (vLLM: `delta: {role: "assistant", content:
      ""}`), before any content chunk and with no generated token (no usage, or usage with 0
      completion tokens), is not a content chunk: no offset; its usage is read. TTFT is then
      taken at the first content chunk with text (or tokens, where usage says so), as for
      completions (servelab.metrics.first_output_chunk): the first token's arrival, where
      `vllm bench serve` takes the role chunk's (docs/client.md, "Multi-turn chat");
    - a content chunk whose `delta.content` is missing, null or empty goes to `empty_chunks`,
      as a completions chunk without text;
    - chunks without choices (usage, an error) are read as for completions;
    - with `ids`, a content chunk's first choice's `token_ids` go to output_ids, as for
      completions (the role-only chunk carries none; its `prompt_token_ids` are the prompt's).
    """

    __slots__ = ("reply",)

    def __init__(self, rec: RequestRecord, t0: int, ids: bool = False) -> None:
        super().__init__(rec, t0, ids)
        self.reply: list[str] = []  # the content of every chunk, in order

    def reply_text(self) -> str:
        """What the server answered: the content of every chunk, joined."""
        return "".join(self.reply)

    def _message(self, msg: dict[str, Any], text: str) -> bool:
        choices = msg.get("choices")
        if not choices:
            return super()._message(msg, text)
        first = choices[0] if type(choices) is list else None
        delta = first.get("delta") if type(first) is dict else None
        content = delta.get("content") if type(delta) is dict else None
        if type(content) is not str:
            content = ""
        usage = msg.get("usage")
        if content:
            self.reply.append(content)
        elif not self.offsets and type(delta) is dict and "role" in delta and not _tokens(usage):
            # the role-only first chunk: no content chunk, its usage only
            return super()._message({"usage": usage}, text)
        # a completions chunk of the same text, usage and token ids: one path records both
        choice: dict[str, Any] = {"text": content}
        if self.ids is not None:
            choice["token_ids"] = first.get("token_ids") if type(first) is dict else None
        return super()._message({"choices": [choice], "usage": usage}, text)


def _tokens(usage: Any) -> bool:
    """The usage says a token was generated (completion_tokens above 0)."""
    if type(usage) is not dict:
        return False
    n = usage.get("completion_tokens")
    return type(n) is int and n > 0
