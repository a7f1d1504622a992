"""Closed-loop streaming load generator for the OpenAI completions API (SSE).

Every request gets exactly the fields of the raw data contract. Times within a point are taken
from one monotonic clock and bridged to the wall clock once, at the start of the point, so
`sent_epoch_ns + done_offset_us` of different requests compare exactly.
Failed requests (HTTP errors, broken streams, timeouts) are recorded with their error, never
dropped.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import aiohttp


@dataclass
class RequestRecord:
    request_id: str
    sent_epoch_ns: int
    chunk_offsets_us: list[int] = field(default_factory=list)
    done_offset_us: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    ok: bool = False
    error: str | None = None
    http_status: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> RequestRecord:
        fields: dict[str, Any] = {k: d.get(k) for k in RequestRecord.__dataclass_fields__}
        return RequestRecord(**fields)


@dataclass(frozen=True)
class Workload:
    base_url: str
    model: str
    max_tokens: int
    ignore_eos: bool = True
    temperature: float = 0.0
    request_timeout_s: float = 300.0


@dataclass
class PointRun:
    """What one closed-loop run measured; `records` fills in as requests finish."""

    records: list[RequestRecord] = field(default_factory=list)
    started_epoch_ns: int = 0
    finished_epoch_ns: int = 0
    client_cpu_s: float = 0.0


class _Clock:
    def __init__(self) -> None:
        self.epoch0 = time.time_ns()
        self.mono0 = time.perf_counter_ns()

    def epoch_of(self, mono_ns: int) -> int:
        return self.epoch0 + (mono_ns - self.mono0)


def _payload(w: Workload, prompt: str) -> bytes:
    body: dict[str, Any] = {
        "model": w.model,
        "prompt": prompt,
        "max_tokens": w.max_tokens,
        "temperature": w.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if w.ignore_eos:
        body["ignore_eos"] = True
    return json.dumps(body).encode("utf-8")


async def _one(
    session: aiohttp.ClientSession, w: Workload, clock: _Clock, request_id: str, prompt: str
) -> RequestRecord:
    payload = _payload(w, prompt)
    t0 = time.perf_counter_ns()
    rec = RequestRecord(request_id=request_id, sent_epoch_ns=clock.epoch_of(t0))
    offsets = rec.chunk_offsets_us
    done = False
    try:
        async with session.post(
            f"{w.base_url}/v1/completions",
            data=payload,
            headers={"Content-Type": "application/json", "X-Request-Id": request_id},
        ) as resp:
            rec.http_status = resp.status
            if resp.status != 200:
                body = (await resp.text())[:300].replace("\n", " ")
                rec.error = f"HTTP {resp.status}: {body}"
                return rec
            tail = b""
            async for data in resp.content.iter_any():
                now = time.perf_counter_ns()
                if tail:
                    data = tail + data
                # Events end with a blank line; a read usually holds whole events, so the
                # unfinished rest (if any) is carried to the next read, never re-scanned.
                events = data.split(b"\n\n")
                tail = events.pop()
                for event in events:
                    for line in event.split(b"\n"):
                        if not line.startswith(b"data:"):
                            continue
                        body_bytes = line[5:].strip()
                        if body_bytes == b"[DONE]":
                            done = True
                            continue
                        msg = json.loads(body_bytes)
                        if "error" in msg and not msg.get("choices"):
                            err = msg["error"]
                            detail = err.get("message", err) if isinstance(err, dict) else err
                            rec.error = f"stream error: {detail}"
                            return rec
                        if msg.get("choices"):
                            offsets.append((now - t0) // 1000)
                        usage = msg.get("usage")
                        if usage:
                            rec.prompt_tokens = usage.get("prompt_tokens")
                            rec.output_tokens = usage.get("completion_tokens")
            rec.done_offset_us = (time.perf_counter_ns() - t0) // 1000
    except TimeoutError:
        rec.error = f"timeout after {w.request_timeout_s:g} s"
        return rec
    except aiohttp.ClientError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:300]
        return rec
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        rec.error = f"malformed stream: {exc}"[:300]
        return rec
    if not done:
        rec.error = "stream ended before [DONE]"
    elif rec.output_tokens is None:
        rec.error = "stream carried no usage (completion_tokens)"
    elif not offsets:
        rec.error = "stream carried no content chunks"
    else:
        rec.ok = True
    return rec


class RequestMarks(Protocol):
    """Marks around each request, e.g. NVTX ranges that a GPU profiler records."""

    def start(self, index: int) -> Any: ...

    def end(self, token: Any) -> None: ...


async def run_closed_loop(
    w: Workload,
    prompts: Sequence[str],
    concurrency: int,
    label: str,
    out: PointRun,
    marks: RequestMarks | None = None,
) -> PointRun:
    """Send every prompt, keeping `concurrency` requests in flight, and fill `out` as they end.

    `out` is filled in place so that a caller interrupted mid-point still holds what finished.
    """
    clock = _Clock()
    cpu0 = time.process_time()
    out.started_epoch_ns = clock.epoch0
    queue: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
    for i, p in enumerate(prompts):
        queue.put_nowait((i, p))
    timeout = aiohttp.ClientTimeout(total=w.request_timeout_s)
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    try:
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:

            async def worker() -> None:
                while True:
                    try:
                        i, prompt = queue.get_nowait()
                    except asyncio.QueueEmpty:
                        return
                    token = marks.start(i) if marks is not None else None
                    try:
                        out.records.append(
                            await _one(session, w, clock, f"{label}-{i:05d}", prompt)
                        )
                    finally:
                        if marks is not None:
                            marks.end(token)

            await asyncio.gather(*(worker() for _ in range(min(concurrency, len(prompts)))))
    finally:
        out.finished_epoch_ns = clock.epoch_of(time.perf_counter_ns())
        out.client_cpu_s = time.process_time() - cpu0
    out.records.sort(key=lambda r: r.request_id)
    return out


def run_point(
    w: Workload,
    prompts: Sequence[str],
    concurrency: int,
    label: str,
    out: PointRun | None = None,
    marks: RequestMarks | None = None,
) -> PointRun:
    out = out if out is not None else PointRun()
    asyncio.run(run_closed_loop(w, prompts, concurrency, label, out, marks))
    return out
