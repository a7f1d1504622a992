"""Reading one HTTP/1.1 response to a streaming completions request: the framing (status
line, headers, chunked transfer encoding, Content-Length, close-delimited) and the SSE events
in its body, each content chunk recorded on the request's record as the read that completed
it arrives. The per-chunk path is the client's hot path: constant work per chunk.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from json.scanner import make_scanner
from typing import Any, cast

from servelab.client.record import RequestRecord

# Strict JSON (as json.loads): the decoder's scanner (C), called directly, without json.loads's
# per-call encoding detection and wrappers; the caller checks that the value fills the string.
_scan_json: Callable[[str, int], tuple[Any, int]] = make_scanner(cast(Any, json.JSONDecoder()))

_HEAD, _CHUNKED, _LENGTH, _TO_CLOSE = range(4)
# Chunked decoding: ResponseParser.left > 0 is the rest of the current chunk's data;
# 0 means a chunk-size line comes next, and these two the other places in the framing:
_CRLF = -1  # the CRLF after a chunk's data
_TRAILER = -2  # trailer lines after the last (zero-size) chunk, up to a blank line
_MAX_LINE = 65536
_ERROR_BODY_KEEP = 4096


class MalformedResponse(Exception):
    """The response broke HTTP/1.1 framing (status line, headers, chunk sizes)."""


class ResponseParser:
    """One HTTP/1.1 response to a streaming completions request, fed as bytes arrive.

    `feed(data, now)` takes each read in arrival order with the time it arrived (perf_counter
    ns, the clock of `t0`) and returns True once the response is over, finished or failed;
    the record then says which, exactly as the raw data contract has it:
    - the read that carried the start of the response sets first_byte_offset_us;
    - every SSE event with a `data:` line whose JSON object carries a non-empty `choices`
      adds one chunk offset, `(now - t0) // 1000`, where `now` is the arrival of the read
      that completed the event; its index goes to empty_chunks when its first choice has no
      text; its `usage.completion_tokens` (cumulative, with `continuous_usage_stats`) less the
      previous chunk's goes to chunk_tokens, which becomes None once a content chunk comes
      without usage;
    - `usage` sets prompt_tokens / output_tokens (the last one seen: the final total) and
      cached_tokens (`prompt_tokens_details.cached_tokens`, where the server reports it);
      `data: [DONE]` marks a complete stream;
    - a chunk that is not JSON, or not a JSON object, fails the request ("malformed stream");
      an `error` object without choices fails it ("stream error");
    - a status other than 200 fails it with its body ("HTTP <status>: <body>");
    - the end of the body ends the request: ok only with [DONE], usage and a chunk.
    The body may come with `Transfer-Encoding: chunked` (as uvicorn sends SSE), with a
    Content-Length, or until the server closes the connection (`eof`). Reads may split the
    response anywhere: inside the head, a chunk-size line, a chunk, an event or a character.
    """

    __slots__ = (
        "rec",
        "t0",
        "offsets",
        "empty",
        "tokens",
        "cum",
        "ended",
        "state",
        "status",
        "left",
        "buf",
        "tail",
        "done",
        "body_over",
        "finished",
        "reusable",
        "error_body",
        "received",
    )

    def __init__(self, rec: RequestRecord, t0: int) -> None:
        self.rec = rec
        self.t0 = t0
        self.offsets = rec.chunk_offsets_us
        self.empty: list[int] = []
        rec.empty_chunks = self.empty
        self.tokens: list[int] | None = []  # None: a content chunk came without usage
        rec.chunk_tokens = self.tokens
        self.cum = 0  # the last content chunk's cumulative completion_tokens
        self.ended = 0  # when the response was over (perf_counter ns), 0 until then
        self.state = _HEAD
        self.status = 0
        self.left = 0  # chunked: see _CRLF/_TRAILER; Content-Length: body bytes still due
        self.buf = b""  # framing bytes not parsed yet (head, a split chunk-size line)
        self.tail = b""  # body bytes of an SSE event not complete yet
        self.done = False  # saw data: [DONE]
        self.body_over = False
        self.finished = False
        self.reusable = True  # the connection can carry the next request
        self.error_body: list[bytes] = []
        self.received = False

    # feeding ---------------------------------------------------------------------------------

    def feed(self, data: bytes, now: int) -> bool:
        if self.finished:
            return True
        if not self.received:
            self.received = True
            self.rec.first_byte_offset_us = (now - self.t0) // 1000
        try:
            if self.buf:
                data = self.buf + data
                self.buf = b""
            if self.state == _HEAD:
                data = self._head(data)
                if self.state == _HEAD:
                    return False
            if self.state == _CHUNKED:
                payload = self._dechunk(data)
            elif self.state == _LENGTH:
                payload = data[: self.left]
                if len(data) > self.left:
                    self.reusable = False  # bytes past the response: do not reuse
                self.left -= len(payload)
                self.body_over = self.left == 0
            else:
                payload = data
            if payload:
                if self.status == 200:
                    self._events(payload, now)
                elif sum(map(len, self.error_body)) < _ERROR_BODY_KEEP:
                    self.error_body.append(payload)
            if self.body_over and not self.finished:
                self._end(now)
        except MalformedResponse as exc:
            self._fail(f"malformed response: {exc}")
        except (ValueError, UnicodeDecodeError) as exc:  # json.JSONDecodeError is a ValueError
            self._fail(f"malformed stream: {exc}")
        if self.finished:
            if not self.ended:
                self.ended = now
            return True
        return False

    def eof(self, now: int, exc: BaseException | None = None) -> None:
        """The server closed the connection (`exc`: why, when the transport knows)."""
        if self.finished:
            return
        if self.state == _TO_CLOSE:
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

    # HTTP framing ----------------------------------------------------------------------------

    def _head(self, data: bytes) -> bytes:
        """Parse the status line and headers; returns the body bytes that followed them."""
        while True:
            i = data.find(b"\r\n\r\n")
            if i < 0:
                if len(data) > _MAX_LINE:
                    raise MalformedResponse("response head too long")
                self.buf = data
                return b""
            lines = data[:i].decode("latin-1").split("\r\n")
            data = data[i + 4 :]
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
                raise MalformedResponse(f"bad status line {lines[0][:80]!r}")
            status = int(parts[1])
            if 100 <= status < 200:  # an interim response (100 Continue): its head only
                continue
            break
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                raise MalformedResponse(f"bad header line {line[:80]!r}")
            key = name.strip().lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        self.status = status
        self.rec.http_status = status
        conn = headers.get("connection", "").lower()
        if parts[0] == "HTTP/1.0":
            self.reusable = "keep-alive" in conn
        else:
            self.reusable = "close" not in conn
        te = headers.get("transfer-encoding", "").lower()
        if status in (204, 304):
            self.state = _LENGTH
            self.body_over = True
        elif te:
            if te.rsplit(",", 1)[-1].strip() == "chunked":
                self.state = _CHUNKED
                self.left = 0
            else:  # another coding last: the body runs to the connection's close
                self.state = _TO_CLOSE
                self.reusable = False
        elif "content-length" in headers:
            try:
                n = int(headers["content-length"])
            except ValueError:
                raise MalformedResponse(
                    f"bad Content-Length {headers['content-length'][:40]!r}"
                ) from None
            if n < 0:
                raise MalformedResponse(f"bad Content-Length {n}")
            self.state = _LENGTH
            self.left = n
            self.body_over = n == 0
        else:
            self.state = _TO_CLOSE
            self.reusable = False
        return data

    def _dechunk(self, data: bytes) -> bytes:
        """The chunk data in `data` (chunked transfer encoding), any framing left unparsed
        kept for the next read."""
        if self.left == 0:
            # The usual read: exactly one whole chunk ("<size>\r\n<data>\r\n"), as a server
            # writes one SSE event per chunk and the client keeps up.
            i = data.find(b"\r\n", 0, 18)
            if i > 0:
                try:
                    size = int(data[:i], 16)
                except ValueError:
                    size = 0
                end = i + 2 + size
                if size > 0 and len(data) == end + 2 and data.endswith(b"\r\n"):
                    return data[i + 2 : end]
        out: list[bytes] = []
        pos = 0
        n = len(data)
        while pos < n:
            left = self.left
            if left == 0:
                # Whole chunks in a row (a read holds several when the client falls behind):
                # taken when the size line is plain hex and the chunk's CRLF is where it says.
                i = data.find(b"\r\n", pos, pos + 18)
                if i > pos:
                    try:
                        size = int(data[pos:i], 16)
                    except ValueError:
                        size = 0
                    end = i + 2 + size
                    if size > 0 and end + 2 <= n and data[end : end + 2] == b"\r\n":
                        out.append(data[i + 2 : end])
                        pos = end + 2
                        continue
            if left > 0:
                end = pos + left
                if end <= n:
                    out.append(data[pos:end])
                    pos = end
                    self.left = _CRLF
                else:
                    out.append(data[pos:])
                    self.left = end - n
                    pos = n
            elif left == _CRLF:
                if n - pos < 2:
                    break
                if data[pos : pos + 2] != b"\r\n":
                    raise MalformedResponse("chunk data not followed by CRLF")
                pos += 2
                self.left = 0
            else:
                i = data.find(b"\r\n", pos)
                if i < 0:
                    if n - pos > _MAX_LINE:
                        raise MalformedResponse("chunk-size or trailer line too long")
                    break
                line = data[pos:i]
                pos = i + 2
                if left == 0:
                    size = _chunk_size(line)
                    self.left = size if size else _TRAILER
                elif not line:  # the blank line that ends the trailers: the body is over
                    self.body_over = True
                    if pos < n:
                        self.reusable = False  # bytes past the response: do not reuse
                    pos = n
                    break
        if pos < n:
            self.buf = data[pos:]
        return out[0] if len(out) == 1 else b"".join(out)

    # SSE -------------------------------------------------------------------------------------

    def _events(self, payload: bytes, now: int) -> None:
        if self.tail:
            payload = self.tail + payload
        # Events end with a blank line; a read usually holds whole events, so the unfinished
        # rest (if any) is carried to the next read, never re-scanned.
        done, sep, self.tail = payload.rpartition(b"\n\n")
        if not sep:
            return
        stamp = (now - self.t0) // 1000
        try:
            text = done.decode()
        except UnicodeDecodeError:  # only data lines must be UTF-8: look line by line
            for chunk in done.split(b"\n\n"):
                if not self._lines(chunk.decode("latin-1").split("\n"), stamp, latin1=True):
                    return
            return
        for event in text.split("\n\n"):
            # The usual event, one `data: {...}` line: its JSON read in place. Anything else
            # (and any error) goes the general way, which also gives the error message.
            if event[:7] == "data: {" and "\n" not in event:
                try:
                    msg, end = _scan_json(event, 6)
                except (StopIteration, ValueError):
                    end = -1
                if end == len(event):
                    if not self._message(msg, stamp, event):
                        return
                    continue
            if not self._lines(event.split("\n"), stamp):
                return

    def _lines(self, lines: list[str], stamp: int, latin1: bool = False) -> bool:
        """The data lines of one event; False when the stream reported an error. `latin1`:
        the event's bytes were not all UTF-8 and were decoded as latin-1 to find the lines
        (each data line must still be UTF-8)."""
        for line in lines:
            if line[:5] != "data:":
                continue
            body = line[5:].strip(" \t\r\x0b\x0c")
            if body == "[DONE]":
                self.done = True
                continue
            if latin1:
                body = body.encode("latin-1").decode()
            try:
                msg, end = _scan_json(body, 0)
            except StopIteration as exc:
                raise json.JSONDecodeError("Expecting value", body, exc.value) from None
            if end != len(body):
                raise json.JSONDecodeError("Extra data", body, end)
            if type(msg) is not dict:
                raise ValueError(f"chunk is not a JSON object: {body[:80]}")
            if not self._message(msg, stamp, body):
                return False
        return True

    def _message(self, msg: dict[str, Any], stamp: int, text: str) -> bool:
        # Once per chunk, on the client's hot path: constant work only, the content chunk's
        # case inline.
        choices = msg.get("choices")
        if choices:
            offsets = self.offsets
            offsets.append(stamp)
            try:
                if not choices[0]["text"]:
                    self.empty.append(len(offsets) - 1)
            except (LookupError, TypeError):  # no text, or not a choice object
                self.empty.append(len(offsets) - 1)
            usage = msg.get("usage")
            if usage:
                if type(usage) is not dict:
                    raise ValueError(f"usage is not a JSON object: {text[:80]}")
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
                raise ValueError(f"usage is not a JSON object: {text[:80]}")
            self.rec.prompt_tokens = usage.get("prompt_tokens")
            self.rec.output_tokens = usage.get("completion_tokens")
            if "prompt_tokens_details" in usage:
                self._cached(usage)
        return True

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


def _chunk_size(line: bytes) -> int:
    digits = line.split(b";", 1)[0].strip()
    if not digits or digits.strip(b"0123456789abcdefABCDEF"):
        raise MalformedResponse(f"bad chunk-size line {line[:40]!r}")
    return int(digits, 16)
