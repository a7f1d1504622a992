"""Stop signals during a point: SIGINT, SIGTERM and SIGHUP cancel the running point and
surface as KeyboardInterrupt, on uvloop's event loop where it is installed, else asyncio's.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


async def _stoppable(main: Coroutine[Any, Any, T]) -> T:
    """Run `main`; SIGINT, SIGTERM or SIGHUP cancel it and surface as KeyboardInterrupt.

    A Python signal handler that raises would raise inside whatever callback the loop is
    running, e.g. a read of a response, where it reads as a failed request and the point
    would complete as if nothing happened. The loop's own handlers cancel the point instead,
    and the handlers in place before (servelab.launch.server.raise_on_signals) are put back
    after."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    got: list[int] = []

    def stop(signum: int) -> None:
        got.append(signum)
        if task is not None:
            task.cancel()

    before: dict[int, Any] = {}
    for sig in STOP_SIGNALS:
        prev = signal.getsignal(sig)
        try:
            loop.add_signal_handler(sig, stop, sig)
        except (ValueError, RuntimeError, NotImplementedError):  # not the main thread
            continue
        before[sig] = prev
    try:
        return await main
    except asyncio.CancelledError:
        if got:
            raise KeyboardInterrupt(f"signal {got[0]}") from None
        raise
    finally:
        for signum, prev in before.items():
            loop.remove_signal_handler(signum)
            signal.signal(signum, prev)


def run_stoppable(main: Coroutine[Any, Any, T]) -> None:
    """Run on uvloop where it is installed (a dependency except on Windows): its event loop
    costs about a fifth less CPU per streamed chunk than asyncio's at low rates, where each
    chunk is a wake-up of its own."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - Windows
        asyncio.run(_stoppable(main))
    else:
        uvloop.run(_stoppable(main))
