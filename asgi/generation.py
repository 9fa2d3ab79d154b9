"""One generation as the event loop sees it: the engine's events, and disconnects.

The engine thread produces token ids and their text (UTF-8 safe, cut before any stop
string: engine/output.py); here they are handed to a response writer in batches. The
client's `receive()` channel is watched the whole time: a disconnect cancels the
request, whether it is waiting or running.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass

from tinyloop.engine.engine import EngineFailed, QueueFull, ShuttingDown
from tinyloop.engine.output import FINISH_SHUTDOWN
from tinyloop.engine.request import GenerationRequest, GenerationResult
from tinyloop.errors import RequestError

from .errors import ApiError, bad_request, unavailable
from .http import ClientGone

RETRY_AFTER_SECONDS = 1


class Mailbox:
    """Events from the engine thread to the event loop.

    The engine appends; the loop is woken only when the box goes from empty to not
    empty, so a loop that falls behind drains many tokens per wake-up instead of
    paying one cross-thread wake-up per token.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._items: deque = deque()
        self._lock = threading.Lock()
        self._ready = asyncio.Event()

    def put(self, item) -> None:                      # engine thread
        with self._lock:
            self._items.append(item)
            wake = len(self._items) == 1
        if wake:
            self._loop.call_soon_threadsafe(self._ready.set)

    def put_local(self, item) -> None:                # event loop thread
        with self._lock:
            self._items.append(item)
        self._ready.set()

    async def take_all(self) -> list:
        await self._ready.wait()
        with self._lock:
            items = list(self._items)
            self._items.clear()
            self._ready.clear()
        return items


@dataclass
class Outcome:
    result: GenerationResult
    finish_reason: str                  # "stop" or "length"
    completion_tokens: int
    time_to_first_token_ms: float | None


class Generation:
    """One request's generation, from admission to its end. Every admitted generation is
    settled exactly once (settle(), called by the app whatever happened): its submission
    cancelled if it had not finished, and its end counted as completed, cancelled or
    failed, so the admission metrics add up."""

    def __init__(self, http_request, request: GenerationRequest):
        self.state = http_request.state
        self.request = request
        self.receive = http_request.receive
        self.started = http_request.started
        self.first_token_at: float | None = None
        self.outcome: Outcome | None = None
        self.logprobs: list = []          # TokenLogprobs per generated token, when the request asks for them
        self.submission = None
        self.failed = False
        self.settled = False
        self._mailbox = Mailbox(asyncio.get_running_loop())
        http_request.generation = self

    def submit(self) -> None:
        """Queue the request; 400 if the engine refuses it, 429 when every waiting place is
        taken, 503 if the server is draining or the engine failed or is stopping."""
        if self.state.draining:
            self.state.metrics.on_refused("draining")
            raise ApiError(503, "the server is draining: it finishes the generations it has admitted and "
                                "takes no new ones; retry (another replica will answer)", "server_error", None,
                           "draining", headers=[(b"retry-after", str(RETRY_AFTER_SECONDS).encode())])
        try:
            self.submission = self.state.engine.submit(
                self.request, on_event=lambda kind, payload: self._mailbox.put((kind, payload)))
        except RequestError as exc:
            raise bad_request(str(exc), exc.param) from None
        except QueueFull as exc:
            self.state.metrics.on_refused("queue_full")
            raise ApiError(429, f"the server is busy: {exc}; retry after the running generation ends",
                           "rate_limit_error", None, "queue_full",
                           headers=[(b"retry-after", str(RETRY_AFTER_SECONDS).encode())]) from None
        except ShuttingDown as exc:
            self.state.metrics.on_refused("shutting_down")
            raise unavailable(str(exc), "shutting_down") from None
        except EngineFailed as exc:
            self.state.metrics.on_refused("worker_failed")
            raise unavailable(str(exc), "worker_failed") from None
        self.state.metrics.on_admitted()

    def settle(self) -> None:
        """Give the admission slot back (cancel the submission if it has not finished) and
        count how the generation ended; a second call does nothing."""
        if self.settled or self.submission is None:
            return
        self.settled = True
        if self.outcome is None:
            self.state.engine.cancel(self.submission)
        end = "completed" if self.outcome is not None else "failed" if self.failed else "cancelled"
        self.state.metrics.on_settled(end)

    async def batches(self):
        """Yield lists of (token_id, released_text): every token that arrived since the
        last wake-up (a final tail held back for stop strings comes as token_id None).
        Sets self.outcome."""
        watcher = asyncio.ensure_future(self._watch_disconnect())
        try:
            while True:
                batch = []
                for kind, payload in await self._mailbox.take_all():
                    if kind == "token":
                        if self.first_token_at is None:
                            self.first_token_at = time.perf_counter()
                        batch.append(payload)
                    elif kind == "logprobs":
                        self.logprobs.append(payload)
                    elif kind == "done":
                        if payload.finish_reason == FINISH_SHUTDOWN:
                            self.failed = True
                            if batch:                  # tokens that came before the stop are delivered
                                yield batch
                            raise unavailable("the server is shutting down; the generation was stopped",
                                              "shutting_down")
                        self._finish(payload)
                        if payload.text_tail:
                            batch.append((None, payload.text_tail))
                        if batch:
                            yield batch
                        return
                    elif kind == "disconnect":
                        raise ClientGone()
                    elif kind == "error":
                        self.failed = True
                        if batch:                      # tokens that came before the failure are delivered
                            yield batch
                        if isinstance(payload, RequestError):
                            raise bad_request(str(payload), payload.param)
                        if isinstance(payload, ShuttingDown):
                            raise unavailable("the server is shutting down; the request was stopped before "
                                              "it finished", "shutting_down")
                        raise unavailable(str(payload), "worker_failed")
                if batch:
                    yield batch
        finally:
            watcher.cancel()
            if self.outcome is None and self.submission is not None:
                self.state.engine.cancel(self.submission)

    async def text(self) -> tuple[list, str]:
        """Run to the end: (token ids, released text)."""
        tokens, parts = [], []
        async for batch in self.batches():
            for token_id, text in batch:
                if token_id is not None:
                    tokens.append(token_id)
                parts.append(text or "")
        return tokens, "".join(parts)

    def _finish(self, result: GenerationResult) -> None:
        if self.first_token_at is None and result.completion_tokens:
            self.first_token_at = time.perf_counter()
        ttft = None if self.first_token_at is None else (self.first_token_at - self.started) * 1000
        self.outcome = Outcome(result, result.finish_reason, result.completion_tokens, ttft)
        if ttft is not None:
            self.state.metrics.on_first_token(ttft / 1000)

    async def _watch_disconnect(self) -> None:
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                if self.submission is not None:
                    self.state.engine.cancel(self.submission)
                self.state.metrics.on_disconnect()
                self._mailbox.put_local(("disconnect", None))
                return
