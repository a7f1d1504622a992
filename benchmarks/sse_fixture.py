"""A stand-in completions server that streams tokens as fast as it is told (benchmark fixture).

Not part of servelab. Like a batching engine, it emits in steps: every `--step-us` it writes one
SSE chunk (`--chunk-tokens` events, 1 by default) to every open stream, then sleeps; `--step-us 0`
only yields to the event loop. Each event carries its send time (`sent_ns`, time.time_ns()) and
the fixture keeps every send time per request (by X-Request-Id), served as JSON at GET /sends, so
a client's TTFT and ITL can be checked against the truth. Run it as its own process:
`python sse_fixture.py --port P --step-us 2000`. sse_fixture.c is its C twin (same interface).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class Stream:
    __slots__ = ("rid", "left", "total", "transport", "sends", "prefix")

    def __init__(self, rid: str, total: int, transport: asyncio.Transport) -> None:
        self.rid, self.left, self.total, self.transport = rid, total, total, transport
        self.sends: list[int] = []
        self.prefix = (
            b'data: {"id":"cmpl-' + rid.encode() + b'","object":"text_completion",'
            b'"created":0,"model":"fixture","choices":[{"index":0,"text":" tok",'
            b'"logprobs":null,"finish_reason":'
        )


class Fixture:
    def __init__(self, step_s: float, chunk_tokens: int = 1) -> None:
        self.step_s = step_s
        self.chunk_tokens = chunk_tokens
        self.streams: list[Stream] = []
        self.sends: dict[str, dict[str, object]] = {}
        self.wake = asyncio.Event()

    async def engine(self) -> None:
        deadline = time.perf_counter()
        while True:
            if not self.streams:
                self.wake.clear()
                await self.wake.wait()
                deadline = time.perf_counter()
            done = []
            for s in self.streams:
                now = time.time_ns()
                body = b""
                last = False
                for _ in range(self.chunk_tokens):
                    s.left -= 1
                    last = s.left == 0
                    body += s.prefix + (
                        b'"length","stop_reason":null}],"usage":null,"sent_ns":%d}\n\n' % now
                        if last
                        else b'null,"stop_reason":null}],"usage":null,"sent_ns":%d}\n\n' % now
                    )
                    s.sends.append(now)
                    if last:
                        break
                if last:
                    body += (
                        b'data: {"id":"cmpl-x","object":"text_completion","created":0,'
                        b'"model":"fixture","choices":[],"usage":{"prompt_tokens":16,'
                        b'"total_tokens":%d,"completion_tokens":%d}}\n\ndata: [DONE]\n\n'
                        % (16 + s.total, s.total)
                    )
                    s.transport.write(_chunk(body) + b"0\r\n\r\n")
                    done.append(s)
                else:
                    s.transport.write(_chunk(body))
            for s in done:
                self.streams.remove(s)
            # Steps of 2 ms or more sleep; shorter ones spin (yielding to the event loop, so
            # requests are still accepted): epoll's timeout has millisecond resolution.
            deadline += self.step_s
            wait = deadline - time.perf_counter()
            if wait >= 0.002:
                await asyncio.sleep(wait)
            else:
                await asyncio.sleep(0)
                while time.perf_counter() < deadline:
                    await asyncio.sleep(0)
            deadline = max(deadline, time.perf_counter() - self.step_s)


class Conn(asyncio.Protocol):
    def __init__(self, fx: Fixture) -> None:
        self.fx = fx
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].decode("latin-1")
            lines = head.split("\r\n")
            hdrs = {
                k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])
            }
            n = int(hdrs.get("content-length", "0"))
            if len(self.buf) < head_end + 4 + n:
                return
            body = self.buf[head_end + 4 : head_end + 4 + n]
            self.buf = self.buf[head_end + 4 + n :]
            self.handle(lines[0], hdrs, body)

    def handle(self, request_line: str, hdrs: dict[str, str], body: bytes) -> None:
        recv = time.time_ns()
        method, path = request_line.split(" ")[:2]
        if method == "POST" and path == "/v1/completions":
            req = json.loads(body)
            rid = hdrs.get("x-request-id", f"anon-{len(self.fx.sends)}")
            s = Stream(rid, int(req.get("max_tokens", 16)), self.transport)
            self.fx.sends[rid] = {"recv_ns": recv, "sends": s.sends}
            self.transport.write(HEAD)
            self.fx.streams.append(s)
            self.fx.wake.set()
            return
        if path == "/sends":
            out = json.dumps(self.fx.sends).encode()
            self.fx.sends = {}
        elif path == "/health":
            out = b"{}"
        else:
            self.transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            return
        self.transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(out), out)
        )


async def serve(port: int, step_s: float, chunk_tokens: int = 1) -> None:
    fx = Fixture(step_s, chunk_tokens)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Conn(fx), "127.0.0.1", port, backlog=1024)
    asyncio.create_task(fx.engine())
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--step-us", type=int, default=0)
    p.add_argument("--cpu", type=int, default=None, help="pin to this core")
    p.add_argument("--chunk-tokens", type=int, default=1, choices=range(1, 33), metavar="1-32",
                   help="tokens (SSE events, each with its sent_ns) per write")  # fmt: skip
    a = p.parse_args()
    if a.cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {a.cpu})
    asyncio.run(serve(a.port, a.step_us / 1e6, a.chunk_tokens))


if __name__ == "__main__":
    main()
