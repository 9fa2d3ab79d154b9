"""Calling the ASGI app directly with fake receive/send: fast, no server."""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import orjson


@dataclass
class Response:
    status: int
    headers: dict
    body: bytes

    def json(self):
        return orjson.loads(self.body)

    def events(self) -> list:
        """SSE payloads, [DONE] as the string "[DONE]"."""
        out = []
        for block in self.body.decode().split("\n\n"):
            if block:
                assert block.startswith("data: "), block
                data = block[len("data: "):]
                out.append(data if data == "[DONE]" else orjson.loads(data))
        return out


async def call(app, method: str, path: str, json=None, body: bytes | None = None, key: str | None = "test-key",
               content_type: bytes = b"application/json", chunks: int = 1, disconnect_after_sends: int | None = None,
               disconnect_now=None, headers: list | None = None) -> Response:
    """headers: extra (name, value) byte pairs, after content-type and the bearer key."""
    if body is None:
        body = orjson.dumps(json) if json is not None else b""
    parts = [body[i * len(body) // chunks:(i + 1) * len(body) // chunks] for i in range(chunks)]
    messages = [{"type": "http.request", "body": part, "more_body": i < chunks - 1} for i, part in enumerate(parts)]
    gone = disconnect_now or asyncio.Event()
    sent = []

    async def receive():
        if messages:
            return messages.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        if disconnect_after_sends is not None and len(sent) >= disconnect_after_sends:
            gone.set()

    sent_headers = [(b"content-type", content_type)]
    if key is not None:
        sent_headers.append((b"authorization", b"Bearer " + key.encode()))
    sent_headers += headers or []
    scope = {"type": "http", "method": method, "path": path, "headers": sent_headers, "query_string": b""}
    await app(scope, receive, send)
    if not sent:
        return Response(0, {}, b"")
    start = sent[0]
    return Response(start["status"], {k.decode(): v.decode() for k, v in start["headers"]},
                    b"".join(m.get("body", b"") for m in sent[1:]))


def run(coro):
    return asyncio.run(coro)


async def until(condition, what: str, timeout: float = 30.0) -> None:
    """Poll condition() on the event loop; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        await asyncio.sleep(0.005)


def wait_until(condition, what: str, timeout: float = 30.0, interval: float = 0.01):
    """The same from a plain thread; returns condition()'s first truthy value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(interval)
