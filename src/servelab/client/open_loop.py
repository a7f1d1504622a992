"""The open loop: each item of a point sent at its scheduled time (an arrival schedule,
`servelab.design.arrivals`), whether or not the requests before it have ended; optionally at most
`max_in_flight` items in flight.

An item is a prompt or a conversation (client.prompt.Conversation, client.chat): the schedule
gives a conversation's first turn its send time, and each later turn is due `think_time_s`
after the previous reply's end; its times and send_slip_us count from when it was due. A cap
counts conversations in flight, from the first turn's send to the last turn's end.

Every time of a request counts from its scheduled send, not from when the client got round to
sending it: `sent_epoch_ns` is the scheduled time and the offsets (`first_byte_offset_us`,
`chunk_offsets_us`, `done_offset_us`) are after it, so a client that falls behind, or a cap that
holds a request back, shows as latency instead of hiding the queue. `send_slip_us` is how late
the actual send was. The requests are sent with the closed loop's machinery (connections,
response reader, records) and its clock bridge: one monotonic clock, bridged to the wall clock
once at the start of the point, the schedule's zero. Failed requests are recorded with their
error, never dropped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servelab.client.closed_loop import (
    Clock,
    PointRun,
    RequestMarks,
    RequestSettings,
    Sender,
    Sink,
    sleep_until,
    worker_stats,
)
from servelab.client.connection import READ_SIZE, Connection, Target, perf_ns
from servelab.client.prompt import Conversation, Item, PromptLike

if TYPE_CHECKING:  # (numpy is loaded only by whoever draws a schedule)
    from servelab.design.arrivals import ArrivalProcess


@dataclass(frozen=True)
class OpenLoop:
    """When each item is sent: `offsets_ns[i]` after the point's start for the i-th item
    (non-decreasing, from 0 up; a conversation's first turn), and at most `max_in_flight` items
    in flight (None: no cap). With a cap, an item waits for its time, then for a free slot; an
    item held back is sent as soon as a slot frees, one per slot, never in a burst above the
    cap."""

    offsets_ns: Sequence[int]
    max_in_flight: int | None = None

    def __post_init__(self) -> None:
        cap = self.max_in_flight
        if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
            raise ValueError(f"max_in_flight {cap!r}: give a whole number from 1 up, or None")
        prev = 0
        for i, t in enumerate(self.offsets_ns):
            if t < prev:
                raise ValueError(
                    f"send time {i} is {t} ns, before {prev} ns: give send times from 0 up, "
                    "in order"
                )
            prev = t

    @staticmethod
    def of(process: ArrivalProcess, n: int, max_in_flight: int | None = None) -> OpenLoop:
        """The schedule of n requests drawn from `process`, with the cap."""
        return OpenLoop(tuple(int(t) for t in process.schedule_ns(n)), max_in_flight)


def check_plan(plan: OpenLoop, prompts: Sequence[Item]) -> None:
    """One send time per item, or ValueError."""
    if len(plan.offsets_ns) != len(prompts):
        raise ValueError(
            f"{len(plan.offsets_ns)} send times for {len(prompts)} prompts: give one per prompt"
        )


class IdleConnections:
    """The open loop's keep-alive connections between requests: a request takes one that no
    request is using, or none (it opens one)."""

    def __init__(self) -> None:
        self.idle: list[Connection] = []

    def take(self) -> Connection | None:
        return self.idle.pop() if self.idle else None

    def give(self, conn: Connection | None) -> None:
        if conn is not None:
            self.idle.append(conn)

    def close(self) -> None:
        for conn in self.idle:
            conn.close()


async def run_open_loop(
    w: RequestSettings,
    prompts: Sequence[Item],
    plan: OpenLoop,
    label: str,
    out: PointRun,
    marks: RequestMarks | None = None,
) -> PointRun:
    """Send each item at its time in `plan` and fill `out` as the requests end.

    `out` is filled in place so that a caller interrupted mid-point still holds what finished.
    """
    check_plan(plan, prompts)
    clock = Clock()
    cpu0 = time.process_time()
    out.started_epoch_ns = clock.epoch0
    # every connection's reads go through one buffer, one at a time
    sender = Sender(Target.of(w.base_url), memoryview(bytearray(READ_SIZE)), w, clock)
    todo = zip(range(len(prompts)), prompts, plan.offsets_ns, strict=True)
    try:
        await send_on_schedule(sender, todo, plan.max_in_flight, Sink(label, out, marks))
    finally:
        out.finished_epoch_ns = clock.epoch_of(perf_ns())
        out.client_cpu_s = time.process_time() - cpu0
        out.workers = [worker_stats(out, len(out.records))]
    out.records.sort(key=lambda r: r.request_id)
    return out


async def send_on_schedule(
    sender: Sender, todo: Iterable[tuple[int, Item, int]], cap: int | None, sink: Sink
) -> None:
    """Send each (index, item, offset ns) of `todo` at the sender's clock's zero + offset,
    at most `cap` items in flight (None: no cap), recording each request in `sink.out` as it
    ends."""
    clock, marks, out = sender.clock, sink.marks, sink.out
    conns = IdleConnections()  # keep-alive connections between requests
    slots = asyncio.Semaphore(cap) if cap is not None else None

    async def one(i: int, prompt: PromptLike, due: int) -> None:
        token = marks.start(i) if marks is not None else None
        try:
            rec, conn, _ = await sender.one(conns.take(), f"{sink.label}-{i:05d}", prompt, due)
            out.records.append(rec)
            conns.give(conn)
        finally:
            if marks is not None:
                marks.end(token)

    async def send(i: int, item: Item, due: int) -> None:
        try:
            if isinstance(item, Conversation):
                await sender.converse(conns, i, item, sink, due)
            else:
                await one(i, item, due)
        finally:
            if slots is not None:
                slots.release()

    try:
        async with asyncio.TaskGroup() as group:
            for i, item, offset in todo:
                due = clock.mono0 + offset
                await sleep_until(due)
                if slots is not None:
                    await slots.acquire()
                group.create_task(send(i, item, due))
    finally:
        conns.close()
