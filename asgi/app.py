"""The raw ASGI application: lifespan, auth, routing, errors.

    granian --interface asgi asgi.app:app        (settings from TINYLOOP_* variables)

One worker process holds the model; its engine runs on a dedicated thread so the
event loop never blocks on array work.
"""
from __future__ import annotations

import functools
import logging
import time

from .anthropic_errors import anthropic_error_body, anthropic_status, is_anthropic_path
from .auth import authorized, authorized_anthropic
from .drain import drain_on_signals
from .errors import ApiError, unavailable
from .http import ClientGone, guarded_send, parse_json_body, read_body, send_json
from .messages_api import count_tokens, messages
from .native_routes import native_generate
from .openai_routes import chat_completions, completions, list_models
from .ops_routes import health, metrics, openapi
from .responses_api import responses
from .settings import Settings
from .state import FAILED, LOADING, ServerState

log = logging.getLogger("tinyloop.server")

# path -> (method, handler, needs the model)
ROUTES = {
    "/v1/models": ("GET", list_models, True),
    "/v1/chat/completions": ("POST", chat_completions, True),
    "/v1/completions": ("POST", completions, True),
    "/v1/responses": ("POST", responses, True),
    "/v1/messages": ("POST", messages, True),
    "/v1/messages/count_tokens": ("POST", count_tokens, True),
    "/api/v0/models": ("GET", functools.partial(list_models, extended=True), True),
    "/api/v0/chat/completions": ("POST", functools.partial(chat_completions, extended=True), True),
    "/api/v0/completions": ("POST", functools.partial(completions, extended=True), True),
    "/generate": ("POST", native_generate, True),
    "/generate/speculative": ("POST", functools.partial(native_generate, mode="speculative"), True),
    "/generate/tree_speculative": ("POST", functools.partial(native_generate, mode="tree_speculative"), True),
    "/health": ("GET", health, False),
    "/metrics": ("GET", metrics, False),
    "/openapi.json": ("GET", openapi, False),
}


class Request:
    def __init__(self, app: "TinyLoopApp", scope, receive, send):
        self.state = app.state
        self.scope, self.receive, self.send = scope, receive, guarded_send(send)
        self.started = time.perf_counter()
        self.stream = None                     # the EventStream once a stream has started
        self.generation = None                 # the Generation once one was submitted
        self.anthropic = False                 # an Anthropic route: its error shape, x-api-key accepted
        self._limit = app.state.settings.max_body_bytes

    async def json(self) -> dict:
        return parse_json_body(self.scope, await read_body(self.receive, self._limit))


class TinyLoopApp:
    def __init__(self, settings: Settings | None = None):
        self._settings = settings
        self.state: ServerState | None = None

    def _ensure_state(self) -> ServerState:
        if self.state is None:
            self.state = ServerState(self._settings or Settings.from_env())
            self.state.start_loading()
        return self.state

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            self._ensure_state()
            await self._http(scope, receive, send)

    async def _lifespan(self, receive, send):
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    self._ensure_state()
                except Exception as exc:       # noqa: BLE001 - bad settings: refuse to start, say why
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                drain_on_signals(self.state)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.state is not None:
                    self.state.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope, receive, send):
        request = Request(self, scope, receive, send)
        path = scope["path"].rstrip("/") or "/"
        route_label = path if path in ROUTES else "unknown"
        request.anthropic = is_anthropic_path(path)    # errors in Anthropic's shape; x-api-key accepted
        status = 200
        try:
            if self.state.key is not None and not self._authorized(request):
                how = "'x-api-key: <key>' or " if request.anthropic else ""
                raise ApiError(401, f"missing or wrong API key: send {how}'Authorization: Bearer <key>'",
                               "authentication_error", None, "invalid_api_key",
                               headers=[(b"www-authenticate", b"Bearer")])
            if path not in ROUTES:
                # GET/DELETE /v1/responses/{id} would read a stored response: say why there is none
                stored = "; this server keeps no responses (see store)" if path.startswith("/v1/responses/") else ""
                raise ApiError(404, f"no route {scope['method']} {scope['path']}{stored}", "invalid_request_error",
                               None, "not_found")
            method, handler, needs_model = ROUTES[path]
            if scope["method"] != method:
                raise ApiError(405, f"{path} accepts {method}, not {scope['method']}", "invalid_request_error",
                               None, "method_not_allowed", headers=[(b"allow", method.encode())])
            if needs_model:
                self._require_model()
            await handler(request)
        except ApiError as exc:
            status = anthropic_status(exc) if request.anthropic else exc.status
            await self._send_error(request, exc)
        except ClientGone:
            status = 499                     # the client left; nothing to send
        except Exception:                    # noqa: BLE001 - a bug: log it, answer 500, keep serving
            status = 500
            log.exception("internal error on %s %s", scope["method"], path)
            await self._send_error(request, ApiError(500, "internal server error", "server_error", None,
                                                     "internal_error"))
        finally:
            if request.generation is not None:
                request.generation.settle()    # whatever happened, its admission slot is given back
            self.state.metrics.on_request(route_label, status)

    def _authorized(self, request: Request) -> bool:
        headers = request.scope.get("headers", [])
        return (authorized_anthropic if request.anthropic else authorized)(headers, self.state.key)

    def _require_model(self) -> None:
        state = self.state
        if state.status == LOADING:
            raise ApiError(503, "the model is still loading; retry shortly", "server_error", None,
                           "model_loading", headers=[(b"retry-after", b"1")])
        if state.status == FAILED:
            raise unavailable(state.failure or "the worker failed", "worker_failed")

    async def _send_error(self, request: Request, error: ApiError) -> None:
        if request.stream is not None and request.stream.started:
            # Headers are gone; report inside the stream (each API its own way), then end it.
            try:
                await request.stream.fail(error)
            except ClientGone:               # the client is gone already
                pass
            return
        status, body = (anthropic_status(error), anthropic_error_body(error)) if request.anthropic else \
            (error.status, error.body())
        try:
            await send_json(request.send, status, body, error.headers)
        except ClientGone:                   # nobody is left to tell
            pass


app = TinyLoopApp()

__all__ = ["TinyLoopApp", "app"]
