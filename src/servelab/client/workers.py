"""Running a point: `run_point`, the closed loop (given a concurrency) or the open loop (given
an `OpenLoop` schedule), in this process, or spread over N worker processes (`workers=N`) for
when one core cannot keep up with the server.

Each worker is a fresh Python process (`python -c`, calling `serve`: nothing of the caller's
`__main__` is run again in it) with its own event loop, connections and read buffer,
sending its share of the point with the one-process machinery (closed_loop.keep_slots_busy,
open_loop.send_on_schedule). They share one schedule and one clock bridge: the parent starts
them, waits until each is ready, then fixes the point's zero, a wall-clock epoch and the
perf_counter reading that is that instant (perf_counter is the system's CLOCK_MONOTONIC on
Linux, the same in every process of the host), a little ahead (LEAD_NS) so that every worker
holds it before it comes. Each worker bridges its times with that one pair, so the records of
different workers compare exactly, as within one process.

- Closed loop: the concurrency is split over the workers (as evenly as it goes); each keeps its
  slots busy, every slot taking the point's next item index from one count that the workers
  share (a file read and advanced under an exclusive lock), so the point sends exactly its
  items, each once, as one process would.
- Open loop: items are dealt round-robin by index (worker k sends k, k + N, ...), each sent
  at its scheduled time from the shared zero; a cap on items in flight is split over the
  workers like the concurrency (each holds at most its share), and there are never more workers
  than the cap.

An item is a prompt or a conversation (client.chat): the worker that takes a conversation
sends every turn of it, so its turns share one slot and one history, as in one process.

The records come back to the parent when each worker ends, and are merged, sorted by request id,
exactly as one process records them. `PointRun.workers` has one entry per worker (its requests,
CPU and wall seconds from the point's zero to its end, busy share = CPU / wall) and
`client_cpu_s` is their sum. A stop signal to the parent (KeyboardInterrupt there) stops
every worker, and one to a worker stops that worker (the others finish their shares): each
stopped worker sends what finished, which the parent keeps in `out` before it raises
KeyboardInterrupt.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import select
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any, TypedDict, Unpack

from servelab.client.closed_loop import (
    Clock,
    PointRun,
    RequestMarks,
    RequestSettings,
    Sender,
    Sink,
    keep_slots_busy,
    run_closed_loop,
    sleep_until,
    worker_stats,
)
from servelab.client.connection import READ_SIZE, Target, perf_ns
from servelab.client.open_loop import (
    OpenLoop,
    check_plan,
    run_open_loop,
    send_on_schedule,
)
from servelab.client.prompt import Item
from servelab.client.signals import run_stoppable

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LEAD_NS = 50_000_000  # the point's zero is this far after the parent fixes it
READY_TIMEOUT_S = 120.0  # for every worker to start (a fresh interpreter, its imports)
STOP_TIMEOUT_S = 10.0  # for a stopped worker to send what finished
_HEAD = struct.Struct("<Q")  # each message: its length, then its pickle


@dataclass(frozen=True)
class Share:
    """What one worker sends. Closed loop: `counter` names the shared count, `prompts` are all
    the point's items, `slots` its concurrency. Open loop: `counter` is empty, `indices` are the
    items it sends, `prompts` and `offsets_ns` theirs, `slots` its cap (None: no cap). An item
    is a prompt or a conversation, whose turns its worker sends."""

    w: RequestSettings
    label: str
    prompts: tuple[Item, ...]
    slots: int | None
    counter: str = ""
    indices: tuple[int, ...] = ()
    offsets_ns: tuple[int, ...] = ()


class PointOptions(TypedDict, total=False):
    """The keyword options of run_point.

    marks: marks around each request (made in this process: workers 1 only);
    workers: how many processes send the point's requests (1, the default: this one)."""

    marks: RequestMarks | None
    workers: int


def run_point(
    w: RequestSettings,
    prompts: Sequence[Item],
    load: int | OpenLoop,
    label: str,
    out: PointRun | None = None,
    **opts: Unpack[PointOptions],
) -> PointRun:
    """One point: `load` a concurrency, the closed loop (closed_loop.run_closed_loop), or an
    `OpenLoop` schedule, the open loop (open_loop.run_open_loop); on this process's own event
    loop, or over `workers` processes. Stop signals interrupt it (KeyboardInterrupt), and `out`
    keeps what finished."""
    out = out if out is not None else PointRun()
    marks = opts.get("marks")
    n = worker_count(opts.get("workers", 1), marks)
    if isinstance(load, OpenLoop):
        if n > 1:
            return spread_open_loop(w, prompts, load, label, out, n)
        run_stoppable(run_open_loop(w, prompts, load, label, out, marks))
    else:
        if n > 1:
            return spread_closed_loop(w, prompts, load, label, out, n)
        run_stoppable(run_closed_loop(w, prompts, load, label, out, marks))
    return out


def worker_count(workers: object, marks: RequestMarks | None) -> int:
    """`workers` checked: a whole number from 1 up; more than 1 without marks, on a POSIX host."""
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers {workers!r}: give a whole number from 1 up")
    if workers > 1 and marks is not None:
        raise ValueError("request marks are made in this process: give workers=1 with marks")
    if workers > 1 and fcntl is None:  # pragma: no cover - Windows
        raise ValueError("workers > 1 needs a POSIX host (file locks): give workers=1")
    return workers


def _split(total: int, n: int) -> list[int]:
    """`total` over n parts as evenly as it goes, the larger parts first."""
    return [total // n + (k < total % n) for k in range(n)]


def spread_closed_loop(
    w: RequestSettings,
    prompts: Sequence[Item],
    concurrency: int,
    label: str,
    out: PointRun,
    workers: int,
) -> PointRun:
    """The closed loop over `workers` processes (no more than the point's slots)."""
    Target.of(w.base_url)  # a bad URL is refused here, not in every worker
    slots = min(concurrency, len(prompts))
    n = max(1, min(workers, slots))
    fd, path = tempfile.mkstemp(prefix="servelab-count-")
    try:
        os.write(fd, bytes(8))
        os.close(fd)
        every = tuple(prompts)
        shares = [Share(w, label, every, s, counter=path) for s in _split(slots, n)]
        return _run(shares, out)
    finally:
        os.unlink(path)


def spread_open_loop(
    w: RequestSettings,
    prompts: Sequence[Item],
    plan: OpenLoop,
    label: str,
    out: PointRun,
    workers: int,
) -> PointRun:
    """The open loop over `workers` processes (no more than the requests, nor the cap)."""
    check_plan(plan, prompts)
    Target.of(w.base_url)
    cap = plan.max_in_flight
    n = max(1, min(workers, len(prompts), cap if cap is not None else workers))
    caps: list[int | None] = list(_split(cap, n)) if cap is not None else [None] * n
    shares = [
        Share(
            w,
            label,
            tuple(prompts[k::n]),
            caps[k],
            indices=tuple(range(k, len(prompts), n)),
            offsets_ns=tuple(plan.offsets_ns[k::n]),
        )
        for k in range(n)
    ]
    return _run(shares, out)


class SharedCount:
    """The point's next request index, shared by its workers: 8 bytes of a file, read and
    advanced under an exclusive lock (flock: one lock per open of the file)."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR)

    def take(self) -> int:
        assert fcntl is not None
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            i = int.from_bytes(os.pread(self.fd, 8, 0), "little")
            os.pwrite(self.fd, (i + 1).to_bytes(8, "little"), 0)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
        return i

    def todo(self, prompts: Sequence[Item]) -> Iterator[tuple[int, Item]]:
        """(index, item) of each item this process takes, until every one is taken."""
        while (i := self.take()) < len(prompts):
            yield i, prompts[i]


# --- the parent's side ---


class _Worker:
    """One worker process and the bytes of its messages read so far."""

    def __init__(self) -> None:
        paths = [p for p in sys.path if p]  # the caller's imports, servelab's among them
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from servelab.client.workers import serve; serve()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin: IO[bytes] | None = self.proc.stdin
        self.fd = self.proc.stdout.fileno()
        self.buf = bytearray()
        self.ended = False  # its pipe is at its end

    def tell(self, obj: object) -> None:
        if self.stdin is not None:
            self.stdin.write(_frame(obj))
            self.stdin.flush()

    def stop(self) -> None:
        """Ask it to stop (the end of its stdin): it sends what finished, then ends."""
        if self.stdin is not None:
            try:
                self.stdin.close()
            except OSError:
                pass
            self.stdin = None

    def waiting(self) -> bool:
        return not self.ended and _unframe(self.buf, peek=True) is None

    def next(self) -> Any:
        """Its next message, or None when none came whole."""
        return _unframe(self.buf)

    def close(self) -> None:
        self.stop()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _receive(workers: list[_Worker], deadline: float | None) -> None:
    """Read the workers' pipes until each has a whole message or has ended, or until the
    deadline (time.monotonic; None: no deadline)."""
    waiting = {x.fd: x for x in workers if x.waiting()}
    while waiting:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return
        ready, _, _ = select.select(list(waiting), [], [], left)
        for fd in ready:
            x = waiting[fd]
            data = os.read(fd, 1 << 20)
            if data:
                x.buf += data
            else:
                x.ended = True
            if not x.waiting():
                del waiting[fd]


def _started(workers: list[_Worker]) -> None:
    _receive(workers, time.monotonic() + READY_TIMEOUT_S)
    for k, x in enumerate(workers):
        if x.next() != "ready":
            code = x.proc.poll()
            why = f"ended (exit code {code})" if code is not None else "is not ready in time"
            raise RuntimeError(f"client worker {k} {why}: see its error above")


def _run(shares: list[Share], out: PointRun) -> PointRun:
    """Start one worker per share, start them together from one zero, merge what they send."""
    workers: list[_Worker] = []
    results: list[tuple[PointRun, str] | None] = []
    try:
        workers = [_Worker() for _ in shares]  # (their imports overlap)
        for x, share in zip(workers, shares, strict=True):
            x.tell(share)
        _started(workers)
        epoch, mono = time.time_ns(), time.perf_counter_ns()
        zero = (epoch + LEAD_NS, mono + LEAD_NS)
        out.started_epoch_ns = zero[0]
        for x in workers:
            x.tell(zero)
        _receive(workers, None)
        results = [x.next() for x in workers]
    except BaseException:
        for x in workers:
            x.stop()
        _receive(workers, time.monotonic() + STOP_TIMEOUT_S)
        _merge([x.next() for x in workers], out)
        raise
    finally:
        for x in workers:
            x.close()
    _merge(results, out)
    lost = [k for k, r in enumerate(results) if r is None]
    if lost:
        raise RuntimeError(f"client workers {lost} ended without their records: see their errors")
    stopped = [why for r in results if r is not None and (why := r[1])]
    if stopped:
        raise KeyboardInterrupt(stopped[0])
    return out


def _merge(results: Sequence[object], out: PointRun) -> None:
    """What the workers sent, into `out`: their records sorted by request id, one entry each
    in `out.workers`, their CPU seconds summed, the last one's end."""
    runs = [r[0] for r in results if isinstance(r, tuple)]
    out.records.extend(rec for run in runs for rec in run.records)
    out.records.sort(key=lambda r: r.request_id)
    out.workers = [worker_stats(run, len(run.records)) for run in runs]
    out.client_cpu_s = sum(run.client_cpu_s for run in runs)
    if len(runs) == len(results) and runs:
        out.finished_epoch_ns = max(run.finished_epoch_ns for run in runs)
    elif out.started_epoch_ns:  # a worker lost: now, on the point's bridge
        out.finished_epoch_ns = time.time_ns()


def _frame(obj: object) -> bytes:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEAD.pack(len(body)) + body


def _unframe(buf: bytearray, peek: bool = False) -> Any:
    """The first whole message in `buf` (taken out of it unless `peek`), or None."""
    if len(buf) < _HEAD.size:
        return None
    (size,) = _HEAD.unpack_from(buf)
    end = _HEAD.size + size
    if len(buf) < end:
        return None
    if peek:
        return True
    obj = pickle.loads(bytes(buf[_HEAD.size : end]))
    del buf[:end]
    return obj


# --- the worker's side ---


def _read(fd: int) -> Any:
    """The next message on `fd` (blocking); EOFError at its end."""
    buf = bytearray()
    while (obj := _unframe(buf)) is None:
        data = os.read(fd, 1 << 20)
        if not data:
            raise EOFError
        buf += data
    return obj


async def _work(share: Share, zero: tuple[int, int], run: PointRun) -> None:
    """Send this worker's share from the point's zero; the parent's word (any byte on stdin,
    or its end) stops it."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()

    def stop() -> None:
        loop.remove_reader(0)
        if task is not None:
            task.cancel()

    loop.add_reader(0, stop)
    clock = Clock(zero)
    run.started_epoch_ns = clock.epoch0
    target = Target.of(share.w.base_url)
    sender = Sender(target, memoryview(bytearray(READ_SIZE)), share.w, clock)
    cpu0 = time.process_time()
    try:
        # before the zero: the resolver's threads started, as a process that ran before has them
        with contextlib.suppress(OSError):
            await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        await sleep_until(clock.mono0)
        sink = Sink(share.label, run)
        if share.counter:
            todo = SharedCount(share.counter).todo(share.prompts)
            await keep_slots_busy(sender, todo, share.slots or 1, sink)
        else:
            timed = zip(share.indices, share.prompts, share.offsets_ns, strict=True)
            await send_on_schedule(sender, timed, share.slots, sink)
    finally:
        run.finished_epoch_ns = clock.epoch_of(perf_ns())
        run.client_cpu_s = time.process_time() - cpu0
        loop.remove_reader(0)


def serve() -> None:
    """A worker process's life: its share, "ready", the zero, its run, what it recorded."""
    reply = os.dup(1)
    os.dup2(2, 1)  # the pipe carries the messages alone; anything printed goes to stderr
    try:
        share: Share = _read(0)
        os.write(reply, _frame("ready"))
        zero: tuple[int, int] = _read(0)
    except (EOFError, KeyboardInterrupt):  # stopped before the point began
        return
    run = PointRun()
    stopped = ""
    try:
        run_stoppable(_work(share, zero, run))
    except KeyboardInterrupt as exc:  # a stop signal to this process
        stopped = str(exc) or "stopped"
    except asyncio.CancelledError:  # the parent's word
        stopped = "stopped by the parent"
    run.records.sort(key=lambda r: r.request_id)
    data = memoryview(_frame((run, stopped)))
    try:
        while data:
            data = data[os.write(reply, data) :]
    except BrokenPipeError:  # the parent is gone: nobody to tell
        pass
