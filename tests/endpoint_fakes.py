"""A running "server" for the endpoint tests (runtime.kind endpoint): an aiohttp app in a
thread of the test process that answers what servelab asks a server it did not launch.

GET /health, /v1/models (FakeEndpoint.models, with the fields vLLM adds and servelab drops:
`created`, `permission`), /version, /metrics (FakeEndpoint.metrics: vLLM's
vllm:cache_config_info and python_info lines); POST /tokenize (a word "t<i>" is token i,
another word token 1000 + crc32 % 1000, one token per word) and /detokenize, and
/v1/completions streamed as tests/fake_vllm_server.py streams it. Set a route's answer to an
HTTP status (`fail`) to make it fail.
"""

from __future__ import annotations

import asyncio
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

METRICS = (
    "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
    "# TYPE vllm:cache_config_info gauge\n"
    'vllm:cache_config_info{block_size="128",enable_prefix_caching="False",engine="0",'
    'kv_cache_max_concurrency="8.5",kv_cache_size_tokens="8704",num_gpu_blocks="68"} 1.0\n'
    'python_info{implementation="CPython",major="3",minor="11",version="3.11.7"} 1.0\n'
    "process_start_time_seconds 1.7e+09\n"
    'vllm:num_requests_running{engine="0",model_name="served"} 0.0\n'
)


def model_entry(name: str, max_model_len: int = 1024) -> dict[str, Any]:
    """A /v1/models entry as vLLM 0.32 gives it."""
    return {
        "id": name,
        "object": "model",
        "created": 1796354280,
        "owned_by": "vllm",
        "root": f"/models/{name}",
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [{"id": "modelperm-1", "object": "model_permission"}],
    }


def token_of(word: str) -> int:
    if word.startswith("t") and word[1:].isdigit():
        return int(word[1:])
    return 1000 + zlib.crc32(word.encode()) % 1000


@dataclass
class FakeEndpoint:
    models: list[dict[str, Any]] = field(default_factory=lambda: [model_entry("served")])
    version: dict[str, Any] | None = field(default_factory=lambda: {"version": "0.32.0"})
    metrics: str | None = METRICS
    fail: dict[str, int] = field(default_factory=dict)  # path -> HTTP status
    asked: list[str] = field(default_factory=list)  # every path asked, in order

    def app(self) -> web.Application:
        import fake_vllm_server

        @web.middleware
        async def failing(request: web.Request, handler: Any) -> web.StreamResponse:
            self.asked.append(request.path)
            if request.path in self.fail:
                return web.Response(status=self.fail[request.path], text="no")
            return await handler(request)  # type: ignore[no-any-return]

        async def health(request: web.Request) -> web.Response:
            return web.Response(text="")

        async def models(request: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": self.models})

        async def version(request: web.Request) -> web.Response:
            if self.version is None:
                return web.Response(status=404)
            return web.json_response(self.version)

        async def metrics(request: web.Request) -> web.Response:
            if self.metrics is None:
                return web.Response(status=404)
            return web.Response(text=self.metrics)

        async def tokenize(request: web.Request) -> web.Response:
            body = await request.json()
            return web.json_response({"tokens": [token_of(w) for w in body["prompt"].split()]})

        async def detokenize(request: web.Request) -> web.Response:
            body = await request.json()
            return web.json_response({"prompt": "".join(f" t{i}" for i in body["tokens"])})

        app = web.Application(middlewares=[failing])
        app.router.add_get("/health", health)
        app.router.add_get("/v1/models", models)
        app.router.add_get("/version", version)
        app.router.add_get("/metrics", metrics)
        app.router.add_post("/tokenize", tokenize)
        app.router.add_post("/detokenize", detokenize)
        app.router.add_post("/v1/completions", fake_vllm_server.completions)
        return app


@contextmanager
def running(fake: FakeEndpoint) -> Iterator[str]:
    """Serve `fake` on 127.0.0.1 (a free port) in a thread; yields its base URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(fake.app())
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
