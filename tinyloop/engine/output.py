"""Collecting generated tokens: stop ids, max_tokens, callbacks, finish reason.

Shared by every decoding mode, so a stop inside a speculative round ends the output
exactly where plain decoding would.
"""
from __future__ import annotations

import time

FINISH_STOP = "stop"           # an end-of-sequence or stop token was generated
FINISH_LENGTH = "length"       # max_tokens reached
FINISH_CANCELLED = "cancelled"  # the caller's cancel flag was set


class TokenSink:
    def __init__(self, max_tokens: int, stop_ids: frozenset, sampler, on_token, start: float):
        self.max_tokens = max_tokens
        self.stop_ids = stop_ids
        self.sampler = sampler
        self.on_token = on_token
        self.start = start
        self.tokens: list[int] = []       # emitted ids, without the stop token
        self.completion_tokens = 0        # every sampled id, the stop token included
        self.finish_reason: str | None = None
        self.stop_token_id: int | None = None
        self.first_token_s: float | None = None

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.tokens)

    def push(self, token: int) -> bool:
        """Take one sampled token; False once generation must end."""
        self.completion_tokens += 1
        if self.first_token_s is None:
            self.first_token_s = time.perf_counter() - self.start
        if token in self.stop_ids:
            self.finish_reason, self.stop_token_id = FINISH_STOP, token
            return False
        self.tokens.append(token)
        self.sampler.observe(token)
        if self.on_token is not None:
            self.on_token(token)
        if len(self.tokens) >= self.max_tokens:
            self.finish_reason = FINISH_LENGTH
            return False
        return True

    def cancel(self) -> None:
        self.finish_reason = FINISH_CANCELLED
