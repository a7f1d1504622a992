"""A stand-in for the Hugging Face hub that replays a recorded repository listing.

tests/fixtures/hf/tree.json is the answer of `GET /api/models/<repo>/tree/<commit>?recursive=true`
in the hub's format (path, size, oid = git blob sha1, lfs.oid = sha256 of an LFS file's content)
for the files in tests/fixtures/hf/repo/. The server answers that listing and
`HEAD|GET /<repo>/resolve/<commit>/<path>` (the headers huggingface_hub reads: X-Repo-Commit,
ETag, Content-Length), so huggingface_hub's own snapshot_download runs against it, offline.
Every request's Authorization header is kept, to check which token was sent.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "hf"
REPO = "servelab-test/tiny-hf"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def recorded_tree() -> list[dict[str, Any]]:
    return list(json.loads((FIXTURE / "tree.json").read_text(encoding="utf-8")))


class FakeHub:
    def __init__(self, files: dict[str, bytes] | None = None) -> None:
        """files: what the server sends for each path (default: the fixture's files); send
        other bytes than the listing says to play a corrupted download."""
        self.files = files or {p.name: p.read_bytes() for p in (FIXTURE / "repo").iterdir()}
        self.auth: list[str | None] = []
        self.paths: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.url = ""

    async def _tree(self, request: web.Request) -> web.Response:
        self._seen(request)
        if request.match_info["rev"] != COMMIT:
            return web.json_response(
                {"error": "Invalid rev id"},
                status=404,
                headers={"X-Error-Code": "RevisionNotFound"},
            )
        return web.json_response(recorded_tree())

    async def _resolve(self, request: web.Request) -> web.Response:
        self._seen(request)
        path = request.match_info["path"]
        entry = next((e for e in recorded_tree() if e["path"] == path), None)
        if entry is None or request.match_info["rev"] != COMMIT:
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound"})
        body = self.files[path]
        etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
        headers = {
            "X-Repo-Commit": COMMIT,
            "ETag": f'"{etag}"',
            "Content-Length": str(len(body)),
            "Accept-Ranges": "bytes",
        }
        if request.method == "HEAD":
            return web.Response(status=200, headers=headers)
        return web.Response(status=200, body=body, headers=headers)

    def _seen(self, request: web.Request) -> None:
        self.auth.append(request.headers.get("Authorization"))
        self.paths.append(request.path)

    def __enter__(self) -> FakeHub:
        app = web.Application()
        app.router.add_get("/api/models/{org}/{name}/tree/{rev}", self._tree)
        app.router.add_route("*", "/{org}/{name}/resolve/{rev}/{path:.+}", self._resolve)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
