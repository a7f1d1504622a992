"""A raw TCP server on 127.0.0.1 that answers each request with scripted bytes: for tests of
the client against servers that frame their responses, and misbehave, on purpose."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any


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


def chat_reply(messages: list[dict[str, str]], tokens: int) -> list[str]:
    """What ChatServer streams for `messages`, one token per piece: the number of messages it
    got, then `tokens - 1` words. A later turn's history must carry it back exactly."""
    return [f"[{len(messages)}]"] + [" w"] * (tokens - 1)


def reply_ids(tokens: int) -> list[int]:
    """The token ids of a ChatServer reply of `tokens` tokens (return_token_ids)."""
    return [100 + k for k in range(1, tokens + 1)]


def chat_event(msg: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(msg, separators=(",", ":")).encode() + b"\n\n"


class ChatServer:
    """A chat completions server that streams as vLLM does with continuous usage stats: a
    role-only first chunk (`delta: {role, content: ""}`, 0 completion tokens), `first_s` later
    the reply (chat_reply: one token per chunk, `gap_s` apart, usage so far in each), the usage
    chunk, [DONE], in chunked transfer encoding on a keep-alive connection.

    A completions request is answered with the same reply, without the role chunk. A request
    with `return_token_ids` gets vLLM's token ids: each content chunk's choice carries
    `token_ids` (`reply_ids`: token k of the reply is 100 + k), and the prompt's ids come once,
    as vLLM sends them (the completions' first chunk's choice, the chat role chunk's top level:
    `prompt_token_ids`, never an output's). Every request is kept (`bodies`, in arrival
    order). A request whose history does not carry back what this server answered before (an
    assistant message that is not chat_reply of the messages before it) is noted in `bad`. A last user message containing "FAIL" is answered
    with HTTP 500. prompt_tokens is the number of words in the messages."""

    def __init__(self, first_s: float = 0.0, gap_s: float = 0.0) -> None:
        self.first_s = first_s
        self.gap_s = gap_s
        self.bodies: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.bad: list[str] = []

    def check_history(self, messages: list[dict[str, str]]) -> None:
        for j, m in enumerate(messages):
            if m["role"] == "assistant":
                tokens = len(m["content"].split())  # "[n] w w": one word per token
                if m["content"] != "".join(chat_reply(messages[:j], tokens)):
                    self.bad.append(f"message {j} of {len(messages)}: {m['content']!r}")

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                hdrs = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
                body = json.loads(await reader.readexactly(int(hdrs["content-length"])))
                self.paths.append(lines[0].split(" ")[1])
                self.bodies.append(body)
                await self.answer(body, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    async def answer(self, body: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        if "prompt" in body:  # a completions request: one chunk per token, as vLLM
            messages = [{"role": "user", "content": body["prompt"]}]
        else:
            messages = body["messages"]
        self.check_history(messages)
        if "FAIL" in messages[-1]["content"]:
            text = b"no such turn"
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n"
                         % len(text) + text)  # fmt: skip
            await writer.drain()
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
        prompt = sum(len(m["content"].split()) for m in messages)

        async def event(
            choices: list[dict[str, Any]], done: int, top: dict[str, Any] | None = None
        ) -> None:
            usage = {"prompt_tokens": prompt, "completion_tokens": done,
                     "total_tokens": prompt + done}  # fmt: skip
            data = chat_event({"object": "chat.completion.chunk", "choices": choices,
                               "usage": usage, **(top or {})})  # fmt: skip
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()

        chat = "messages" in body
        ids = body.get("return_token_ids") is True
        prompt_ids = {"prompt_token_ids": list(range(prompt))} if ids else {}
        if chat:
            role = {"role": "assistant", "content": ""}
            await event([{"index": 0, "delta": role, "finish_reason": None}], 0, prompt_ids)
        await asyncio.sleep(self.first_s)
        pieces = chat_reply(messages, body["max_tokens"])
        for k, piece in enumerate(pieces, 1):
            if k > 1:
                await asyncio.sleep(self.gap_s)
            said: dict[str, Any] = {"delta": {"content": piece}} if chat else {"text": piece}
            if ids:
                said["token_ids"] = reply_ids(len(pieces))[k - 1 : k]
                if not chat and k == 1:
                    said.update(prompt_ids)
            await event([{"index": 0, **said, "finish_reason": None}], k)
        await event([], len(pieces))
        done = b"data: [DONE]\n\n"
        writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
        await writer.drain()


def serve_chat(server: ChatServer) -> Iterator[str]:
    """Run a ChatServer in a thread for the life of the generator: yields its base URL."""
    loop = asyncio.new_event_loop()
    srv = loop.run_until_complete(asyncio.start_server(server.handle, "127.0.0.1", 0))
    port = srv.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)


def serve_app(app: Any) -> Iterator[str]:
    """Run an aiohttp application on 127.0.0.1 in a thread for the life of the generator:
    yields its base URL."""
    from aiohttp import web

    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)
