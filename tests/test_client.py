"""The client against small SSE servers that behave, and misbehave, on purpose."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web

from servelab.client import PointRun, Workload, run_point


def _chunk(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "text": text}]}).encode() + b"\n\n"


USAGE = b'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}\n\n'


async def good(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for t in ["a", "b", "", "d"]:
        await resp.write(_chunk(t))
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
        ("error", http_error),
        ("broken", broken),
        ("slow", slow),
        ("nousage", no_usage),
    ]:
        app.router.add_post(f"/{name}/v1/completions", handler)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)


def wl(base: str, kind: str, timeout: float = 10) -> Workload:
    return Workload(base_url=f"{base}/{kind}", model="m", max_tokens=4, request_timeout_s=timeout)


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
    run_point(Workload(f"http://127.0.0.1:{port}", "m", 4), ["p", "q"], 2, "t", out)
    assert len(out.records) == 2 and all(not r.ok and r.http_status is None for r in out.records)
    assert all("Connect" in (r.error or "") for r in out.records)
