"""The closed loop: every prompt of a point sent, `concurrency` requests in flight, one
connection per slot, each request's record collected as it ends.

Times within a point are taken from one monotonic clock and bridged to the wall clock once, at
the start of the point, so `sent_epoch_ns + done_offset_us` of different requests compare
exactly. Failed requests (HTTP errors, broken streams, timeouts) are recorded with their
error, never dropped.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from servelab.client.connection import READ_SIZE, Connection, Target, perf_ns
from servelab.client.parser import ResponseParser
from servelab.client.prompt import Prompt, PromptLike
from servelab.client.record import RequestRecord


@dataclass(frozen=True)
class Workload:
    base_url: str
    model: str
    max_tokens: int | None  # None: every prompt gives its own (Prompt.max_tokens)
    ignore_eos: bool = True
    temperature: float = 0.0
    request_timeout_s: float = 300.0


@dataclass
class PointRun:
    """What one run of a point measured; `records` fill in as requests finish."""

    records: list[RequestRecord] = field(default_factory=list)
    started_epoch_ns: int = 0
    finished_epoch_ns: int = 0
    client_cpu_s: float = 0.0
    # one entry per process that sent requests (worker_stats; client.workers): its requests,
    # CPU and wall seconds from the point's start to its end, and busy share = CPU / wall
    workers: list[dict[str, Any]] = field(default_factory=list)


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


def _payload(w: Workload, prompt: PromptLike) -> bytes:
    text, max_tokens = prompt, w.max_tokens
    if isinstance(prompt, Prompt):
        text = prompt.text
        max_tokens = prompt.max_tokens if prompt.max_tokens is not None else w.max_tokens
    if max_tokens is None:
        raise ValueError("no max_tokens: give Workload.max_tokens or the prompt's own")
    body: dict[str, Any] = {
        "model": w.model,
        "prompt": text,
        "max_tokens": max_tokens,
        "temperature": w.temperature,
        "stream": True,
        # usage in every chunk (cumulative completion_tokens): how many tokens each carried
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if w.ignore_eos:
        body["ignore_eos"] = True
    return json.dumps(body).encode("utf-8")


@dataclass(frozen=True)
class Sender:
    """What every request of one run (closed or open loop) is sent with: the server, the read
    buffer its connections share, the workload's settings and the run's clock."""

    target: Target
    view: memoryview
    w: Workload
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
        target, w = self.target, self.w
        request = target.request(request_id, _payload(w, prompt))
        sent = perf_ns()
        t0 = sent if scheduled is None else scheduled
        rec = RequestRecord(request_id=request_id, sent_epoch_ns=self.clock.epoch_of(t0))
        if scheduled is not None:
            rec.send_slip_us = (sent - scheduled) // 1000
        if isinstance(prompt, Prompt):
            rec.max_tokens = prompt.max_tokens
            rec.input_tokens = prompt.input_tokens
            rec.prefix = prompt.prefix
        parser = ResponseParser(rec, t0)
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
            return rec, None, parser.ended or perf_ns()
        except OSError as exc:
            where = f"{target.host}:{target.port}"
            rec.error = f"Connect to {where} failed: {type(exc).__name__}: {exc}"[:300]
            return rec, None, perf_ns()
        return rec, (None if conn.lost else conn), parser.ended or perf_ns()


class RequestMarks(Protocol):
    """Marks around each request, e.g. NVTX ranges that a GPU profiler records."""

    def start(self, index: int) -> Any: ...

    def end(self, token: Any) -> None: ...


async def run_closed_loop(
    w: Workload,
    prompts: Sequence[PromptLike],
    concurrency: int,
    label: str,
    out: PointRun,
    marks: RequestMarks | None = None,
) -> PointRun:
    """Send every prompt, keeping `concurrency` requests in flight, and fill `out` as they end.

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
        await keep_slots_busy(sender, iter(enumerate(prompts)), slots, label, out, marks)
    finally:
        out.finished_epoch_ns = clock.epoch_of(time.perf_counter_ns())
        out.client_cpu_s = time.process_time() - cpu0
        out.workers = [worker_stats(out, len(out.records))]
    out.records.sort(key=lambda r: r.request_id)
    return out


def worker_stats(run: PointRun, requests: int) -> dict[str, Any]:
    """One process's entry of PointRun.workers, from its run's start, end and CPU seconds."""
    wall_s = max(0, run.finished_epoch_ns - run.started_epoch_ns) / 1e9
    busy = run.client_cpu_s / wall_s if wall_s > 0 else 0.0
    return {"requests": requests, "cpu_s": run.client_cpu_s, "wall_s": wall_s, "busy": busy}


async def keep_slots_busy(
    sender: Sender,
    todo: Iterator[tuple[int, PromptLike]],
    slots: int,
    label: str,
    out: PointRun,
    marks: RequestMarks | None,
) -> None:
    """`slots` requests in flight, one connection each, each slot sending the next (index,
    prompt) of `todo` when its last request ends, until `todo` is exhausted."""
    clock = sender.clock

    async def worker() -> None:
        conn: Connection | None = None
        free = clock.mono0  # when this slot became free: the point's start, then each end
        try:
            for i, prompt in todo:
                token = marks.start(i) if marks is not None else None
                try:
                    rid = f"{label}-{i:05d}"
                    rec, conn, free_next = await sender.one(conn, rid, prompt)
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
