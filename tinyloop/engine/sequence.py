"""One request's decoding state, advanced one step at a time.

A Sequence owns what a generation needs while it runs: the validated request, the
sampler, the token sink (stop ids, stop strings, max_tokens, text), the KV cache and
a decoder: plain, adaptive or speculative, each a generator of the forwards it needs
(model/batch.py's Pass: a prefill chunk, a decode step, a draft level, a verify). The
engine runs every running sequence's next pass in one batched forward per step; its loop
only schedules sequences and steps them. Cancellation, stop handling and result assembly
are here, the same for every mode.
"""
from __future__ import annotations

import time

from tinyloop.engine.adaptive import AdaptiveDecoder
from tinyloop.engine.decode import PlainDecoder
from tinyloop.engine.output import FINISH_CANCELLED, TextStream, TokenSink
from tinyloop.engine.request import (
    GenerationRequest,
    GenerationResult,
    check_request,
    stop_ids,
)
from tinyloop.engine.sampling import Sampler
from tinyloop.engine.speculative.decoder import SpeculativeDecoder
from tinyloop.errors import RequestError
from tinyloop.limits import DEFAULT_PREFILL_CHUNK
from tinyloop.model.batch import run_passes


class Sequence:
    def __init__(self, model, request: GenerationRequest, tokenizer=None, pool=None, on_token=None,
                 on_logprobs=None, prefill_chunk: int = DEFAULT_PREFILL_CHUNK, checked_loops: int | None = None):
        """on_token(token_id, text delta or None) is called for each generated token (not
        a stop token). Stop strings and text need the tokenizer; pool: the engine's KV pool,
        in which the cache reserves its blocks now (None: a pool of its own). checked_loops:
        the loop count check_request gave when the engine took the request (it and the pool
        check are not done again)."""
        self.start = time.perf_counter()
        self.model, self.request = model, request
        self.loops = check_request(model, request) if checked_loops is None else checked_loops
        if request.stop_strings and tokenizer is None:
            raise RequestError("stop strings need the model's tokenizer", "stop")
        prompt = list(request.prompt_ids)
        constraint = request.grammar.start() if request.grammar is not None else None
        self.sampler = Sampler(request.sampling, model.config.vocab_size, prompt, constraint, request.top_logprobs)
        text = TextStream(tokenizer, request.stop_strings) if tokenizer is not None else None
        self.sink = TokenSink(request.max_tokens, stop_ids(model, request), self.sampler, on_token, self.start, text,
                              on_logprobs)
        if pool is not None and checked_loops is None:
            self.check_cache(model, request, self.loops, pool)
        self.decoder = self.decoder_for(request)(model, request, self.loops, self.sampler, self.sink, pool,
                                                 prefill_chunk)
        self.decoder.prefilled = self._prefilled
        self.prefill_s = 0.0
        self.prompt_done = False               # the prompt is in the cache
        self.queue_s = 0.0                     # how long the request waited for the engine (set by it)
        self._passes = self.decoder.passes()
        self.pending = None                    # the Pass this sequence needs run next (None: none yet, or done)
        self._started = False

    @staticmethod
    def decoder_for(request: GenerationRequest):
        if request.mode != "generate":
            return SpeculativeDecoder
        return AdaptiveDecoder if request.loops == "auto" else PlainDecoder

    @classmethod
    def check_cache(cls, model, request: GenerationRequest, loops: int, pool) -> None:
        """RequestError if the request's cache (its decoder's rows and slots) can never fit the pool."""
        capacity, extra = cls.decoder_for(request).capacity(model, request)
        pool.check(model, capacity, loops, extra, request.cache_window)

    @classmethod
    def cache_blocks(cls, model, request: GenerationRequest, loops: int) -> int:
        """Pool blocks the request's cache reserves when its sequence is made."""
        capacity, extra = cls.decoder_for(request).capacity(model, request)
        return model.cache_blocks(capacity, loops, extra, request.cache_window)

    @property
    def finished(self) -> bool:
        return self.sink.finish_reason is not None

    def _prefilled(self) -> None:
        self.prefill_s = time.perf_counter() - self.start
        self.prompt_done = True

    def next_pass(self):
        """The Pass this sequence needs run next (made on the first call), or None once it has
        none left. The engine runs it beside other sequences' passes, then calls advance()."""
        if not self._started:
            self._started = True
            self.advance()
        return self.pending

    def advance(self) -> None:
        """The pending pass has run: the decoder takes its results (tokens reach the sink and
        its callbacks) and says which pass comes next."""
        try:
            self.pending = self._passes.send(None) if self.pending is not None else next(self._passes)
        except StopIteration:
            self.pending = None

    def step(self) -> None:
        """On this thread, alone: run the next pass (the prefill's chunks first, then a decode
        step or a part of a speculative round)."""
        if self.finished:
            return
        step = self.next_pass()
        if step is None:
            return
        run_passes(self.model, [step])
        self.advance()

    def release(self) -> None:
        """Offer the cache's committed blocks to the prefix cache, then give every block back to
        the pool (once the sequence has ended; idempotent)."""
        if self.decoder.cache.blocks_held:
            self.decoder.publish()
        self.decoder.cache.release()

    def end(self, reason: str = FINISH_CANCELLED) -> None:
        """Stop before the natural end (cancelled, shutdown); takes effect before the next step."""
        self.sink.end(reason)

    def result(self) -> GenerationResult:
        sink = self.sink
        tail = sink.text.finish() if sink.text is not None else ""
        return GenerationResult(
            tokens=sink.tokens, finish_reason=sink.finish_reason, prompt_tokens=len(self.request.prompt_ids),
            completion_tokens=sink.completion_tokens, loops=self.loops,
            wall_s=time.perf_counter() - self.start, prefill_s=self.prefill_s,
            time_to_first_token_s=sink.first_token_s, stop_token_id=sink.stop_token_id, mode=self.request.mode,
            speculative=getattr(self.decoder, "stats", None),
            loops_used=getattr(self.decoder, "loops_used", None),
            text=sink.text.text if sink.text is not None else None, text_tail=tail,
            logprobs=sink.logprobs if self.request.top_logprobs is not None else None, queue_s=self.queue_s,
            cached_tokens=self.decoder.cached.rows)


def run(sequence: Sequence, cancel=None) -> GenerationResult:
    """Step a sequence to its end on this thread; cancel (an Event or a callable) is
    checked before every step, so it takes effect within one step."""
    is_cancelled = cancel_check(cancel)
    try:
        while not sequence.finished:
            if is_cancelled():
                sequence.end(FINISH_CANCELLED)
                break
            sequence.step()
        return sequence.result()
    finally:
        sequence.release()


def cancel_check(cancel):
    """cancel: None, an object with is_set() (threading.Event), or a callable -> bool."""
    if cancel is None:
        return lambda: False
    if hasattr(cancel, "is_set"):
        return cancel.is_set
    return cancel
