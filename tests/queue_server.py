"""A server on 127.0.0.1 with a known queue: it serves one completions request at a time, each
for a fixed service time, first come first served, and answers with the streaming (SSE)
response the client reads (one content chunk, usage, [DONE]). GET /taken answers how many
requests it has taken in so far.

A request arrives when the kernel received its last byte (the socket's receive timestamp,
SO_TIMESTAMPNS: not when this process got round to reading it), and its service ends at
max(its arrival, the previous request's end) + the service time. The queue is therefore
exactly a deterministic single server's even on a busy host: a late read or a late wake-up
delays that one response, never the ones behind it. One thread per connection; sleeps are the
system's (microseconds), not an event loop's (milliseconds).

    python tests/queue_server.py SERVICE_MS    # prints its port, then serves until stopped
"""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux
_CHUNK = {
    "choices": [{"index": 0, "text": "x"}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}
_USAGE = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
BODY = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in (_CHUNK, _USAGE))
BODY += b"data: [DONE]\n\n"
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    + f"Content-Length: {len(BODY)}\r\n\r\n".encode()
    + BODY
)


class Queue:
    """The single server: when each request taken in is served (wall-clock ns)."""

    def __init__(self, service_ns: int) -> None:
        self.service_ns = service_ns
        self.free_at = 0
        self.taken = 0  # requests taken in since the start (GET /taken)
        self.lock = threading.Lock()

    def take(self, arrived_ns: int) -> int:
        with self.lock:
            self.free_at = max(arrived_ns, self.free_at) + self.service_ns
            self.taken += 1
            return self.free_at


def _received_ns(ancillary: list[tuple[int, int, bytes]]) -> int:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, nsec = struct.unpack("qq", data[:16])
            return sec * 1_000_000_000 + nsec
    return time.time_ns()


def _request_end(buf: bytes) -> int:
    """The length of the first whole request in `buf` (head and body), 0 when not all in."""
    head_end = buf.find(b"\r\n\r\n")
    if head_end < 0:
        return 0
    length = 0
    for line in buf[:head_end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    end = head_end + 4 + length
    return end if len(buf) >= end else 0


def serve_connection(conn: socket.socket, queue: Queue) -> None:
    conn.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    buf = b""
    with conn:
        while True:
            try:
                data, ancillary, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(16))
            except OSError:
                return
            if not data:
                return
            buf += data
            while end := _request_end(buf):
                request, buf = buf[:end], buf[end:]
                if request.startswith(b"GET /taken "):
                    body = str(queue.taken).encode()
                    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n\r\n"
                    conn.sendall(head.encode() + body)
                    continue
                done = queue.take(_received_ns(ancillary))
                time.sleep(max(0, done - time.time_ns()) / 1e9)
                try:
                    conn.sendall(RESPONSE)
                except OSError:
                    return


def main(service_ms: float) -> None:
    queue = Queue(round(service_ms * 1e6))
    listener = socket.create_server(("127.0.0.1", 0))
    print(listener.getsockname()[1], flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=serve_connection, args=(conn, queue), daemon=True).start()


@contextmanager
def serve_queue(service_s: float) -> Iterator[str]:
    """Run the server in a process of its own for the life of the block: yields its base URL."""
    proc = subprocess.Popen(
        [sys.executable, __file__, str(service_s * 1e3)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


if __name__ == "__main__":
    main(float(sys.argv[1]))
