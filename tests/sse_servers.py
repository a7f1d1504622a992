"""A raw TCP server on 127.0.0.1 that answers each request with scripted bytes: for tests of
the client against servers that frame their responses, and misbehave, on purpose."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator


class RawServer:
    """Answers each request by its path with scripted writes (bytes, or a float: sleep)."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.scripts: dict[str, list[bytes | float]] = {}

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                hdrs = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
                await reader.readexactly(int(hdrs["content-length"]))
                path = lines[0].split(" ")[1]
                self.requests.append((path, hdrs))
                for step in self.scripts[path]:
                    if isinstance(step, float):
                        await asyncio.sleep(step)
                    elif step == b"CLOSE":
                        writer.close()
                        return
                    else:
                        writer.write(step)
                        await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


def serve_raw() -> Iterator[tuple[str, RawServer]]:
    """Run a RawServer in a thread for the life of the generator: yields (base URL, server)."""
    srv = RawServer()
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(srv.handle, "127.0.0.1", 0))
    port = server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}", srv
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
