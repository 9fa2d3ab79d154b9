"""Server-sent events with a type line, as the Responses and Messages APIs send them:

    event: <payload's "type">
    data: <payload as JSON>

No `data: [DONE]` terminator: both APIs end a stream with a typed final event
(response.completed, message_stop) and the connection's end. The Responses API also
numbers its events (sequence_number, from 0), which its SDK uses to order them.
"""
from __future__ import annotations

import orjson

from .http import SSE_HEADERS


class TypedEventStream:
    def __init__(self, send, numbered: bool, failure):
        """failure(ApiError) -> the payloads that report an error once the stream has
        started (headers gone): the API's own failure events."""
        self.send = send
        self.numbered = numbered
        self.failure = failure
        self.started = False
        self.sequence_number = 0

    async def start(self) -> None:
        await self.send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        self.started = True

    async def event(self, payload: dict) -> None:
        await self.events([payload])

    async def events(self, payloads: list) -> None:
        """Several events in one body chunk (tokens that arrived together)."""
        if not payloads:
            return
        lines = []
        for payload in payloads:
            if self.numbered:
                payload["sequence_number"] = self.sequence_number
                self.sequence_number += 1
            lines.append(b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n")
        await self.send({"type": "http.response.body", "body": b"".join(lines), "more_body": True})

    async def done(self) -> None:
        await self.send({"type": "http.response.body", "body": b"", "more_body": False})

    async def fail(self, error) -> None:
        await self.events(self.failure(error))
        await self.done()
