"""The comparison server: TinyLoop's engine behind FastAPI, uvicorn and sse-starlette,
the stack a Python OpenAI-compatible server is commonly built on.

    TINYLOOP_BENCH_MODEL=M.tinyloop TINYLOOP_API_KEY=KEY uvicorn tinyloop.bench.serving.fastapi_app:app

Only the HTTP layer differs from `tinyloop serve`: the same Engine (one generation runs,
TINYLOOP_BENCH_MAX_WAITING wait, 429 beyond), the same prompt encoding, the same
hand-over of tokens from the engine thread (the event loop is woken once per batch of
tokens, not once per token), and for `/v1/completions` the same OpenAI response
shapes, streamed one server-sent event per token. Written for the bench, not for use.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Header, HTTPException
from pydantic import BaseModel
from sse_starlette.sse import EventSourceResponse

from asgi.generation import Mailbox
from tinyloop.engine.engine import Engine, QueueFull
from tinyloop.engine.request import GenerationRequest
from tinyloop.engine.sampling import SamplingParams
from tinyloop.errors import RequestError
from tinyloop.model.loader import load_model

STATE: dict = {}


@asynccontextmanager
async def lifespan(app):
    loaded = load_model(os.environ["TINYLOOP_BENCH_MODEL"])
    STATE.update(loaded=loaded, key=os.environ.get("TINYLOOP_API_KEY"),
                 engine=Engine(loaded, int(os.environ.get("TINYLOOP_BENCH_MAX_WAITING", "8"))))
    yield
    STATE["engine"].stop()


app = FastAPI(lifespan=lifespan)


class StreamOptions(BaseModel):
    include_usage: bool = False


class CompletionRequest(BaseModel):
    model: str
    prompt: str
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stream: bool = False
    stream_options: StreamOptions | None = None


def authorized(authorization: str | None = Header(default=None)) -> None:
    if STATE["key"] and authorization != f"Bearer {STATE['key']}":
        raise HTTPException(401, "invalid API key")


async def run(body: CompletionRequest):
    """Yield (text, None) per token, then (None, GenerationResult)."""
    loaded = STATE["loaded"]
    request = GenerationRequest(loaded.encode_prompt(body.prompt), body.max_tokens,
                                sampling=SamplingParams(temperature=body.temperature, top_p=body.top_p))
    events = Mailbox(asyncio.get_running_loop())        # the TinyLoop server's own engine -> loop hand-off
    try:
        STATE["engine"].submit(request, on_event=lambda kind, payload: events.put((kind, payload)))
    except QueueFull as exc:
        raise HTTPException(429, str(exc), headers={"retry-after": "1"}) from None
    except RequestError as exc:
        raise HTTPException(400, str(exc)) from None
    while True:
        for kind, payload in await events.take_all():
            if kind == "token":
                yield payload[1], None
            elif kind == "done":
                yield None, payload
                return
            else:
                raise HTTPException(503, str(payload))


def usage(result) -> dict:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.completion_tokens,
            "total_tokens": result.prompt_tokens + result.completion_tokens}


@app.get("/health", dependencies=[Depends(authorized)])
async def health():
    return {"status": "ready"}


@app.post("/v1/completions", dependencies=[Depends(authorized)])
async def completions(body: CompletionRequest):
    ident, created = "cmpl-" + uuid.uuid4().hex[:24], int(time.time())

    def chunk(text, finish=None):
        return {"id": ident, "object": "text_completion", "created": created, "model": body.model,
                "choices": [{"index": 0, "text": text, "finish_reason": finish}]}

    tokens = run(body)
    if not body.stream:
        parts, result = [], None
        async for text, result in tokens:
            if text:
                parts.append(text)
        parts.append(result.text_tail)
        return {**chunk("".join(parts), result.finish_reason), "usage": usage(result)}
    first = await anext(tokens)                        # a 429 is still an HTTP status, not a stream event

    async def events():
        async for text, result in _prepend(first, tokens):
            if text:
                yield {"data": json.dumps(chunk(text))}
        final = chunk(result.text_tail, result.finish_reason)
        yield {"data": json.dumps(final)}
        if body.stream_options and body.stream_options.include_usage:
            yield {"data": json.dumps({**chunk("", None), "choices": [], "usage": usage(result)})}
        yield {"data": "[DONE]"}
    return EventSourceResponse(events())


async def _prepend(first, rest):
    yield first
    async for item in rest:
        yield item
