"""One generation as the event loop sees it: engine job, text, stop strings, disconnects.

The engine thread produces token ids; here they become UTF-8-safe text deltas, pass
the stop-string matcher, and are yielded to a response writer. The client's
`receive()` channel is watched the whole time: a disconnect cancels the job, whether
it is waiting or running.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from tinyloop.engine.engine import EngineFailed, Job, QueueFull
from tinyloop.errors import RequestError
from tinyloop.engine.generate import GenerationRequest, GenerationResult
from tinyloop.engine.sampling import SamplingParams
from tinyloop.engine.speculative import SpeculativeParams
from tinyloop.text.stopstrings import StopStringMatcher
from tinyloop.text.tokenizer import StreamingDetokenizer

from .errors import ApiError, bad_request, unavailable
from .http import ClientGone

RETRY_AFTER_SECONDS = 1


@dataclass
class Prepared:
    """A validated request, in engine terms."""
    prompt_ids: list
    max_tokens: int
    loops: int | None
    sampling: SamplingParams
    stop_strings: list = field(default_factory=list)
    stop_ids: tuple = ()
    mode: str = "generate"
    speculative: SpeculativeParams | None = None
    cache_window: int = 0


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
    def __init__(self, state, prepared: Prepared, receive, started: float):
        self.state = state
        self.prepared = prepared
        self.receive = receive
        self.started = started
        self.detok = StreamingDetokenizer(state.loaded.tokenizer)
        self.matcher = StopStringMatcher(prepared.stop_strings)
        self.tokens_seen = 0
        self.first_token_at: float | None = None
        self.outcome: Outcome | None = None
        self._mailbox = Mailbox(asyncio.get_running_loop())
        request = GenerationRequest(prepared.prompt_ids, prepared.max_tokens, prepared.loops,
                                    prepared.sampling, prepared.stop_ids, cache_window=prepared.cache_window)
        self.job = Job(request, prepared.mode, prepared.speculative,
                       on_event=lambda kind, payload: self._mailbox.put((kind, payload)))

    def submit(self) -> None:
        """Queue the job; 429 when every waiting place is taken, 503 if the engine failed."""
        try:
            self.state.engine.submit(self.job)
        except QueueFull as exc:
            raise ApiError(429, f"the server is busy: {exc}; retry after the running generation ends",
                           "rate_limit_error", None, "queue_full",
                           headers=[(b"retry-after", str(RETRY_AFTER_SECONDS).encode())]) from None
        except EngineFailed as exc:
            raise unavailable(str(exc), "worker_failed") from None

    async def batches(self):
        """Yield lists of (token_id, released_text): every token that arrived since the
        last wake-up (a final flushed tail comes as token_id None). Sets self.outcome."""
        watcher = asyncio.ensure_future(self._watch_disconnect())
        try:
            while True:
                batch = []
                for kind, payload in await self._mailbox.take_all():
                    if kind == "token":
                        if self.matcher.stopped:
                            continue            # generated before the cancel took effect
                        self.tokens_seen += 1
                        if self.first_token_at is None:
                            self.first_token_at = time.perf_counter()
                        text = self.matcher.feed(self.detok.push(payload))
                        if self.matcher.stopped:
                            self.state.engine.cancel(self.job)
                        batch.append((payload, text))
                    elif kind == "done":
                        tail = self._finish(payload)
                        if tail:
                            batch.append((None, tail))
                        if batch:
                            yield batch
                        return
                    elif kind == "disconnect":
                        raise ClientGone()
                    elif kind == "error":
                        if isinstance(payload, RequestError):
                            raise bad_request(str(payload), payload.param)
                        raise unavailable(str(payload), "worker_failed")
                if batch:
                    yield batch
        finally:
            watcher.cancel()
            if self.outcome is None:
                self.state.engine.cancel(self.job)

    async def text(self) -> tuple[list, str]:
        """Run to the end: (token ids, released text)."""
        tokens, parts = [], []
        async for batch in self.batches():
            for token_id, text in batch:
                if token_id is not None:
                    tokens.append(token_id)
                parts.append(text)
        return tokens, "".join(parts)

    def _finish(self, result: GenerationResult) -> str:
        tail = ""
        if not self.matcher.stopped:
            tail = self.matcher.feed(self.detok.flush())
            tail += self.matcher.flush()
        if self.matcher.stopped:
            finish, completion = "stop", self.tokens_seen
        else:
            finish, completion = result.finish_reason, result.completion_tokens
            if finish not in ("stop", "length"):
                finish = "stop"
        if self.first_token_at is None and completion:
            self.first_token_at = time.perf_counter()
        ttft = None if self.first_token_at is None else (self.first_token_at - self.started) * 1000
        self.outcome = Outcome(result, finish, completion, ttft)
        if ttft is not None:
            self.state.metrics.on_first_token(ttft / 1000)
        return tail

    async def _watch_disconnect(self) -> None:
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.state.engine.cancel(self.job)
                self.state.metrics.on_disconnect()
                self._mailbox.put_local(("disconnect", None))
                return
