"""Which port a server servelab launches listens on: the configured one where it is free,
else a free one (`choose_port`, said in one line when the configured port is taken)."""

from __future__ import annotations

import socket
from collections.abc import Callable


def port_is_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def choose_port(host: str, wanted: int, say: Callable[[str], None] = print) -> int:
    """The configured port when it is free; otherwise (or for 0) a free one."""
    if wanted and port_is_free(host, wanted):
        return wanted
    port = free_port(host)
    if wanted:
        say(f"server: port {wanted} on {host} is taken; using {port} instead")
    return port
