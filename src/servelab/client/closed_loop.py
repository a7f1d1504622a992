"""The closed loop: every item of a point sent, `concurrency` items in flight, one connection
per slot, each request's record collected as it ends.

An item is a prompt (one completions request) or a conversation (client.prompt.Conversation:
one chat completions request per turn, sent in order by the slot that took it, `think_time_s`
after the previous reply's end; client.chat). The concurrency counts items in flight: a slot
holds a conversation from its first turn's send to its last turn's end, think times included.

Times within a point are taken from one monotonic clock and bridged to the wall clock once, at
the start of the point, so `sent_epoch_ns + done_offset_us` of different requests compare
exactly. Failed requests (HTTP errors, broken streams, timeouts) are recorded with their
error, never dropped; a turn that fails ends its conversation, and the turns after it are
recorded as not sent.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypedDict

from servelab.client import chat
from servelab.client.connection import READ_SIZE, Connection, Target, perf_ns
from servelab.client.parser import ChatResponseParser, ResponseParser
from servelab.client.prompt import Conversation, Item, Prompt, PromptLike
from servelab.documents.declared import WorkerStats
from servelab.store.request import RequestRecord


@dataclass(frozen=True)
class RequestSettings:
    """How each request of a point is sent: the server's URL and served model, the tokens to
    generate (`max_tokens`, or each prompt's own), whether to ignore EOS, the temperature, the
    per-request timeout, a conversation's think time between turns, and whether to ask the
    server for the generated token ids (`record_output_ids`: vLLM's `return_token_ids`; each
    record's output_ids). What is sent (the prompts) and at what concurrency or rate are given
    beside it."""

    base_url: str
    model: str
    max_tokens: int | None  # None: every prompt gives its own (Prompt.max_tokens)
    ignore_eos: bool = True
    temperature: float = 0.0
    request_timeout_s: float = 300.0
    # a conversation's pause between a reply's end and its next turn's send (seconds)
    think_time_s: float = 0.0
    # ask for the output's token ids (workload.record_output_ids): RequestRecord.output_ids
    record_output_ids: bool = False


@dataclass
class PointRun:
    """What one run of a point measured; `records` fill in as requests finish."""

    records: list[RequestRecord] = field(default_factory=list)
    started_epoch_ns: int = 0
    finished_epoch_ns: int = 0
    client_cpu_s: float = 0.0
    # one entry per process that sent requests (worker_stats; client.workers): its requests,
    # CPU and wall seconds from the point's start to its end, and busy share = CPU / wall
    workers: list[WorkerStats] = field(default_factory=list)


class Clock:
    """The point's clock bridge: perf_counter ns `mono0` is wall-clock ns `epoch0`. `zero`
    gives both (another process's bridge: perf_counter is the system's CLOCK_MONOTONIC on
    Linux); else they are read now."""

    def __init__(self, zero: tuple[int, int] | None = None) -> None:
        if zero is None:
            zero = (time.time_ns(), time.perf_counter_ns())
        self.epoch0, self.mono0 = zero

    def epoch_of(self, mono_ns: int) -> int:
        return self.epoch0 + (mono_ns - self.mono0)


def _payload(w: RequestSettings, prompt: PromptLike) -> bytes:
    """The body of a completions request."""
    if isinstance(prompt, Prompt):
        return _body(w, {"prompt": prompt.text}, prompt.max_tokens)
    return _body(w, {"prompt": prompt}, None)


def _chat_payload(w: RequestSettings, messages: list[dict[str, str]], turn: Prompt) -> bytes:
    """The body of a chat completions request: one turn, with the conversation so far."""
    return _body(w, {"messages": messages}, turn.max_tokens)


class RequestInput(TypedDict, total=False):
    """What a request sends the model: a completion's prompt, or a chat turn's messages."""

    prompt: str
    messages: list[dict[str, str]]


class IgnoreEos(TypedDict, total=False):
    ignore_eos: bool  # sent only when the workload sets it


_IGNORE_EOS: IgnoreEos = {"ignore_eos": True}
_EOS_AS_IS: IgnoreEos = {}


class ReturnTokenIds(TypedDict, total=False):
    return_token_ids: bool  # sent only when the workload records the output's token ids


_TOKEN_IDS: ReturnTokenIds = {"return_token_ids": True}
_NO_TOKEN_IDS: ReturnTokenIds = {}


class RequestBody(RequestInput, IgnoreEos, ReturnTokenIds):
    """A completions or chat completions request's JSON body (`_body`), in the order sent."""

    model: str
    max_tokens: int
    temperature: float
    stream: bool
    stream_options: dict[str, bool]


def _body(w: RequestSettings, what: RequestInput, own_max_tokens: int | None) -> bytes:
    """A request's body: `what` (its prompt or messages) and the workload's settings, with the
    prompt's own max_tokens where it gives one."""
    max_tokens = own_max_tokens if own_max_tokens is not None else w.max_tokens
    if max_tokens is None:
        raise ValueError("no max_tokens: give RequestSettings.max_tokens or the prompt's own")
    body: RequestBody = {
        "model": w.model,
        **what,
        "max_tokens": max_tokens,
        "temperature": w.temperature,
        "stream": True,
        # usage in every chunk (cumulative completion_tokens): how many tokens each carried
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        **(_IGNORE_EOS if w.ignore_eos else _EOS_AS_IS),
        # vLLM's extension: each chunk's choice carries the token ids it adds (`token_ids`)
        **(_TOKEN_IDS if w.record_output_ids else _NO_TOKEN_IDS),
    }
    return json.dumps(body).encode("utf-8")


async def sleep_until(due: int) -> None:
    """Sleep until perf_counter ns `due`; never wakes before it (event loop timers may fire a
    little early: the rest is slept again)."""
    while (left := due - perf_ns()) > 0:
        await asyncio.sleep(left / 1e9)


class Connections(Protocol):
    """Where a request takes its connection from, and gives it back to (None: none to keep)."""

    def take(self) -> Connection | None: ...

    def give(self, conn: Connection | None) -> None: ...


class SlotConnection:
    """A closed-loop slot's one connection, kept from request to request."""

    def __init__(self, conn: Connection | None) -> None:
        self.conn = conn

    def take(self) -> Connection | None:
        conn, self.conn = self.conn, None
        return conn

    def give(self, conn: Connection | None) -> None:
        self.conn = conn


class RequestMarks(Protocol):
    """Marks around each request, e.g. NVTX ranges that a GPU profiler records."""

    def start(self, index: int) -> Any: ...

    def end(self, token: Any) -> None: ...


@dataclass(frozen=True)
class Sink:
    """Where a run's requests go: `label` starts their ids, `out` collects their records as
    they end, `marks` (None: none) go around each request, with its item's index."""

    label: str
    out: PointRun
    marks: RequestMarks | None = None


@dataclass(frozen=True)
class Sender:
    """What every request of one run (closed or open loop) is sent with: the server, the read
    buffer its connections share, the workload's settings and the run's clock."""

    target: Target
    view: memoryview
    w: RequestSettings
    clock: Clock

    async def one(
        self,
        conn: Connection | None,
        request_id: str,
        prompt: PromptLike,
        scheduled: int | None = None,
    ) -> tuple[RequestRecord, Connection | None, int]:
        """One request; returns its record, the connection to reuse (None: open a new one) and
        when the request was over (perf_counter ns: the read that ended its response, else the
        moment it failed). With `scheduled` (perf_counter ns: when it was due), the record's
        times count from then, and its send_slip_us is how late the send was."""
        request = self.target.request(request_id, _payload(self.w, prompt))
        sent = perf_ns()
        t0 = sent if scheduled is None else scheduled
        rec = RequestRecord(request_id=request_id, sent_epoch_ns=self.clock.epoch_of(t0))
        if scheduled is not None:
            rec.send_slip_us = (sent - scheduled) // 1000
        if isinstance(prompt, Prompt):
            rec.max_tokens = prompt.max_tokens
            rec.input_tokens = prompt.input_tokens
            rec.prefix = prompt.prefix
        parser = ResponseParser(rec, t0, self.w.record_output_ids)
        conn, ended = await self.exchange(conn, request, parser)
        return rec, conn, ended

    async def exchange(
        self, conn: Connection | None, request: bytes, parser: ResponseParser
    ) -> tuple[Connection | None, int]:
        """Send `request` on `conn` (a fresh connection when None or lost) and read its response
        into `parser`'s record; returns the connection to reuse (None: open a new one) and when
        the request was over (perf_counter ns)."""
        target, w, rec = self.target, self.w, parser.rec
        try:
            async with asyncio.timeout(w.request_timeout_s):
                if conn is None or conn.lost:
                    conn = None
                    conn = await target.connect(self.view)
                await conn.send(request, parser)
        except TimeoutError:
            if conn is not None:
                conn.close(abort=True)
            if not parser.finished:  # (a response that ended just as the deadline passed stands)
                rec.error = f"timeout after {w.request_timeout_s:g} s"
            return None, parser.ended or perf_ns()
        except OSError as exc:
            where = f"{target.host}:{target.port}"
            rec.error = f"Connect to {where} failed: {type(exc).__name__}: {exc}"[:300]
            return None, perf_ns()
        return (None if conn.lost else conn), parser.ended or perf_ns()

    async def turn(
        self, conns: Connections, talk: chat.Talk, scheduled: int | None
    ) -> tuple[RequestRecord, str, int]:
        """The next turn of a conversation, over chat completions with its history; returns its
        record, the reply's text and when it was over (perf_counter ns). `scheduled`: as for
        `one`."""
        turn = talk.next_turn()
        request_id = talk.request_id()
        request = self.chat_target.request(request_id, _chat_payload(self.w, talk.messages(), turn))
        sent = perf_ns()
        t0 = sent if scheduled is None else scheduled
        rec = talk.record(self.clock.epoch_of(t0))
        if scheduled is not None:
            rec.send_slip_us = (sent - scheduled) // 1000
        parser = ChatResponseParser(rec, t0, self.w.record_output_ids)
        conn = conns.take()
        try:
            conn, ended = await self.exchange(conn, request, parser)
        finally:  # (cancelled: the connection goes back to be closed with the others)
            conns.give(conn)
        return rec, parser.reply_text(), ended

    async def converse(
        self, conns: Connections, i: int, conv: Conversation, sink: Sink, due: int | None = None
    ) -> tuple[RequestRecord, int]:
        """Every turn of conversation `i`, in order, each `think_time_s` after the previous
        reply's end, its record in `sink.out` as it ends; returns the first turn's record and
        when the conversation was over (perf_counter ns). `due` (the open loop): when the first
        turn is due; every turn's times then count from when it was due (a later turn's: the
        previous reply's end + think_time_s), and it carries send_slip_us. A turn that fails
        ends the conversation: each turn after it is recorded, not sent."""
        talk = chat.Talk(conv, sink.label, i)
        think_ns = round(self.w.think_time_s * 1e9)
        first: RequestRecord | None = None
        end = 0
        while not talk.over:
            if first is not None:
                await sleep_until(end + think_ns)
                if due is not None:
                    due = end + think_ns
            token = sink.marks.start(i) if sink.marks is not None else None
            try:
                rec, reply, end = await self.turn(conns, talk, due)
            finally:
                if sink.marks is not None:
                    sink.marks.end(token)
            sink.out.records.append(rec)
            if first is None:
                first = rec
            if not rec.ok:
                sink.out.records.extend(talk.not_sent(self.clock.epoch_of(end)))
                break
            talk.answer(reply)
        assert first is not None  # (a conversation has one turn or more)
        return first, end

    @property
    def chat_target(self) -> Target:
        """The server's chat completions endpoint."""
        return chat.chat_target(self.target)


async def run_closed_loop(
    w: RequestSettings,
    prompts: Sequence[Item],
    concurrency: int,
    label: str,
    out: PointRun,
    marks: RequestMarks | None = None,
) -> PointRun:
    """Send every item (a prompt, or a conversation's turns), keeping `concurrency` items in
    flight, and fill `out` as their requests end.

    `out` is filled in place so that a caller interrupted mid-point still holds what finished.
    """
    target = Target.of(w.base_url)
    clock = Clock()
    cpu0 = time.process_time()
    out.started_epoch_ns = clock.epoch0
    # every connection's reads go through one buffer, one at a time
    sender = Sender(target, memoryview(bytearray(READ_SIZE)), w, clock)
    try:
        slots = min(concurrency, len(prompts))
        await keep_slots_busy(sender, iter(enumerate(prompts)), slots, Sink(label, out, marks))
    finally:
        out.finished_epoch_ns = clock.epoch_of(time.perf_counter_ns())
        out.client_cpu_s = time.process_time() - cpu0
        out.workers = [worker_stats(out, len(out.records))]
    out.records.sort(key=lambda r: r.request_id)
    return out


def worker_stats(run: PointRun, requests: int) -> WorkerStats:
    """One process's entry of PointRun.workers, from its run's start, end and CPU seconds."""
    wall_s = max(0, run.finished_epoch_ns - run.started_epoch_ns) / 1e9
    busy = run.client_cpu_s / wall_s if wall_s > 0 else 0.0
    return {"requests": requests, "cpu_s": run.client_cpu_s, "wall_s": wall_s, "busy": busy}


async def keep_slots_busy(
    sender: Sender, todo: Iterator[tuple[int, Item]], slots: int, sink: Sink
) -> None:
    """`slots` items in flight, one connection each, each slot sending the next (index, item)
    of `todo` when its last one ends (a conversation: its last turn), until `todo` is
    exhausted. A request's queued_us is the wait from its slot's becoming free to its send;
    a conversation's later turns wait on purpose (think time) and carry none."""
    clock, marks, out = sender.clock, sink.marks, sink.out

    async def worker() -> None:
        conn: Connection | None = None
        free = clock.mono0  # when this slot became free: the point's start, then each end
        try:
            for i, item in todo:
                if isinstance(item, Conversation):
                    held = SlotConnection(conn)
                    try:
                        rec, free_next = await sender.converse(held, i, item, sink)
                    finally:
                        conn = held.conn
                    rec.queued_us = (rec.sent_epoch_ns - clock.epoch_of(free)) // 1000
                    free = free_next
                    continue
                token = marks.start(i) if marks is not None else None
                try:
                    rid = f"{sink.label}-{i:05d}"
                    rec, conn, free_next = await sender.one(conn, rid, item)
                    # the time from the slot's becoming free to the send, in the client
                    rec.queued_us = (rec.sent_epoch_ns - clock.epoch_of(free)) // 1000
                    free = free_next
                    out.records.append(rec)
                finally:
                    if marks is not None:
                        marks.end(token)
        finally:
            if conn is not None:
                conn.close()

    await asyncio.gather(*(worker() for _ in range(slots)))
