"""Operational routes: /health, /metrics, /openapi.json."""
from __future__ import annotations

from .http import send_json, send_text
from .openapi import openapi_document
from .state import READY


async def health(request):
    state = request.state
    status = state.health
    body = {"status": status, "model": state.settings.model_path}
    if state.failure:
        body["reason"] = state.failure
    await send_json(request.send, 200 if status == READY else 503, body)


async def metrics(request):
    engine = request.state.engine
    running = engine.running if engine else 0
    waiting = engine.waiting if engine else 0
    await send_text(request.send, 200, request.state.metrics.render(running, waiting, request.state.draining, engine),
                    b"text/plain; version=0.0.4; charset=utf-8")


async def openapi(request):
    await send_json(request.send, 200, openapi_document())
