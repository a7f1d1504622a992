"""One keep-alive HTTP/1.1 connection to the server's completions endpoint: the request's
bytes out, each read handed, timestamped on arrival, straight to the request's
`ResponseParser`; the request's future completes once, when its response is over.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

from servelab.client.parser import ResponseParser

# The clock of every time within a point (the parser's `now` and `t0`): perf_counter ns.
perf_ns = time.perf_counter_ns
READ_SIZE = 256 * 1024  # as asyncio's transports read


class Connection(asyncio.BufferedProtocol):
    """One keep-alive HTTP/1.1 connection, one request at a time. Reads go straight from the
    event loop to the parser; the request's future is completed when its response is over.

    The socket is read into a buffer that every connection of a run shares (reads are copied
    out at once, in the loop's thread): a plain Protocol makes the transport allocate a fresh
    256 KiB bytes object per read, which costs more than the rest of the read's handling.
    """

    def __init__(self, view: memoryview) -> None:
        self.view = view
        self.transport: asyncio.Transport | None = None
        self.parser: ResponseParser | None = None
        self.fut: asyncio.Future[None] | None = None
        self.lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view

    def buffer_updated(self, nbytes: int) -> None:
        now = perf_ns()
        p = self.parser
        if p is None:  # bytes nobody asked for: this connection cannot be trusted
            self.close()
        elif p.feed(self.view[:nbytes].tobytes(), now):
            self._over()

    def eof_received(self) -> bool | None:
        return None  # close our side too; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        p = self.parser
        if p is not None:
            p.eof(perf_ns(), exc)
            self._over()

    def send(self, request: bytes, parser: ResponseParser) -> asyncio.Future[None]:
        assert self.transport is not None and self.parser is None
        self.parser = parser
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.fut = fut
        self.transport.write(request)
        return fut

    def _over(self) -> None:
        p, fut = self.parser, self.fut
        self.parser = self.fut = None
        if p is not None and not p.reusable:
            self.close()
        if fut is not None and not fut.done():
            fut.set_result(None)

    def close(self, abort: bool = False) -> None:
        self.lost = True
        self.parser = None
        if self.transport is not None:
            if abort:
                self.transport.abort()
            else:
                self.transport.close()


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    path: str  # of the completions endpoint
    host_header: str
    tls: bool

    @staticmethod
    def of(base_url: str) -> Target:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"base_url {base_url!r}: expected http(s)://host[:port][/path]")
        tls = u.scheme == "https"
        port = u.port or (443 if tls else 80)
        return Target(u.hostname, port, f"{u.path.rstrip('/')}/v1/completions", u.netloc, tls)

    def request(self, request_id: str, payload: bytes) -> bytes:
        head = (
            f"POST {self.path} HTTP/1.1\r\nHost: {self.host_header}\r\n"
            "User-Agent: servelab\r\nAccept: */*\r\nAccept-Encoding: identity\r\n"
            "Content-Type: application/json\r\n"
            f"X-Request-Id: {request_id}\r\nContent-Length: {len(payload)}\r\n\r\n"
        )
        return head.encode("latin-1") + payload

    async def connect(self, view: memoryview) -> Connection:
        loop = asyncio.get_running_loop()
        ctx = ssl.create_default_context() if self.tls else None
        _, conn = await loop.create_connection(
            lambda: Connection(view),
            self.host,
            self.port,
            ssl=ctx,
            server_hostname=self.host if ctx else None,
        )
        return conn
