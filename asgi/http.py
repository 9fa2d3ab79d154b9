"""Raw ASGI plumbing: request bodies, JSON and SSE responses."""
from __future__ import annotations

import orjson

from .errors import ApiError

JSON_HEADERS = [(b"content-type", b"application/json")]
SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
               (b"x-accel-buffering", b"no")]


class ClientGone(Exception):
    """The client disconnected (while we read its request, or wrote the response)."""


def guarded_send(send):
    """send, with the OSError a server raises for a connection the client closed turned
    into ClientGone: a disconnect to record, not a server error."""
    async def guarded(message):
        try:
            await send(message)
        except OSError as exc:
            raise ClientGone() from exc
    return guarded


def header(scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", []):
        if key == name:
            return value
    return None


async def read_body(receive, limit: int) -> bytes:
    """The whole request body; 413 beyond `limit` bytes."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"request body is larger than the limit of {limit} bytes "
                                "(TINYLOOP_MAX_BODY_BYTES)", "invalid_request_error", None, "body_too_large")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def parse_json_body(scope, body: bytes):
    """Check the content type and decode the JSON body (an object)."""
    content_type = (header(scope, b"content-type") or b"").split(b";")[0].strip().lower()
    if content_type not in (b"application/json", b""):
        raise ApiError(415, f"content-type must be application/json, got {content_type.decode('latin-1')!r}",
                       "invalid_request_error", None, "unsupported_media_type")
    if not body:
        raise ApiError(400, "request body is empty; send a JSON object", "invalid_request_error", None,
                       "invalid_json")
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"request body is not valid UTF-8 (byte {exc.start})", "invalid_request_error",
                       None, "invalid_json") from None
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", "invalid_request_error", None,
                       "invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(422, f"request body must be a JSON object, got {_json_type(data)}",
                       "invalid_request_error", None, "invalid_type")
    return data


def _json_type(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


async def send_json(send, status: int, payload, headers: list | None = None) -> None:
    body = orjson.dumps(payload)
    await send({"type": "http.response.start", "status": status,
                "headers": JSON_HEADERS + [(b"content-length", str(len(body)).encode())] + (headers or [])})
    await send({"type": "http.response.body", "body": body})


async def send_text(send, status: int, text: str, content_type: bytes) -> None:
    body = text.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class EventStream:
    """Server-sent events: `data: <json>\\n\\n` per event, `data: [DONE]\\n\\n` at the end."""

    def __init__(self, send):
        self.send = send
        self.started = False

    async def start(self) -> None:
        await self.send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        self.started = True

    async def event(self, payload) -> None:
        await self.events([payload])

    async def events(self, payloads: list) -> None:
        """Several events in one body chunk (tokens that arrived together)."""
        if payloads:
            body = b"".join(b"data: " + orjson.dumps(p) + b"\n\n" for p in payloads)
            await self.send({"type": "http.response.body", "body": body, "more_body": True})

    async def done(self) -> None:
        await self.send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    async def fail(self, error: ApiError) -> None:
        """An error after the headers went out: reported as an event, then the stream ends."""
        await self.event(error.body())
        await self.done()
