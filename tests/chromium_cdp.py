"""A headless Chromium driven over the DevTools protocol, for the tests that look at the pages
servelab makes (tests/test_site_browser.py).

Chromium (Debian's `chromium` package) is started by the test with a fresh profile and
`--remote-debugging-port=0`; the port it chose is read from DevToolsActivePort in the profile,
and one page target is driven over its websocket (aiohttp, in the test extra). What a page
load reports: every failed request (Network.loadingFailed, and responses with an HTTP error
status), every console error or warning (Runtime.consoleAPICalled, Log.entryAdded) and every
uncaught exception (Runtime.exceptionThrown). Nothing here fetches from the network: the
pages are file:// URLs.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def chromium_binary() -> str | None:
    """The Chromium on PATH, or None."""
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class PageLoad:
    """What loading one URL showed."""

    url: str
    failed: list[str] = field(default_factory=list)  # "URL: error text"
    console: list[str] = field(default_factory=list)  # "level: text"
    exceptions: list[str] = field(default_factory=list)
    title: str = ""

    @property
    def problems(self) -> list[str]:
        return (
            [f"failed to load {f}" for f in self.failed]
            + [f"console {c}" for c in self.console]
            + [f"exception {e}" for e in self.exceptions]
        )


class Page:
    """One page target: send commands, collect events."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self._ws = ws
        self._next = 0
        self._replies: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = json.loads(msg.data)
            if "id" in data and data["id"] in self._replies:
                self._replies.pop(data["id"]).set_result(data)
            elif "method" in data:
                await self._events.put(data)

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        self._next += 1
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._replies[self._next] = fut
        await self._ws.send_str(json.dumps({"id": self._next, "method": method, "params": params}))
        reply = await asyncio.wait_for(fut, 30)
        if "error" in reply:
            raise AssertionError(f"{method}: {reply['error']}")
        result: dict[str, Any] = reply.get("result", {})
        return result

    def _drain(self) -> list[dict[str, Any]]:
        out = []
        while not self._events.empty():
            out.append(self._events.get_nowait())
        return out

    async def load(self, url: str, timeout_s: float = 30.0) -> PageLoad:
        """Navigate to `url`, wait for its load event and a short quiet spell, and report."""
        self._drain()
        seen = PageLoad(url)
        requests: dict[str, str] = {}
        await self.send("Page.navigate", url=url)
        deadline = time.monotonic() + timeout_s
        loaded_at: float | None = None
        while True:
            now = time.monotonic()
            if now > deadline:
                raise AssertionError(f"{url}: no load event in {timeout_s:.0f} s")
            if loaded_at is not None and now - loaded_at > 0.5:
                break
            try:
                ev = await asyncio.wait_for(self._events.get(), 0.1)
            except TimeoutError:
                continue
            method, p = ev["method"], ev.get("params", {})
            if method == "Page.loadEventFired":
                loaded_at = time.monotonic()
            elif method == "Network.requestWillBeSent":
                requests[p["requestId"]] = p["request"]["url"]
            elif method == "Network.loadingFailed":
                where = requests.get(p["requestId"], "?")
                seen.failed.append(f"{where}: {p.get('errorText')}")
            elif method == "Network.responseReceived":
                status = int(p["response"].get("status") or 0)
                if status >= 400:
                    seen.failed.append(f"{p['response']['url']}: HTTP {status}")
            elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "warning"):
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in p["args"])
                seen.console.append(f"{p['type']}: {text}")
            elif method == "Log.entryAdded" and p["entry"].get("level") in ("error", "warning"):
                seen.console.append(f"{p['entry']['level']}: {p['entry'].get('text')}")
            elif method == "Runtime.exceptionThrown":
                seen.exceptions.append(str(p["exceptionDetails"].get("text")))
        seen.title = str(await self.evaluate("document.title"))
        return seen

    async def evaluate(self, expression: str) -> Any:
        r = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in r:
            raise AssertionError(f"{expression}: {r['exceptionDetails'].get('text')}")
        return r["result"].get("value")

    async def screenshot(self, path: Path, width: int, height: int | None = None) -> None:
        """A PNG of the page at `width` CSS pixels (the whole page, or `height` of it)."""
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height or 800,
            deviceScaleFactor=1,
            mobile=width < 600,
        )
        full = height is None
        shot = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=full)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        await self.send("Emulation.clearDeviceMetricsOverride")

    async def close(self) -> None:
        self._reader.cancel()
        await self._ws.close()


@asynccontextmanager
async def chromium(binary: str) -> AsyncIterator[Page]:
    """A headless Chromium with a fresh profile and one page, stopped afterwards."""
    # its helper processes may still write to the profile while they stop
    with tempfile.TemporaryDirectory(
        prefix="servelab-chromium-", ignore_cleanup_errors=True
    ) as profile:
        proc = subprocess.Popen(
            [
                binary,
                "--headless=new",
                "--no-sandbox",  # root in a container: the sandbox needs user namespaces
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--font-render-hinting=none",
                "--allow-file-access-from-files",
                f"--user-data-dir={profile}",
                "--remote-debugging-port=0",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stopped with its helpers
        )
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 60
            while not port_file.is_file() or not port_file.read_text().strip():
                if proc.poll() is not None:
                    raise AssertionError(f"{binary} exited with {proc.returncode} at start")
                if time.monotonic() > deadline:
                    raise AssertionError(f"{binary}: no DevToolsActivePort in 60 s")
                await asyncio.sleep(0.1)
            port = int(port_file.read_text().split()[0])
            async with aiohttp.ClientSession() as http:
                async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
                    targets = await r.json(content_type=None)
                target = next(t for t in targets if t.get("type") == "page")
                ws = await http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0)
                page = Page(ws)
                try:
                    for domain in ("Page", "Network", "Runtime", "Log"):
                        await page.send(f"{domain}.enable")
                    yield page
                finally:
                    await page.close()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
