"""One generation as the event loop sees it: engine job, text, stop strings, disconnects.

The engine thread produces token ids; here they become UTF-8-safe text deltas, pass
the stop-string matcher, and are yielded to a response writer. The client's
`receive()` channel is watched the whole time: a disconnect cancels the job, whether
it is waiting or running.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from tinyloop.engine import EngineFailed, Job, QueueFull
from tinyloop.errors import RequestError
from tinyloop.generate import GenerationRequest, GenerationResult
from tinyloop.sampling import SamplingParams
from tinyloop.speculative import SpeculativeParams
from tinyloop.stopstrings import StopStringMatcher
from tinyloop.tokenizer import StreamingDetokenizer

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
        self._queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        request = GenerationRequest(prepared.prompt_ids, prepared.max_tokens, prepared.loops,
                                    prepared.sampling, prepared.stop_ids)
        self.job = Job(request, prepared.mode, prepared.speculative,
                       on_event=lambda kind, payload: loop.call_soon_threadsafe(
                           self._queue.put_nowait, (kind, payload)))

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

    async def deltas(self):
        """Yield (token_id, released_text) per generated token; sets self.outcome at the end."""
        watcher = asyncio.ensure_future(self._watch_disconnect())
        try:
            while True:
                kind, payload = await self._queue.get()
                if kind == "token":
                    if self.matcher.stopped:
                        continue                # generated before the cancel took effect
                    self.tokens_seen += 1
                    if self.first_token_at is None:
                        self.first_token_at = time.perf_counter()
                    text = self.matcher.feed(self.detok.push(payload))
                    if self.matcher.stopped:
                        self.state.engine.cancel(self.job)
                    yield payload, text
                elif kind == "done":
                    tail = self._finish(payload)
                    if tail:
                        yield None, tail
                    return
                elif kind == "disconnect":
                    raise ClientGone()
                elif kind == "error":
                    if isinstance(payload, RequestError):
                        raise bad_request(str(payload), payload.param)
                    raise unavailable(str(payload), "worker_failed")
        finally:
            watcher.cancel()
            if self.outcome is None:
                self.state.engine.cancel(self.job)

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
                self._queue.put_nowait(("disconnect", None))
                return
