"""The client against small SSE servers that behave, and misbehave, on purpose."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from aiohttp import web
from sse_servers import ChatServer, RawServer, reply_ids, serve_app, serve_chat, serve_raw

from servelab.client import (
    PointRun,
    RequestRecord,
    RequestSettings,
    ResponseParser,
    _payload,
    run_point,
)


def _chunk(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "text": text}]}).encode() + b"\n\n"


USAGE = b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}\n\n'
STREAM_OPTIONS = {"include_usage": True, "continuous_usage_stats": True}


def _usage_chunk(text: str | None, completion_tokens: int) -> bytes:
    """A content chunk as vLLM sends it with continuous_usage_stats (cumulative usage)."""
    msg = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "t",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}],
        "usage": {
            "prompt_tokens": 3,
            "total_tokens": 3 + completion_tokens,
            "completion_tokens": completion_tokens,
        },
    }
    return b"data: " + json.dumps(msg, separators=(",", ":")).encode() + b"\n\n"


async def good(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    assert body["stream"] is True and body["stream_options"] == STREAM_OPTIONS
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for t in ["a", "b", "", "d"]:
        await resp.write(_chunk(t))
        await asyncio.sleep(0.01)
    await resp.write(USAGE + b"data: [DONE]\n\n")
    return resp


async def continuous(request: web.Request) -> web.StreamResponse:
    """As vLLM with continuous_usage_stats: usage so far in every chunk; two tokens merged."""
    body = await request.json()
    assert body["stream_options"]["continuous_usage_stats"] is True
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for text, cum in [("a", 1), ("bc", 3), ("d", 4)]:
        await resp.write(_usage_chunk(text, cum))
        await asyncio.sleep(0.01)
    await resp.write(USAGE + b"data: [DONE]\n\n")
    return resp


async def http_error(request: web.Request) -> web.Response:
    return web.Response(status=400, text='{"error": "max_tokens too large"}')


async def broken(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_chunk("a"))
    await asyncio.sleep(0.01)
    assert request.transport is not None
    request.transport.close()
    return resp


async def slow(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_chunk("a"))
    await asyncio.sleep(5)
    return resp


async def no_usage(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(_chunk("a") + b"data: [DONE]\n\n")
    return resp


@pytest.fixture(scope="module")
def sse_server() -> Iterator[str]:
    app = web.Application()
    for name, handler in [
        ("good", good),
        ("continuous", continuous),
        ("error", http_error),
        ("broken", broken),
        ("slow", slow),
        ("nousage", no_usage),
    ]:
        app.router.add_post(f"/{name}/v1/completions", handler)
    yield from serve_app(app)


def wl(base: str, kind: str, timeout: float = 10) -> RequestSettings:
    return RequestSettings(
        base_url=f"{base}/{kind}", model="m", max_tokens=4, request_timeout_s=timeout
    )


def test_good_stream_records_every_chunk(sse_server: str) -> None:
    run = run_point(wl(sse_server, "good"), ["p"] * 6, 3, "t")
    assert len(run.records) == 6
    assert [r.request_id for r in run.records] == [f"t-{i:05d}" for i in range(6)]
    for r in run.records:
        assert r.ok and r.error is None and r.http_status == 200
        assert len(r.chunk_offsets_us) == 4  # empty-text chunks are token steps too
        assert r.chunk_offsets_us == sorted(r.chunk_offsets_us)
        assert r.done_offset_us is not None and r.done_offset_us >= r.chunk_offsets_us[-1]
        assert (r.prompt_tokens, r.output_tokens) == (3, 4)
    assert run.finished_epoch_ns > run.started_epoch_ns
    assert run.client_cpu_s > 0


def test_new_fields_over_a_socket(sse_server: str) -> None:
    good = run_point(wl(sse_server, "good"), ["p"] * 2, 2, "t")
    for r in good.records:  # no usage in the content chunks: tokens per chunk unknown
        assert r.chunk_tokens is None and r.empty_chunks == [2]
        assert r.first_byte_offset_us is not None
        assert 0 <= r.first_byte_offset_us <= r.chunk_offsets_us[0]
    cont = run_point(wl(sse_server, "continuous"), ["p"] * 2, 2, "t")
    for r in cont.records:
        assert r.ok and r.chunk_tokens == [1, 2, 1] and r.empty_chunks == []
        assert r.output_tokens == 4 and r.cached_tokens is None


def test_queued_us_is_the_wait_in_the_client(sse_server: str) -> None:
    run = run_point(wl(sse_server, "continuous"), ["p"] * 3, 1, "q")
    assert [r.ok for r in run.records] == [True] * 3
    waits = [r.queued_us for r in run.records]
    assert all(q is not None and 0 <= q < 50_000 for q in waits), waits
    # one slot: each request waits from the previous one's end (not its send) to its own send
    for prev, nxt in zip(run.records, run.records[1:], strict=False):
        assert prev.done_offset_us is not None and nxt.queued_us is not None
        end = prev.sent_epoch_ns + prev.done_offset_us * 1000
        assert nxt.sent_epoch_ns - nxt.queued_us * 1000 >= end - 1000
    # the first request waits from the point's start
    assert run.records[0].sent_epoch_ns - run.records[0].queued_us * 1000 >= run.started_epoch_ns  # type: ignore[operator]


def test_payload_asks_for_usage_in_every_chunk() -> None:
    body = json.loads(_payload(RequestSettings("http://h", "m", 4), "p"))
    assert body["stream_options"] == STREAM_OPTIONS
    assert body["stream"] is True and body["ignore_eos"] is True


def test_concurrency_is_respected(sse_server: str) -> None:
    run = run_point(wl(sse_server, "good"), ["p"] * 4, 2, "t")
    sends = sorted(r.sent_epoch_ns for r in run.records)
    # 2 in flight: the 3rd request starts only after one of the first two finished
    first_done = min(r.sent_epoch_ns + r.done_offset_us * 1000 for r in run.records[:2])  # type: ignore[operator]
    assert sends[2] >= first_done - 1_000_000


@pytest.mark.parametrize(
    ("kind", "fragment", "status"),
    [
        ("error", 'HTTP 400: {"error": "max_tokens too large"}', 400),
        ("broken", "", 200),
        ("slow", "timeout after 0.5 s", 200),
        ("nousage", "no usage", 200),
    ],
)
def test_failures_are_recorded_not_dropped(
    sse_server: str, kind: str, fragment: str, status: int
) -> None:
    run = run_point(wl(sse_server, kind, timeout=0.5), ["p"] * 3, 3, "t")
    assert len(run.records) == 3
    for r in run.records:
        assert not r.ok
        assert r.error and fragment in r.error
        assert r.http_status == status


def test_connection_refused_is_a_failed_request() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = PointRun()
    run_point(RequestSettings(f"http://127.0.0.1:{port}", "m", 4), ["p", "q"], 2, "t", out)
    assert len(out.records) == 2 and all(not r.ok and r.http_status is None for r in out.records)
    assert all("Connect" in (r.error or "") for r in out.records)


# --- the response parser, fed by hand ---------------------------------------------------------

T0 = 1_000_000_000  # the request's send time on the parser's clock (ns)


def sse_response(*events: bytes, chunked: bool = True, head: bytes = b"") -> bytes:
    """A 200 response carrying `events` as uvicorn sends SSE: one chunk per write."""
    body = b"".join(events)
    if not chunked:
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s" % (len(body), head, body)
    framed = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events if e)
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        b"transfer-encoding: chunked\r\n" + head + b"\r\n" + framed + b"0\r\n\r\n"
    )


STREAM = (_chunk("a"), _chunk("b"), _chunk(""), _chunk("d"), USAGE, b"data: [DONE]\n\n")


def parse(reads: list[bytes], times_us: list[int] | None = None) -> tuple[RequestRecord, bool]:
    """Feed `reads` in order, read i arriving at times_us[i] (default: i ms) after T0."""
    rec = RequestRecord("r", 0)
    p = ResponseParser(rec, T0)
    times = times_us or [1000 * i for i in range(len(reads))]
    over = False
    for data, t in zip(reads, times, strict=True):
        over = p.feed(data, T0 + t * 1000)
    return rec, over


def ends_of_events(raw: bytes) -> list[int]:
    """Byte index, in the raw response, of the last byte of each content chunk's event."""
    ends, start = [], 0
    for event in STREAM:
        i = raw.index(event, start)
        start = i + len(event)
        if b'"choices": [{' in event:
            ends.append(start - 1)
    return ends


def test_parser_one_read_many_events() -> None:
    rec, over = parse([sse_response(*STREAM)], [7])
    assert over and rec.ok and rec.error is None and rec.http_status == 200
    # several events in one read share its arrival time
    assert rec.chunk_offsets_us == [7, 7, 7, 7] and rec.done_offset_us == 7
    assert (rec.prompt_tokens, rec.output_tokens) == (3, 4)


@pytest.mark.parametrize("chunked", [True, False])
def test_parser_every_split_point(chunked: bool) -> None:
    raw = sse_response(*STREAM, chunked=chunked)
    ends = ends_of_events(raw)
    for cut in range(1, len(raw)):
        rec, over = parse([raw[:cut], raw[cut:]], [10, 20])
        assert over and rec.ok, (cut, rec)
        # an event counts when the read that completes it arrives
        assert rec.chunk_offsets_us == [10 if e < cut else 20 for e in ends], cut
        assert rec.done_offset_us == 20 and rec.output_tokens == 4


def test_parser_one_byte_per_read() -> None:
    # every boundary at once: inside the head, chunk-size lines, CRLFs, events, the trailer
    raw = sse_response(*STREAM, head=b"X-Extra: 1\r\n")
    rec, over = parse([raw[i : i + 1] for i in range(len(raw))], list(range(len(raw))))
    assert over and rec.ok
    assert rec.chunk_offsets_us == ends_of_events(raw)
    assert rec.done_offset_us == len(raw) - 1


def test_parser_chunk_extensions_trailers_and_events_split_across_chunks() -> None:
    body = b"".join(STREAM)
    pieces = [body[:10], body[10:150], body[150:]]  # chunk boundaries inside events
    framed = b"".join(b"%X;name=value\r\n%s\r\n" % (len(p), p) for p in pieces)
    raw = (
        b"HTTP/1.1 100 Continue\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + framed
        + b"0\r\nX-Trailer: yes\r\n\r\n"
    )
    rec, over = parse([raw])
    assert over and rec.ok and len(rec.chunk_offsets_us) == 4 and rec.output_tokens == 4


def test_parser_multi_line_events_and_comments() -> None:
    events = (
        b": ping\n\n",
        b"event: message\nid: 1\n" + _chunk("a"),
        b"data:" + _chunk("b")[5:],  # no space after the colon
        USAGE,
        b"data: [DONE]\n\n",
    )
    rec, _ = parse([sse_response(*events)])
    assert rec.ok and len(rec.chunk_offsets_us) == 2


def test_parser_odd_but_valid_events() -> None:
    events = (
        b": not utf-8 \xff\xfe\n" + _chunk("a"),  # only data lines must be UTF-8
        _chunk("b")[:-2] + b"  \t\n\n",  # whitespace after the JSON
        b'data: {"choices": [{"text": "\xc3\xa9\\u00e9"}]}\n\n',  # UTF-8 and escapes
        USAGE,
        b"data: [DONE]\n\n",
    )
    rec, _ = parse([sse_response(*events)])
    assert rec.ok and len(rec.chunk_offsets_us) == 3, rec.error


CONTINUOUS = (
    _usage_chunk("a", 1),
    _usage_chunk("", 2),  # text held back (inside a multi-byte character)
    _usage_chunk("bcd", 5),  # three tokens merged into one chunk
    _usage_chunk(None, 6),
    _usage_chunk("e", 7),
    b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7, '
    b'"prompt_tokens_details": {"cached_tokens": 2}}}\n\n',
    b"data: [DONE]\n\n",
)


def test_parser_tokens_per_chunk_from_continuous_usage() -> None:
    raw = sse_response(*CONTINUOUS)
    for reads in ([raw], [raw[i : i + 1] for i in range(len(raw))]):
        rec, over = parse(reads)
        assert over and rec.ok, rec.error
        assert len(rec.chunk_offsets_us) == 5
        assert rec.chunk_tokens == [1, 1, 3, 1, 1]
        assert rec.empty_chunks == [1, 3]
        assert (rec.prompt_tokens, rec.output_tokens, rec.cached_tokens) == (3, 7, 2)
    for cut in range(1, len(raw)):
        rec, _ = parse([raw[:cut], raw[cut:]], [10, 20])
        assert rec.chunk_tokens == [1, 1, 3, 1, 1] and rec.empty_chunks == [1, 3], cut


def test_parser_no_tokens_per_chunk_without_usage_in_every_chunk() -> None:
    rec, _ = parse([sse_response(*STREAM)])
    assert rec.ok and rec.chunk_tokens is None and rec.cached_tokens is None
    assert rec.empty_chunks == [2]  # _chunk("")
    mixed = (_usage_chunk("a", 1), _chunk("b"), _usage_chunk("c", 3), USAGE, b"data: [DONE]\n\n")
    rec, _ = parse([sse_response(*mixed)])
    assert rec.ok and rec.chunk_tokens is None and len(rec.chunk_offsets_us) == 3
    odd = (
        b'data: {"choices": [{"index": 0}]}\n\n',  # no text at all
        b'data: {"choices": [{"index": 0, "text": " x"}], "usage": {"completion_tokens": 2}}\n\n',
        USAGE,
        b"data: [DONE]\n\n",
    )
    rec, _ = parse([sse_response(*odd)])
    assert rec.ok and rec.empty_chunks == [0] and rec.chunk_tokens is None


def test_parser_first_byte_is_the_read_that_starts_the_head() -> None:
    raw = sse_response(*STREAM)
    rec, _ = parse([raw[:5], raw[5:60], raw[60:]], [30, 45, 90])
    assert rec.ok and rec.first_byte_offset_us == 30
    assert rec.chunk_offsets_us[0] == 90
    rec, _ = parse([raw], [250])
    assert rec.first_byte_offset_us == 250
    untouched = ResponseParser(RequestRecord("r", 0), T0)
    untouched.eof(T0 + 9_000_000)
    assert untouched.rec.first_byte_offset_us is None


def test_record_from_old_raw_data_reads_new_fields_as_none() -> None:
    old = {
        "request_id": "r",
        "sent_epoch_ns": 5,
        "chunk_offsets_us": [1, 2],
        "done_offset_us": 3,
        "prompt_tokens": 1,
        "output_tokens": 2,
        "ok": True,
        "error": None,
        "http_status": 200,
    }
    rec = RequestRecord.from_json(old)
    assert rec.chunk_offsets_us == [1, 2] and rec.ok
    new = ("first_byte_offset_us", "chunk_tokens", "empty_chunks", "queued_us", "cached_tokens")
    assert all(getattr(rec, k) is None for k in new)
    assert list(rec.to_json())[-6:] == ["http_status", *new]
    assert RequestRecord.from_json(rec.to_json()) == rec


def test_parser_body_until_close() -> None:
    body = b"".join(STREAM)
    rec = RequestRecord("r", 0)
    p = ResponseParser(rec, T0)
    assert not p.feed(b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\n" + body, T0)
    assert not p.reusable and not rec.ok
    p.eof(T0 + 5_000_000)
    assert rec.ok and rec.done_offset_us == 5000 and len(rec.chunk_offsets_us) == 4


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (sse_response(_chunk("a"), b"data: {not json}\n\n"), "malformed stream: Expecting"),
        (sse_response(_chunk("a"), b"data: [1, 2]\n\n"), "malformed stream: chunk is not"),
        (sse_response(b'data: {"choices": [1]} x\n\n'), "malformed stream: Extra data"),
        (sse_response(b"data: \xff\xfe\n\n"), "malformed stream"),
        (sse_response(b'data: {"usage": 5}\n\n'), "malformed stream: usage is not"),
        (
            sse_response(_chunk("a"), b'data: {"error": {"message": "engine died"}}\n\n'),
            "stream error: engine died",
        ),
        (sse_response(_chunk("a"), b"data: [DONE]\n\n"), "stream carried no usage"),
        (sse_response(_chunk("a"), USAGE), "stream ended before [DONE]"),
        (sse_response(USAGE, b"data: [DONE]\n\n"), "stream carried no content chunks"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "Invalid character in chunk size",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",
            "Expected LF after chunk data",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "Invalid character in Content-Length"),
        (b"SMTP ready\r\n\r\n", "Expected HTTP/"),
        (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "Invalid header token"),
    ],
)
def test_parser_errors_fail_the_request(raw: bytes, error: str) -> None:
    for reads in ([raw], [raw[i : i + 1] for i in range(len(raw))]):
        rec = RequestRecord("r", 0)
        p = ResponseParser(rec, T0)
        over = False
        for data in reads:
            over = p.feed(data, T0)
        if not over:  # framing errors may only show once the server gives up
            p.eof(T0)
        assert not rec.ok and rec.error is not None and error in rec.error, rec.error
        assert not p.reusable or rec.error.startswith("stream ")


def test_parser_http_error_body_any_framing() -> None:
    body = b'{"object": "error", "message": "too\nlong"}'
    chunked = b"HTTP/1.1 400 Bad Request\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunked += b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    length = b"HTTP/1.1 503 Busy\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    for raw, status in ((chunked, 400), (length, 503)):
        rec, over = parse([raw[:30], raw[30:]])
        assert over and rec.http_status == status and not rec.ok
        assert rec.error == f"HTTP {status}: " + body.decode().replace("\n", " ")
        assert rec.done_offset_us is None


def test_parser_connection_reuse_rules() -> None:
    def parser_after(raw: bytes) -> ResponseParser:
        p = ResponseParser(RequestRecord("r", 0), T0)
        assert p.feed(raw, T0)
        return p

    assert parser_after(sse_response(*STREAM)).reusable
    assert not parser_after(sse_response(*STREAM, head=b"Connection: close\r\n")).reusable
    assert not parser_after(sse_response(*STREAM) + b"HTTP/1.1 200 OK\r\n").reusable
    p = ResponseParser(RequestRecord("r", 0), T0)
    assert not p.feed(sse_response(*STREAM)[:-40], T0)
    p.eof(T0, ConnectionResetError("reset by peer"))
    assert p.rec.error == (
        "server closed the connection mid-response (ConnectionResetError: reset by peer)"
    )
    q = ResponseParser(RequestRecord("r", 0), T0)
    q.eof(T0)
    assert q.rec.error == "server closed the connection before responding"
    assert q.rec.http_status is None


# --- the client against a raw server that frames its responses by hand ------------------------


@pytest.fixture(scope="module")
def raw_server() -> Iterator[tuple[str, RawServer]]:
    yield from serve_raw()


def test_split_reads_over_a_socket_and_keep_alive(raw_server: tuple[str, RawServer]) -> None:
    base, srv = raw_server
    raw = sse_response(*STREAM)
    # the server writes at awkward places, pausing between writes so each is its own read
    cuts = [3, 40, 45, 100, 101, 230, len(raw) - 3]
    parts = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
    srv.scripts["/split/v1/completions"] = [x for p in parts for x in (p, 0.02)]
    before = srv.connections
    run = run_point(wl(base, "split"), ["p"] * 6, 2, "k")
    assert all(r.ok and len(r.chunk_offsets_us) == 4 for r in run.records), run.records
    assert srv.connections - before == 2  # one keep-alive connection per slot
    paths = [p for p, _ in srv.requests[-6:]]
    assert paths == ["/split/v1/completions"] * 6
    hdrs = srv.requests[-1][1]
    assert hdrs["x-request-id"].startswith("k-") and hdrs["content-type"] == "application/json"


def test_failed_streams_do_not_poison_the_next_request(raw_server: tuple[str, RawServer]) -> None:
    base, srv = raw_server
    srv.scripts["/bad/v1/completions"] = [sse_response(_chunk("a"), b"data: {oops\n\n")]
    srv.scripts["/eof/v1/completions"] = [sse_response(*STREAM)[:-30], b"CLOSE"]
    srv.scripts["/close/v1/completions"] = [
        sse_response(*STREAM, head=b"Connection: close\r\n"),
        b"CLOSE",
    ]
    bad = run_point(wl(base, "bad"), ["p"] * 3, 1, "b")
    assert [r.error and r.error.startswith("malformed stream") for r in bad.records] == [True] * 3
    assert all(len(r.chunk_offsets_us) == 1 for r in bad.records)
    eof = run_point(wl(base, "eof"), ["p"] * 3, 1, "e")
    assert all(
        r.error == "server closed the connection mid-response" and len(r.chunk_offsets_us) == 4
        for r in eof.records
    ), eof.records
    before = srv.connections
    closed = run_point(wl(base, "close"), ["p"] * 3, 1, "c")
    assert all(r.ok for r in closed.records)
    assert srv.connections - before == 3  # Connection: close is honoured


class LoopKind:
    def __init__(self) -> None:
        self.kinds: set[str] = set()

    def start(self, index: int) -> None:
        self.kinds.add(type(asyncio.get_running_loop()).__module__.split(".")[0])

    def end(self, token: object) -> None:
        pass


def test_runs_on_uvloop_and_on_asyncio_alike(
    sse_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("uvloop")
    runs = {}
    for loop in ("uvloop", "asyncio"):
        if loop == "asyncio":
            monkeypatch.setitem(sys.modules, "uvloop", None)  # import fails: Windows' way
        marks = LoopKind()
        runs[loop] = {
            kind: run_point(wl(sse_server, kind, timeout=0.5), ["p"] * 2, 2, "t", marks=marks)
            for kind in ("good", "broken", "slow", "error")
        }
        assert marks.kinds == {loop}
    for kind in ("good", "broken", "slow", "error"):
        a, b = runs["uvloop"][kind].records, runs["asyncio"][kind].records
        assert [(r.ok, r.error, r.http_status, len(r.chunk_offsets_us)) for r in a] == [
            (r.ok, r.error, r.http_status, len(r.chunk_offsets_us)) for r in b
        ]
    assert all(r.ok for r in runs["asyncio"]["good"].records)


STOP_SCRIPT = """
import sys
from servelab.client import PointRun, RequestSettings, run_point
from servelab.launch.server import raise_on_signals
raise_on_signals()
w = RequestSettings(base_url=sys.argv[1], model="m", max_tokens=4, request_timeout_s=30)
out = PointRun()
print("started", flush=True)
try:
    run_point(w, ["p"] * 4, 2, "x", out)
except KeyboardInterrupt as exc:
    print("interrupted", exc, len(out.records), flush=True)
    sys.exit(3)
print("completed", [r.error for r in out.records], flush=True)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_interrupts_the_point(sse_server: str, sig: int) -> None:
    """SIGTERM (snakemake stopping the job, or the job's watchdog) mid-stream must interrupt
    the point, not land in a read and be recorded as one failed request."""
    proc = subprocess.Popen(
        [sys.executable, "-c", STOP_SCRIPT, f"{sse_server}/slow"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
    time.sleep(1.0)  # both requests are mid-stream: one chunk in, the rest 5 s away
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 3, out
    assert out.startswith(f"interrupted signal {int(sig)} 0")


# --- the output's token ids (workload.record_output_ids) --------------------------------------


def test_payload_asks_for_token_ids_only_when_recording() -> None:
    off = json.loads(_payload(RequestSettings("http://h", "m", 4), "p"))
    assert "return_token_ids" not in off
    on = json.loads(_payload(RequestSettings("http://h", "m", 4, record_output_ids=True), "p"))
    assert on["return_token_ids"] is True
    assert {k: v for k, v in on.items() if k != "return_token_ids"} == off


def _ids_chunk(text: str, ids: list[int] | None, cum: int, **extra: object) -> bytes:
    """A content chunk as vLLM sends it with return_token_ids: the choice's token_ids are the
    tokens this chunk adds (`ids` None: the key left out)."""
    choice: dict[str, object] = {"index": 0, "text": text, "finish_reason": None, **extra}
    if ids is not None:
        choice["token_ids"] = ids
    msg = {"choices": [choice], "usage": {"prompt_tokens": 3, "completion_tokens": cum}}
    return b"data: " + json.dumps(msg).encode() + b"\n\n"


def _record_ids(*events: bytes, ids: bool = True) -> RequestRecord:
    rec = RequestRecord("r", 0)
    p = ResponseParser(rec, T0, ids)
    assert p.feed(sse_response(*events, USAGE, b"data: [DONE]\n\n"), T0 + 1000)
    assert rec.ok, rec.error
    return rec


def test_parser_gathers_the_token_ids_across_chunks() -> None:
    """A merged chunk's ids, an empty-text chunk's (a token held back), in order; the first
    chunk's prompt_token_ids are the prompt's, not the output's."""
    events = (
        _ids_chunk("a", [5], 1, prompt_token_ids=[1, 2, 3]),
        _ids_chunk("bc", [6, 7], 3),
        _ids_chunk("", [8], 4),
    )
    rec = _record_ids(*events)
    assert rec.output_ids == [5, 6, 7, 8] and rec.chunk_tokens == [1, 2, 1]
    assert rec.to_json()["output_ids"] == [5, 6, 7, 8]
    # not asked: nothing gathered, whatever the server sends
    assert _record_ids(*events, ids=False).output_ids is None


def test_parser_without_token_ids_records_none() -> None:
    """A server that returns no ids (an older vLLM), or a chunk without them or with anything
    but integers: the output's ids are unknown, and the request is still ok."""
    assert _record_ids(_ids_chunk("a", None, 1), _ids_chunk("b", None, 2)).output_ids is None
    assert _record_ids(_ids_chunk("a", [5], 1), _ids_chunk("b", None, 2)).output_ids is None
    assert _record_ids(_ids_chunk("a", None, 1), _ids_chunk("b", [6], 2)).output_ids is None
    assert _record_ids(_ids_chunk("a", [5], 1), _ids_chunk("b", ["6"], 2)).output_ids is None  # type: ignore[list-item]
    assert "output_ids" not in _record_ids(_ids_chunk("a", None, 1)).to_json()


def test_token_ids_over_a_socket() -> None:
    """The client asks the server for the ids only when recording, and each record keeps its
    reply's ids (tests/sse_servers.py ChatServer, completions as vLLM sends them)."""
    server = ChatServer()
    for base in serve_chat(server):
        on = RequestSettings(base, "m", 4, request_timeout_s=10, record_output_ids=True)
        run = run_point(on, ["p q", "r"], 2, "ids")
        assert [r.output_ids for r in run.records] == [reply_ids(4)] * 2
        assert all(r.ok and r.chunk_tokens == [1, 1, 1, 1] for r in run.records)
        off = run_point(RequestSettings(base, "m", 4, request_timeout_s=10), ["p"], 1, "no")
        assert off.records[0].ok and off.records[0].output_ids is None
    assert [b.get("return_token_ids") for b in server.bodies] == [True, True, None]
