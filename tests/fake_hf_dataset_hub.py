"""A stand-in for the Hugging Face hub's dataset repositories, offline.

tests/fixtures/hf_dataset/paths-info.json holds, in the hub's format, what
`POST /api/datasets/<repo>/paths-info/<commit>` answers for the files of
tests/fixtures/hf_dataset/repo/ (and its folder): path, size, oid = git blob sha1 (of the LFS
pointer for an LFS file), lfs.oid = sha256 of an LFS file's content. The server answers that
call with the entries of the paths asked (the hub leaves out a path it does not have) and
`HEAD|GET /datasets/<repo>/resolve/<commit>/<path>` with the headers huggingface_hub reads
(X-Repo-Commit, ETag, Content-Length), so huggingface_hub's own get_paths_info and
hf_hub_download run against it. Every request's path and Authorization header are kept.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

from aiohttp import web

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "hf_dataset"
REPO_ID = "servelab-test/chat-mini"
COMMIT = "89abcdef0123456789abcdef0123456789abcdef"
SHAREGPT = "data/sharegpt-mini.json"  # an LFS file
JSONL = "prompts.jsonl"  # a plain git file


def recorded_paths_info() -> list[dict[str, Any]]:
    return list(json.loads((FIXTURE / "paths-info.json").read_text(encoding="utf-8")))


def fixture_files() -> dict[str, bytes]:
    root = FIXTURE / "repo"
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


class FakeDatasetHub:
    def __init__(self, files: dict[str, bytes] | None = None) -> None:
        """files: what the server sends for each path (default: the fixture's files); send
        other bytes than the listing says to play a corrupted download."""
        self.files = files or fixture_files()
        self.auth: list[str | None] = []
        self.paths: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.url = ""

    def _unknown(self, request: web.Request) -> web.Response | None:
        repo = f"{request.match_info['org']}/{request.match_info['name']}"
        if repo != REPO_ID:
            return web.json_response(
                {"error": "Repository not found"},
                status=404,
                headers={"X-Error-Code": "RepoNotFound"},
            )
        if request.match_info["rev"] != COMMIT:
            return web.json_response(
                {"error": "Invalid rev id"},
                status=404,
                headers={"X-Error-Code": "RevisionNotFound"},
            )
        return None

    async def _paths_info(self, request: web.Request) -> web.Response:
        self._seen(request)
        refused = self._unknown(request)
        if refused is not None:
            return refused
        form = await request.post()
        asked = set(form.getall("paths", []))
        return web.json_response([e for e in recorded_paths_info() if e["path"] in asked])

    async def _resolve(self, request: web.Request) -> web.Response:
        self._seen(request)
        refused = self._unknown(request)
        if refused is not None:
            return refused
        path = request.match_info["path"]
        entry = next(
            (e for e in recorded_paths_info() if e["path"] == path and e["type"] == "file"), None
        )
        if entry is None:
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

    def __enter__(self) -> FakeDatasetHub:
        app = web.Application()
        app.router.add_post("/api/datasets/{org}/{name}/paths-info/{rev}", self._paths_info)
        app.router.add_route("*", "/datasets/{org}/{name}/resolve/{rev}/{path:.+}", self._resolve)
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
