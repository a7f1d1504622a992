"""Multi-turn chat in the client (client.chat): a conversation's turns go over chat completions
with the history re-sent, in order, think time apart; the chat chunk format is read (a
role-only first chunk is no token); each turn has its record, and a failed turn ends its
conversation with the turns after it recorded, not sent. Against a small chat server
(tests/sse_servers.py ChatServer) and, for the parser, responses fed by hand."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from sse_servers import ChatServer, chat_event, chat_reply, reply_ids, serve_chat

from servelab.client import (
    ChatResponseParser,
    Conversation,
    Item,
    OpenLoop,
    PointRun,
    Prompt,
    RequestRecord,
    RequestSettings,
    run_point,
)
from servelab.client.chat import Talk, chat_target, turn_id
from servelab.client.closed_loop import _chat_payload
from servelab.client.connection import Target
from servelab.metrics import request_latencies

TOKENS = 3
FIRST_S = 0.03  # the server's time from the role-only chunk to the first content chunk


@pytest.fixture(scope="module")
def chat() -> Iterator[tuple[str, ChatServer]]:
    server = ChatServer(first_s=FIRST_S, gap_s=0.002)
    for base in serve_chat(server):
        yield base, server


def wl(base: str, think_s: float = 0.0, **kw: Any) -> RequestSettings:
    return RequestSettings(base, "m", TOKENS, request_timeout_s=10, think_time_s=think_s, **kw)


def conv(n: int, turns: int = 3, system: str | None = "be brief", fail: int = 0) -> Conversation:
    """Conversation n: `turns` user turns; turn `fail` (from 1; 0: none) makes the server
    answer HTTP 500."""
    texts = [f"c{n} turn {k}" + (" FAIL" if k == fail else "") for k in range(1, turns + 1)]
    return Conversation(tuple(Prompt(t) for t in texts), system)


def end_ns(r: RequestRecord) -> int:
    assert r.done_offset_us is not None
    return r.sent_epoch_ns + r.done_offset_us * 1000


def by_conversation(records: list[RequestRecord]) -> dict[int, list[RequestRecord]]:
    out: dict[int, list[RequestRecord]] = {}
    for r in records:
        assert r.conversation is not None
        out.setdefault(r.conversation, []).append(r)
    return out


def bodies_of(server: ChatServer, tag: str) -> list[dict[str, Any]]:
    """The request bodies whose first user message starts with `tag` (one conversation's)."""
    return [b for b in server.bodies if "messages" in b and _first_user(b).startswith(tag + " ")]


def _first_user(body: dict[str, Any]) -> str:
    return next(str(m["content"]) for m in body["messages"] if m["role"] == "user")


# --- the request ---------------------------------------------------------------------------


def test_chat_target_and_payload() -> None:
    target = chat_target(Target.of("http://h:8000/prefix"))
    assert target.path == "/prefix/v1/chat/completions" and target.port == 8000
    assert chat_target(Target.of("http://h")).path == "/v1/chat/completions"
    messages = [{"role": "user", "content": "hi"}]
    body = json.loads(_chat_payload(wl("http://h"), messages, Prompt("hi", max_tokens=7)))
    assert body == {
        "model": "m",
        "messages": messages,
        "max_tokens": 7,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "ignore_eos": True,
    }
    plain = json.loads(_chat_payload(wl("http://h", ignore_eos=False), messages, Prompt("hi")))
    assert plain["max_tokens"] == TOKENS and "ignore_eos" not in plain
    with pytest.raises(ValueError, match="no max_tokens"):
        _chat_payload(RequestSettings("http://h", "m", None), messages, Prompt("hi"))


def test_turn_ids_sort_by_conversation_then_turn() -> None:
    assert turn_id("sc-r01-c0002", 7, 2, 3) == "sc-r01-c0002-00007-t2"
    ids = [turn_id("l", i, k, 12) for i in (0, 1) for k in range(1, 13)]
    assert ids == sorted(ids) and ids[0] == "l-00000-t01" and ids[-1] == "l-00001-t12"


def test_talk_builds_the_history_and_the_records() -> None:
    c = Conversation((Prompt("a", max_tokens=5, input_tokens=1), Prompt("b")), "sys", prefix=2)
    talk = Talk(c, "l", 4)
    assert talk.next_turn().text == "a"
    assert talk.messages() == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "a"},
    ]
    rec = talk.record(123)
    assert (rec.request_id, rec.sent_epoch_ns, rec.conversation, rec.turn) == ("l-00004-t1", 123,
                                                                             4, 1)  # fmt: skip
    assert (rec.max_tokens, rec.input_tokens, rec.prefix) == (5, 1, 2)
    talk.answer("A")
    talk.next_turn()
    assert [m["role"] for m in talk.messages()] == ["system", "user", "assistant", "user"]
    assert talk.over
    with pytest.raises(ValueError, match="without turns"):
        Conversation(())


# --- the chat chunk format, fed by hand ------------------------------------------------------

T0 = 1_000_000_000


def vllm_chat_stream(pieces: list[str], role_tokens: int = 0, role_content: str = "") -> bytes:
    """A chat response as vLLM streams it with continuous usage stats."""
    events = [
        chat_event({"choices": [{"index": 0, "delta": {"role": "assistant",
                                                          "content": role_content}}],
                    "usage": {"prompt_tokens": 9, "completion_tokens": role_tokens}}),
    ]  # fmt: skip
    for k, piece in enumerate(pieces, role_tokens + 1):
        delta = {"content": piece} if piece is not None else {}
        events.append(chat_event({"choices": [{"index": 0, "delta": delta}],
                                  "usage": {"prompt_tokens": 9, "completion_tokens": k}}))  # fmt: skip
    n = role_tokens + len(pieces)
    events.append(chat_event({"choices": [], "usage": {"prompt_tokens": 9,
                                                      "completion_tokens": n}}))  # fmt: skip
    events.append(b"data: [DONE]\n\n")
    framed = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + framed + b"0\r\n\r\n"


def feed_events(raw: bytes) -> ChatResponseParser:
    """Feed `raw` one event per read, read i arriving i ms after T0."""
    parser = ChatResponseParser(RequestRecord("r", 0), T0)
    cuts = [0] + [i + 2 for i in range(len(raw)) if raw.startswith(b"\n\n", i)] + [len(raw)]
    for k, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False)):
        parser.feed(raw[a:b], T0 + k * 1_000_000)
    assert parser.finished
    return parser


def test_role_only_first_chunk_is_no_token() -> None:
    p = feed_events(vllm_chat_stream(["Hel", "lo", "!"]))
    rec = p.rec
    assert rec.ok and rec.error is None
    # the role chunk arrived in read 0; the content chunks in reads 1, 2, 3 (µs after T0)
    assert rec.chunk_offsets_us == [1000, 2000, 3000]
    assert rec.chunk_tokens == [1, 1, 1] and rec.empty_chunks == []
    assert (rec.prompt_tokens, rec.output_tokens) == (9, 3)
    assert p.reply_text() == "Hello!"
    assert request_latencies(rec)["ttft"] == 1.0  # ms: the first content chunk's


def test_chat_reads_split_anywhere_give_the_same_record() -> None:
    raw = vllm_chat_stream(["Hel", "lo"])
    whole = feed_events(raw)
    for cut in range(1, len(raw)):
        p = ChatResponseParser(RequestRecord("r", 0), T0)
        p.feed(raw[:cut], T0)
        assert p.feed(raw[cut:], T0 + 1000), cut
        assert p.rec.ok and len(p.rec.chunk_offsets_us) == 2, cut
        assert p.reply_text() == whole.reply_text() == "Hello", cut
        assert p.rec.chunk_tokens == [1, 1] and p.rec.output_tokens == 2, cut


def test_empty_content_chunks_and_a_role_chunk_with_text() -> None:
    # an empty content chunk before the text (e.g. a token held back): a chunk in empty_chunks,
    # with its token; TTFT at it (it carried a token), as for completions
    p = feed_events(vllm_chat_stream(["", "a", None]))  # type: ignore[list-item]
    assert p.rec.ok and p.rec.chunk_offsets_us == [1000, 2000, 3000]
    assert p.rec.empty_chunks == [0, 2] and p.rec.chunk_tokens == [1, 1, 1]
    assert p.reply_text() == "a"
    # a first chunk that carries the role and text (or a token) is a content chunk
    p = feed_events(vllm_chat_stream(["b"], role_tokens=1, role_content="a"))
    assert p.rec.chunk_offsets_us == [0, 1000] and p.reply_text() == "ab"
    assert p.rec.chunk_tokens == [1, 1] and p.rec.output_tokens == 2
    p = feed_events(vllm_chat_stream(["b"], role_tokens=1))
    assert p.rec.chunk_offsets_us == [0, 1000] and p.rec.empty_chunks == [0]


def test_a_chat_stream_without_content_or_with_an_error_fails() -> None:
    p = feed_events(vllm_chat_stream([]))
    assert not p.rec.ok and p.rec.error == "stream carried no content chunks"
    assert p.rec.prompt_tokens == 9 and p.rec.output_tokens == 0
    err = chat_event({"error": {"message": "too long", "code": 400}})
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(err), err)
    p = ChatResponseParser(RequestRecord("r", 0), T0)
    assert p.feed(raw, T0) and p.rec.error == "stream error: too long"


def test_the_completions_parser_is_unchanged_by_chat() -> None:
    """A completions chunk read by the chat parser has no delta: an empty chunk, no reply."""
    p = feed_events(vllm_chat_stream(["x"]).replace(b'"delta":{"content":"x"}', b'"text":"x"'))
    assert p.rec.chunk_offsets_us == [1000] and p.rec.empty_chunks == [0]
    assert p.reply_text() == ""


# --- conversations over a socket -------------------------------------------------------------


def check_history(server: ChatServer, tag: str, turns: int, system: bool) -> None:
    """The conversation's requests: turn k carries 2k - 1 messages (+ the system message),
    the assistant messages the server's own replies (ChatServer.bad)."""
    bodies = bodies_of(server, tag)
    assert [len(b["messages"]) for b in bodies] == [2 * k - 1 + system for k in
                                                    range(1, turns + 1)]  # fmt: skip
    for k, b in enumerate(bodies, 1):
        roles = [m["role"] for m in b["messages"]]
        assert roles == ["system"] * system + ["user", "assistant"] * (k - 1) + ["user"]
        assert b["messages"][-1]["content"] == f"{tag} turn {k}"
        for j, m in enumerate(b["messages"]):  # each reply carried back as it was streamed
            if m["role"] == "assistant":
                assert m["content"] == "".join(chat_reply(b["messages"][:j], TOKENS))
        assert b["max_tokens"] == TOKENS and b["stream"] is True


def test_closed_loop_sends_each_turn_with_its_history(chat: tuple[str, ChatServer]) -> None:
    base, server = chat
    items: list[Item] = [conv(0), conv(1, system=None), conv(2, turns=1)]
    run = run_point(wl(base), items, 2, "cl")
    ids = [f"cl-00000-t{k}" for k in (1, 2, 3)] + [f"cl-00001-t{k}" for k in (1, 2, 3)]
    assert [r.request_id for r in run.records] == [*ids, "cl-00002-t1"]
    assert all(r.ok and r.http_status == 200 for r in run.records), run.records
    assert [(r.conversation, r.turn) for r in run.records] == [
        (0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3), (2, 1)
    ]  # fmt: skip
    assert server.bad == []
    assert set(server.paths) == {"/v1/chat/completions"}
    check_history(server, "c0", 3, system=True)
    check_history(server, "c1", 3, system=False)
    for r in run.records:
        assert r.output_tokens == TOKENS and len(r.chunk_offsets_us) == TOKENS
        # the role chunk came at once, the first content chunk FIRST_S later: TTFT is that
        assert r.first_byte_offset_us is not None
        assert request_latencies(r)["ttft"] >= FIRST_S * 1000 * 0.9
        assert r.chunk_offsets_us[0] - r.first_byte_offset_us >= FIRST_S * 1e6 * 0.9
        assert r.send_slip_us is None and r.max_tokens is None
    # prompt tokens grow with the history (the server counts words)
    conv0 = by_conversation(run.records)[0]
    assert [r.prompt_tokens for r in conv0] == sorted({r.prompt_tokens for r in conv0})
    # a row carries conversation and turn; a prompt's row does not
    row = run.records[0].to_json()
    assert (row["conversation"], row["turn"]) == (0, 1)
    assert RequestRecord.from_json(row) == run.records[0]


def test_think_time_is_kept_between_a_reply_and_the_next_turn(
    chat: tuple[str, ChatServer],
) -> None:
    base, _ = chat
    think = 0.05
    run = run_point(wl(base, think), [conv(10), conv(11)], 2, "th")
    assert all(r.ok for r in run.records)
    for turns in by_conversation(run.records).values():
        assert turns[0].queued_us is not None and 0 <= turns[0].queued_us < 50_000
        for prev, nxt in zip(turns, turns[1:], strict=False):
            assert nxt.queued_us is None  # later turns wait on purpose
            gap = nxt.sent_epoch_ns - end_ns(prev)
            assert think * 1e9 - 1000 <= gap < think * 1e9 + 200e6, gap
    # two conversations in flight at once: their first turns overlap
    c10, c11 = (by_conversation(run.records)[k] for k in (0, 1))
    assert c11[0].sent_epoch_ns < end_ns(c10[0])


def test_one_slot_runs_the_conversations_one_after_another(
    chat: tuple[str, ChatServer],
) -> None:
    base, _ = chat
    run = run_point(wl(base, 0.01), [conv(20, turns=2), conv(21, turns=2)], 1, "one")
    a, b = by_conversation(run.records)[0], by_conversation(run.records)[1]
    assert b[0].sent_epoch_ns >= end_ns(a[-1]) - 1000  # the slot holds a conversation whole
    assert b[0].queued_us is not None and b[0].queued_us < 50_000


def test_a_failed_turn_ends_its_conversation(chat: tuple[str, ChatServer]) -> None:
    base, server = chat
    run = run_point(wl(base), [conv(30, turns=4, fail=2), conv(31)], 2, "f")
    rows = by_conversation(run.records)
    failed = rows[0]
    assert [r.request_id for r in failed] == [f"f-00000-t{k}" for k in (1, 2, 3, 4)]
    assert [r.ok for r in failed] == [True, False, False, False]
    assert failed[1].http_status == 500 and failed[1].error == "HTTP 500: no such turn"
    for r in failed[2:]:
        assert r.error == "not sent: turn 2 failed" and r.http_status is None
        assert r.chunk_offsets_us == [] and r.done_offset_us is None
        # recorded at the failed turn's end, on the point's clock
        assert failed[1].sent_epoch_ns < r.sent_epoch_ns <= run.finished_epoch_ns
        assert r.turn is not None and r.conversation == 0
    assert len(bodies_of(server, "c30")) == 2  # turns 3 and 4 were never sent
    assert all(r.ok for r in rows[1])  # the other conversation is untouched


def test_a_refused_connection_fails_turn_one_and_the_rest() -> None:
    run = run_point(wl("http://127.0.0.1:9"), [conv(40)], 1, "x")
    assert [r.error is not None and not r.ok for r in run.records] == [True] * 3
    assert run.records[0].error is not None and "Connect to 127.0.0.1:9" in run.records[0].error
    assert [r.error for r in run.records[1:]] == ["not sent: turn 1 failed"] * 2


class Marks:
    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def start(self, index: int) -> int:
        self.events.append(("start", index))
        return index

    def end(self, token: Any) -> None:
        self.events.append(("end", token))


def test_marks_go_around_each_turn(chat: tuple[str, ChatServer]) -> None:
    base, _ = chat
    marks = Marks()
    run = run_point(wl(base), [conv(50, turns=2)], 1, "m", marks=marks)
    assert len(run.records) == 2
    assert marks.events == [("start", 0), ("end", 0), ("start", 0), ("end", 0)]


def test_open_loop_later_turns_are_due_after_the_reply_and_think_time(
    chat: tuple[str, ChatServer],
) -> None:
    base, _ = chat
    think = 0.04
    plan = OpenLoop((0, 20_000_000))
    run = run_point(wl(base, think), [conv(60), conv(61)], plan, "o")
    rows = by_conversation(run.records)
    assert all(r.ok for r in run.records) and len(run.records) == 6
    for i, turns in rows.items():
        # turn 1 at its scheduled time, exactly: the point's start + its offset
        assert turns[0].sent_epoch_ns == run.started_epoch_ns + plan.offsets_ns[i]
        for prev, nxt in zip(turns, turns[1:], strict=False):
            due = end_ns(prev) + round(think * 1e9)  # (end_ns is to the µs, rounded down)
            assert 0 <= nxt.sent_epoch_ns - due < 1000, (nxt.sent_epoch_ns, due)
        for r in turns:  # each later turn's times count from its due time
            assert r.send_slip_us is not None and r.send_slip_us >= 0
            assert r.queued_us is None
            assert r.first_byte_offset_us is not None
            assert r.first_byte_offset_us >= r.send_slip_us
    # sent on time: the typical turn well within the think time (a busy host's stall can
    # delay one by 100 ms; a turn that waited its think time twice would be 40 ms late)
    slips = sorted(r.send_slip_us for r in run.records)  # type: ignore[type-var]
    assert slips[len(slips) // 2] < 30_000, slips  # type: ignore[operator]


def test_open_loop_cap_counts_conversations(chat: tuple[str, ChatServer]) -> None:
    """With a cap of 1 the second conversation, due at once, waits for the first's end."""
    base, _ = chat
    run = run_point(wl(base, 0.01), [conv(70, turns=2), conv(71, turns=2)],
                         OpenLoop((0, 0), max_in_flight=1), "cap")  # fmt: skip
    a, b = by_conversation(run.records)[0], by_conversation(run.records)[1]
    assert all(r.ok for r in run.records)
    assert b[0].send_slip_us is not None
    assert b[0].sent_epoch_ns + b[0].send_slip_us * 1000 >= end_ns(a[-1]) - 1000


@pytest.mark.parametrize("kind", ["closed", "open"])
def test_two_workers_carry_conversations(chat: tuple[str, ChatServer], kind: str) -> None:
    base, server = chat
    first = 100 if kind == "closed" else 200
    items: list[Item] = [conv(first + n, turns=2) for n in range(5)]
    items.insert(2, Prompt("a plain prompt is no chat"))
    label = f"w{kind}"
    if kind == "closed":
        run = run_point(wl(base, 0.005), items, 3, label, workers=2)
    else:
        plan = OpenLoop(tuple(5_000_000 * i for i in range(len(items))))
        run = run_point(wl(base, 0.005), items, plan, label, workers=2)
    assert len(run.workers) == 2
    turns = [r for r in run.records if r.turn is not None]
    assert len(turns) == 10 and all(r.ok for r in run.records)
    expected = [f"{label}-{i:05d}-t{k}" for i in (0, 1, 3, 4, 5) for k in (1, 2)]
    assert [r.request_id for r in turns] == expected
    plain = [r for r in run.records if r.turn is None]
    assert [r.request_id for r in plain] == [f"{label}-00002"] and plain[0].conversation is None
    assert any(b.get("prompt") == "a plain prompt is no chat" for b in server.bodies)
    assert server.bad == []
    for n in range(5):
        check_history(server, f"c{first + n}", 2, system=True)
    if kind == "open":
        assert all(r.send_slip_us is not None for r in run.records)


def test_a_record_from_raw_data_without_chat_fields_reads_none() -> None:
    rec = RequestRecord("r", 1, turn=2, conversation=0)
    row = rec.to_json()
    assert list(row)[-2:] == ["conversation", "turn"]
    assert "conversation" not in RequestRecord("r", 1).to_json()
    back = RequestRecord.from_json({k: v for k, v in row.items() if k not in ("turn",)})
    assert back.turn is None and back.conversation == 0


def test_one_point_run_is_filled_in_place(chat: tuple[str, ChatServer]) -> None:
    base, _ = chat
    out = PointRun()
    got = run_point(wl(base), [conv(80, turns=1)], 1, "p", out)
    assert got is out and len(out.records) == 1 and out.records[0].ok


def test_each_turn_records_its_replys_token_ids(chat: tuple[str, ChatServer]) -> None:
    """With record_output_ids every turn asks for the ids and keeps its reply's, gathered over
    its content chunks; the role chunk's prompt_token_ids are not the output's. The history
    still carries the reply's text."""
    base, server = chat
    run = run_point(wl(base, record_output_ids=True), [conv(7, turns=2)], 1, "tok")
    assert [r.request_id for r in run.records] == ["tok-00000-t1", "tok-00000-t2"]
    assert [r.output_ids for r in run.records] == [reply_ids(TOKENS)] * 2
    assert all(r.ok and r.chunk_tokens == [1] * TOKENS for r in run.records)
    assert [b.get("return_token_ids") for b in bodies_of(server, "c7")] == [True, True]
    check_history(server, "c7", 2, system=True)
    body = json.loads(
        _chat_payload(wl("http://h", record_output_ids=True), [], Prompt("hi", max_tokens=2))
    )
    assert body["return_token_ids"] is True
