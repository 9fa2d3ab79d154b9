"""Collecting generated tokens: stop ids, stop strings, max_tokens, callbacks, finish reason.

Shared by every decoding mode, so a stop inside a speculative round ends the output
exactly where plain decoding would, and text (with stop strings) is produced the same
way for the HTTP server and the command line.
"""
from __future__ import annotations

import time

from tinyloop.text.stopstrings import StopStringMatcher
from tinyloop.text.tokenizer import StreamingDetokenizer

FINISH_STOP = "stop"            # an end-of-sequence or stop token, or a stop string
FINISH_LENGTH = "length"        # max_tokens reached
FINISH_CANCELLED = "cancelled"  # the caller cancelled (a client that left)
FINISH_SHUTDOWN = "shutdown"    # the engine stopped before the generation ended


class TextStream:
    """Token ids -> UTF-8-safe text deltas, cut before the first stop string."""

    def __init__(self, tokenizer, stop_strings=()):
        self.detok = StreamingDetokenizer(tokenizer)
        self.matcher = StopStringMatcher(stop_strings)
        self.parts: list[str] = []

    @property
    def stopped(self) -> bool:
        return self.matcher.stopped

    def push(self, token_id: int) -> str:
        """Released text for one more token ('' while held back or once stopped)."""
        out = self.matcher.feed(self.detok.push(token_id))
        self.parts.append(out)
        return out

    def finish(self) -> str:
        """The end of generation: what was held back (nothing after a stop string)."""
        if self.stopped:
            return ""
        tail = self.matcher.feed(self.detok.flush())
        tail += self.matcher.flush()
        self.parts.append(tail)
        return tail

    @property
    def text(self) -> str:
        return "".join(self.parts)


class TokenSink:
    def __init__(self, max_tokens: int, stop_ids: frozenset, sampler, on_token, start: float,
                 text: TextStream | None = None, on_logprobs=None):
        self.max_tokens = max_tokens
        self.stop_ids = stop_ids
        self.sampler = sampler
        self.on_token = on_token          # on_token(token_id, text delta or None)
        self.start = start
        self.text = text
        self.on_logprobs = on_logprobs    # on_logprobs(TokenLogprobs), before on_token of the same token
        self.tokens: list[int] = []       # emitted ids, without the stop token
        self.logprobs: list = []          # TokenLogprobs per emitted id, when the request asks for them
        self.completion_tokens = 0        # every sampled id, the stop token included
        self.finish_reason: str | None = None
        self.stop_token_id: int | None = None
        self.first_token_s: float | None = None

    @property
    def remaining(self) -> int:
        return self.max_tokens - len(self.tokens)

    def push(self, token: int, logprobs=None) -> bool:
        """Take one sampled token (with its TokenLogprobs if asked for); False once generation must end."""
        if self.finish_reason is not None:
            return False
        self.completion_tokens += 1
        if self.first_token_s is None:
            self.first_token_s = time.perf_counter() - self.start
        if token in self.stop_ids:
            self.finish_reason, self.stop_token_id = FINISH_STOP, token
            return False
        self.tokens.append(token)
        self.sampler.observe(token)
        if logprobs is not None:
            self.logprobs.append(logprobs)
            if self.on_logprobs is not None:
                self.on_logprobs(logprobs)
        delta = self.text.push(token) if self.text is not None else None
        if self.on_token is not None:
            self.on_token(token, delta)
        if self.text is not None and self.text.stopped:
            self.finish_reason = FINISH_STOP
            return False
        if len(self.tokens) >= self.max_tokens:
            self.finish_reason = FINISH_LENGTH
            return False
        return True

    def end(self, reason: str) -> None:
        """Stop from outside (cancel, shutdown); a finished generation keeps its reason."""
        if self.finish_reason is None:
            self.finish_reason = reason
