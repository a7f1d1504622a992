"""The client against streams that bend or break the rules: the line endings, fields and
encodings the SSE standard allows, codings the client does not read, framing that must be
refused wherever the reads split it, and input built to cost memory or stack."""

from __future__ import annotations

import gzip
import json
import logging
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from sse_servers import RawServer, serve_raw

from servelab.client import RequestRecord, RequestSettings, ResponseParser, run_point
from servelab.client.parser import MAX_EVENT, MAX_HEAD

T0 = 1_000_000_000


def chunk(text: str, tokens: int) -> bytes:
    msg = {"choices": [{"index": 0, "text": text}], "usage": {"completion_tokens": tokens}}
    return json.dumps(msg).encode()


USAGE = b'{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}}'
DATA = [chunk("a", 1), chunk("", 2), chunk("c", 3), USAGE, b"[DONE]"]


def events(eol: bytes = b"\n", data: list[bytes] = DATA) -> list[bytes]:
    return [b"data: " + d + eol + eol for d in data]


def response(body_pieces: list[bytes], head: bytes = b"", chunked: bool = True) -> bytes:
    if not chunked:
        body = b"".join(body_pieces)
        return b"HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body)
    framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in body_pieces if p)
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n" + head + b"\r\n" + framed + b"0\r\n\r\n"
    )


def parse(reads: list[bytes]) -> tuple[RequestRecord, ResponseParser]:
    """Read i arrives at i ms; the connection closes after the last read."""
    rec = RequestRecord("r", 0)
    p = ResponseParser(rec, T0)
    for i, data in enumerate(reads):
        if p.feed(data, T0 + i * 1_000_000):
            break
    else:
        p.eof(T0 + len(reads) * 1_000_000)
    return rec, p


def outcome(rec: RequestRecord) -> tuple[object, ...]:
    return (rec.ok, rec.error, rec.chunk_offsets_us, rec.chunk_tokens, rec.empty_chunks,
            rec.output_tokens, rec.done_offset_us)  # fmt: skip


def splits(raw: bytes) -> Iterator[list[bytes]]:
    """The response whole, a byte per read, and cut in two at every point."""
    yield [raw]
    yield [raw[i : i + 1] for i in range(len(raw))]
    for cut in range(1, len(raw)):
        yield [raw[:cut], raw[cut:]]


def same_everywhere(raw: bytes) -> RequestRecord:
    """Parse `raw` under every split; the outcome must not depend on them (only the times
    do: each read's arrival stamps the events it completes)."""
    first, _ = parse([raw])
    for reads in splits(raw):
        rec, _ = parse(reads)
        assert (rec.ok, rec.error, len(rec.chunk_offsets_us), rec.chunk_tokens,
                rec.empty_chunks) == (first.ok, first.error, len(first.chunk_offsets_us),
                                      first.chunk_tokens, first.empty_chunks), reads  # fmt: skip
    return first


# --- what the SSE standard allows ------------------------------------------------------------


@pytest.mark.parametrize("eol", [b"\r\n", b"\r", b"\n"])
def test_every_line_ending_reads_the_same(eol: bytes) -> None:
    """sse-starlette's default separator is CRLF; CR alone is allowed too."""
    rec = same_everywhere(response(events(eol)))
    assert rec.ok, rec.error
    assert rec.chunk_tokens == [1, 1, 1] and rec.empty_chunks == [1] and rec.output_tokens == 3


def test_mixed_line_endings_and_a_crlf_split_between_chunks() -> None:
    body = b"".join(events(b"\r\n"))
    # every CRLF cut between two chunks of the body: CR ends a line, the LF must not end another
    cuts = [i + 1 for i in range(len(body)) if body[i : i + 2] == b"\r\n"]
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    rec = same_everywhere(response(pieces))
    assert rec.ok and len(rec.chunk_offsets_us) == 3, rec.error
    mixed = b"data: " + DATA[0] + b"\r\rdata: " + DATA[1] + b"\n\r\n" + b"".join(events()[2:])
    rec = same_everywhere(response([mixed]))
    assert rec.ok and len(rec.chunk_offsets_us) == 3, rec.error


def test_multi_line_data_is_joined_with_lf() -> None:
    obj = (
        b'{"choices":\ndata: [{"index": 0, "text": "a"}],\ndata:"usage": {"completion_tokens": 1}}'
    )
    rec = same_everywhere(response([b"data: " + obj + b"\n\n", *events()[3:]]))
    assert rec.ok and rec.chunk_tokens == [1] and rec.empty_chunks == [], rec.error


def test_events_without_data_are_skipped() -> None:
    blank = [b"data:\n\n", b"data: \n\n", b"data:\ndata:\n\n", b"event: ping\n\n", b": hi\n\n"]
    rec = same_everywhere(response([*blank, *events()]))
    assert rec.ok and len(rec.chunk_offsets_us) == 3, rec.error


def test_other_fields_and_comments_are_ignored() -> None:
    body = b"retry: 100\nid: 7\nevent: message\n:comment\nfield-without-colon\n" + events()[0]
    rec = same_everywhere(response([body, *events()[1:]]))
    assert rec.ok and len(rec.chunk_offsets_us) == 3, rec.error


def test_a_leading_byte_order_mark_is_dropped() -> None:
    plain, _ = parse([response(events())])
    for pieces in ([b"\xef\xbb\xbf" + events()[0]], [b"\xef", b"\xbb", b"\xbf" + events()[0]]):
        rec = same_everywhere(response([*pieces, *events()[1:]]))
        assert rec.ok and rec.chunk_offsets_us == plain.chunk_offsets_us, rec.error
    # the first event is counted: its time is the TTFT
    raw = response([b"\xef\xbb\xbf" + events()[0]])
    rec, _ = parse([raw[:-5], raw[-5:]])
    assert rec.chunk_offsets_us == [0]
    # only at the start of the stream: a BOM later is part of a field name
    rec, _ = parse([response([events()[0], b"\xef\xbb\xbf" + events()[1], *events()[2:]])])
    assert rec.ok and len(rec.chunk_offsets_us) == 2


def test_data_that_is_not_utf8_is_decoded_with_replacement() -> None:
    text = b'data: {"choices": [{"text": "\xff\xfe"}], "usage": {"completion_tokens": 1}}\n\n'
    rec = same_everywhere(response([text, *events()[3:]]))
    assert rec.ok and rec.chunk_tokens == [1], rec.error


# --- what the client bounds or refuses -------------------------------------------------------


def test_an_unfinished_event_is_bounded() -> None:
    half = b"data: " + b"x" * (MAX_EVENT // 2) + b"\n"
    rec, p = parse([response([half, half, half])])
    assert not rec.ok and rec.error is not None
    assert f"an event longer than {MAX_EVENT} bytes without its end" in rec.error
    assert not p.reusable
    # one line that never ends, fed in small reads: refused as soon as it passes the bound
    raw = response([b"data: " + b"y" * (MAX_EVENT + 10)])
    reads = [raw[i : i + 4096] for i in range(0, len(raw), 4096)]
    rec, p = parse(reads)
    assert rec.error is not None and "without its end" in rec.error
    # just under the bound is read
    big = chunk("z" * (MAX_EVENT - 200), 1)
    rec, _ = parse([response([b"data: " + big + b"\n\n", *events()[3:]])])
    assert rec.ok and rec.chunk_tokens == [1], rec.error


@pytest.mark.parametrize(
    "head",
    [b"Content-Encoding: gzip\r\n", b"Content-Encoding: br\r\n"],
)
def test_a_content_coding_is_refused_with_a_clear_error(head: bytes) -> None:
    body = gzip.compress(b"".join(events()), mtime=0)
    rec = same_everywhere(response([body], head=head))
    assert not rec.ok and rec.error is not None
    coding = head.split(b": ")[1].strip().decode()
    assert f"the body is encoded ({coding})" in rec.error and "identity" in rec.error


def test_a_transfer_coding_other_than_chunked_is_refused() -> None:
    raw = response(events()).replace(
        b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip, chunked"
    )
    rec = same_everywhere(raw)
    assert rec.error is not None and "the body is encoded (gzip)" in rec.error


def test_identity_coding_is_read() -> None:
    rec = same_everywhere(response(events(), head=b"Content-Encoding: identity\r\n"))
    assert rec.ok, rec.error


def test_deeply_nested_json_fails_the_request_not_the_client() -> None:
    deep = b"data: " + b'{"a":' * 200_000 + b"1" + b"}" * 200_000 + b"\n\n"
    rec, p = parse([response([events()[0], deep])])
    assert not rec.ok and rec.error == "malformed stream: JSON nested too deeply to read"
    assert len(rec.chunk_offsets_us) == 1 and not p.reusable
    rec, _ = parse([response([b"data: " + b"[" * 200_000 + b"\n\n"])])
    assert rec.error == "malformed stream: JSON nested too deeply to read"


@pytest.mark.parametrize("size", [b"0x%x", b"+%x", b"%x_", b" %x", b"%x "])
def test_a_malformed_chunk_size_is_refused_however_the_reads_split(size: bytes) -> None:
    body = events()[0]
    raw = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + size % len(body) + b"\r\n" + body + b"\r\n0\r\n\r\n"
    )  # fmt: skip
    rec = same_everywhere(raw)
    assert not rec.ok and rec.error is not None
    assert rec.error.startswith("malformed response: Invalid character in chunk size"), rec.error


@pytest.mark.parametrize("extra", [MAX_HEAD, 200_000])
def test_a_head_past_the_bound_is_refused_however_the_reads_split(extra: int) -> None:
    raw = response(events(), head=b"X-Big: " + b"a" * extra + b"\r\n")
    for reads in ([raw], [raw[i : i + 1000] for i in range(0, len(raw), 1000)],
                  [raw[:MAX_HEAD - 1], raw[MAX_HEAD - 1 :]]):  # fmt: skip
        rec, p = parse(reads)
        assert rec.error == f"malformed response: response head longer than {MAX_HEAD} bytes"
    ok = response(events(), head=b"X-Big: " + b"a" * (MAX_HEAD - 200) + b"\r\n")
    for reads in ([ok], [ok[i : i + 999] for i in range(0, len(ok), 999)]):
        rec, _ = parse(reads)
        assert rec.ok, rec.error


# --- any split of the same bytes gives the same records (property-based) ----------------------

LINE_ENDS = st.sampled_from([b"\n", b"\r\n", b"\r"])
# two line ends, an event's end (CR then LF would be one CRLF, so not that pair)
EVENT_ENDS = st.sampled_from(
    [b"\n\n", b"\r\n\r\n", b"\r\r", b"\n\r", b"\n\r\n", b"\r\n\n", b"\r\r\n"]
)


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, int]:
    """A valid event stream built from the standard's variety, and its number of chunks."""
    n = draw(st.integers(1, 6))
    out = [b"\xef\xbb\xbf"] if draw(st.booleans()) else []
    for i in range(n):
        if draw(st.booleans()):
            out.append(b": comment" + draw(LINE_ENDS))
        if draw(st.booleans()):
            out.append(b"event: message" + draw(LINE_ENDS) + b"id: %d" % i + draw(LINE_ENDS))
        text = json.dumps(draw(st.text(max_size=5)))
        body = b'{"choices": [{"index": 0, "text": %s}], "usage": {"completion_tokens": %d}}' % (
            text.encode(), i + 1)  # fmt: skip
        if draw(st.booleans()):  # split over data lines at a place JSON allows a line break
            out.append(b'data: {"choices":' + draw(LINE_ENDS) + b"data:" + body[12:])
        else:
            out.append(b"data: " + body)
        out.append(draw(EVENT_ENDS))
        if draw(st.booleans()):
            out.append(b"data:" + draw(LINE_ENDS) * 2)  # an event without data
    out.append(b"data: " + USAGE + draw(LINE_ENDS) * 2 + b"data: [DONE]" + draw(LINE_ENDS) * 2)
    return b"".join(out), n


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    stream=streams(),
    chunk_cuts=st.lists(st.integers(1, 400), max_size=8),
    read_cuts=st.lists(st.integers(1, 600), max_size=12),
    chunked=st.booleans(),
)
def test_any_split_into_chunks_and_reads_gives_the_same_records(
    stream: tuple[bytes, int], chunk_cuts: list[int], read_cuts: list[int], chunked: bool
) -> None:
    body, n = stream
    cuts = sorted({c for c in chunk_cuts if c < len(body)})
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    raw = response(pieces, chunked=chunked)
    whole, _ = parse([raw])
    assert whole.ok, (whole.error, raw)
    assert len(whole.chunk_offsets_us) == n and whole.chunk_tokens == [1] * n
    rc = sorted({c for c in read_cuts if c < len(raw)})
    reads = [raw[a:b] for a, b in zip([0, *rc], [*rc, len(raw)], strict=True)]
    rec, _ = parse(reads)
    # the same records; each chunk stamped with the read that completed its event
    assert outcome(rec)[:2] == outcome(whole)[:2] and rec.chunk_tokens == whole.chunk_tokens
    assert rec.empty_chunks == whole.empty_chunks and rec.output_tokens == whole.output_tokens
    ends = []  # the arrival (ms index of the read) of the last byte of each content event
    pos = 0
    for i, r in enumerate(reads):
        pos += len(r)
        ends.append((pos, i))
    assert rec.chunk_offsets_us == sorted(rec.chunk_offsets_us)
    assert {o // 1000 for o in rec.chunk_offsets_us} <= {i for _, i in ends}


@settings(max_examples=150, deadline=None)
@given(junk=st.binary(max_size=300), read_cuts=st.lists(st.integers(1, 400), max_size=10))
def test_arbitrary_bytes_never_escape_as_an_exception(junk: bytes, read_cuts: list[int]) -> None:
    """Whatever the body, the outcome is a record (ok or with its reason), the same for any
    split of the reads."""
    for raw in (response([junk]), b"HTTP/1.1 200 OK\r\n" + junk, junk):
        whole, _ = parse([raw])
        rc = sorted({c for c in read_cuts if c < len(raw)})
        rec, _ = parse([raw[a:b] for a, b in zip([0, *rc], [*rc, len(raw)], strict=True)])
        assert (rec.ok, rec.error, len(rec.chunk_offsets_us)) == (
            whole.ok, whole.error, len(whole.chunk_offsets_us))  # fmt: skip
        assert rec.ok or rec.error


# --- the same cases from scripted servers on 127.0.0.1 ---------------------------------------


@pytest.fixture(scope="module")
def raw_server() -> Iterator[tuple[str, RawServer]]:
    yield from serve_raw()


def run(
    base: str, srv: RawServer, name: str, script: list[bytes | float], n: int = 2
) -> list[RequestRecord]:
    srv.scripts[f"/{name}/v1/completions"] = script
    w = RequestSettings(base_url=f"{base}/{name}", model="m", max_tokens=4, request_timeout_s=10)
    return run_point(w, ["p"] * n, 1, name).records


def paced(raw: bytes, size: int) -> list[bytes | float]:
    """`raw` written `size` bytes at a time, each its own read at the client."""
    return [x for i in range(0, len(raw), size) for x in (raw[i : i + size], 0.002)]


def test_scripted_servers_each_case(
    raw_server: tuple[str, RawServer], caplog: pytest.LogCaptureFixture
) -> None:
    base, srv = raw_server
    caplog.set_level(logging.ERROR)
    ok_cases = {
        "crlf": response(events(b"\r\n")),
        "cr": response(events(b"\r")),
        "multiline": response(
            [
                b'data: {"choices":\r\ndata: [{"text": "a"}], "usage": '
                b'{"completion_tokens": 1}}\r\n\r\n',
                *events()[3:],
            ]
        ),  # fmt: skip
        "emptydata": response([b"data:\n\n", *events()]),
        "bom": response([b"\xef\xbb\xbf" + events()[0], *events()[1:]]),
    }
    for name, raw in ok_cases.items():
        recs = run(base, srv, name, paced(raw, 7))
        assert all(r.ok for r in recs), (name, [r.error for r in recs])
    bad_cases = {
        "gzip": (response([gzip.compress(b"".join(events()))], head=b"Content-Encoding: gzip\r\n"),
                 "the body is encoded (gzip)"),
        "deep": (response([b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n\n"]),
                 "malformed stream: JSON nested too deeply to read"),
        "hexsize": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x1a\r\n",
                    "Invalid character in chunk size"),
        "bighead": (response(events(), head=b"X: " + b"a" * 200_000 + b"\r\n"),
                    "response head longer than"),
        "endless": (response([b"data: " + b"x" * (MAX_EVENT + 1)]), "without its end"),
    }  # fmt: skip
    for name, (raw, error) in bad_cases.items():
        recs = run(base, srv, name, paced(raw, 65536))
        assert all(r.error and error in r.error for r in recs), (name, [r.error for r in recs])
    # the client asked for no coding, and no transport logged a fatal error along the way
    assert all(h.get("accept-encoding") == "identity" for _, h in srv.requests)
    assert not [r for r in caplog.records if "Fatal error" in r.getMessage()]
    # a failed request does not poison the next one on a fresh connection
    assert all(r.ok for r in run(base, srv, "crlf", [response(events(b"\r\n"))]))
