"""The prompt's prefill (shared by every mode) and plain decoding, one token per step.

Decoders are generators of forwards: each yields a Pass (model/batch.py), the rows it needs
computed next, and reads the results off it when it is resumed. The engine runs the passes
of every running sequence together, one batched forward per step; `run_alone` runs one
decoder's passes one at a time (the command line, tools, tests).
"""
from __future__ import annotations

import numpy as np

from tinyloop.engine.sampling import next_tokens_with_logprobs
from tinyloop.kv.prefix import slot_keys
from tinyloop.limits import DEFAULT_PREFILL_CHUNK
from tinyloop.model.batch import Pass, run_passes


def prefill_chunks(start: int, stop: int, chunk: int) -> list:
    """[start, stop) cut at the multiples of `chunk`: chunk boundaries are absolute positions,
    so where a prompt is cut depends on the prompt alone (and its window), never on what runs
    beside it or on how much of it a prefix cache held."""
    bounds = [start] + list(range((start // chunk + 1) * chunk, stop, chunk)) + [stop]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def prefill_passes(model, prompt: list, cache, loops: int, chunk: int = DEFAULT_PREFILL_CHUNK,
                   draft_loops: int | None = None, draft_coda: int | None = None, start: int = 0):
    """Generator: the prompt from position `start` (what the cache does not hold yet) through
    the bulk path at `loops`, one Pass per chunk (at most what the cache can take in one
    forward: a ring buffer cannot take a whole long prompt). With draft_loops, each chunk
    also fills the draft coda's rows (slots from draft_coda) from its state after
    draft_loops iterations, which the verifier's own iterations then continue: the
    verify-side rows are exactly those of a plain prefill. Returns the last position's
    logits (1, V) on the backend."""
    step = max(1, min(chunk, cache.max_rows_per_forward))
    side = None if draft_loops is None else (draft_loops, draft_coda)
    pieces = prefill_chunks(start, len(prompt), step)
    last = None
    for index, (a, b) in enumerate(pieces):
        last = Pass(cache, np.arange(a, b), a, loops, tokens=prompt[a:b], exact=False, side=side,
                    coda=model.coda_base(loops), head="last" if index == len(pieces) - 1 else None)
        yield last
    cache.length = len(prompt)
    return last.logits


class CachedPrompt:
    """A decoder's prompt and the prefix cache (kv/prefix.py): the rows it adopted when its
    cache was made (its prefill starts after them), and the blocks it offers back."""

    def __init__(self, pool, cache, prompt: list, slot_keys: list):
        self.prefix = pool.prefix if pool is not None else None
        self.cache, self.prompt, self.slot_keys = cache, prompt, slot_keys
        self.rows = self.prefix.adopt(cache, prompt, slot_keys) if self.prefix is not None else 0

    def publish(self, generated: list | None = None) -> None:
        """The prompt's full blocks, and with `generated` (the tokens the cache holds after the
        prompt) every committed full block of prompt and output."""
        if self.prefix is None:
            return
        tokens = self.prompt + list(generated or ())
        self.prefix.publish(self.cache, tokens, min(self.cache.length, len(tokens)), self.slot_keys)


def run_alone(model, passes):
    """Drive a generator of passes on this thread, each pass run by itself -> its return value."""
    try:
        p = next(passes)
        while True:
            run_passes(model, [p])
            p = passes.send(None)
    except StopIteration as stop:
        return stop.value


def prefill(model, prompt: list, cache, loops: int, draft_loops: int | None = None, draft_coda: int | None = None,
            chunk: int = DEFAULT_PREFILL_CHUNK):
    """The prompt's prefill on this thread -> last logits (1, V) on the backend (prefill_passes)."""
    return run_alone(model, prefill_passes(model, prompt, cache, loops, chunk, draft_loops, draft_coda))


class PlainDecoder:
    """generate(loops): the prompt, then one exact forward per token."""

    def __init__(self, model, request, loops: int, sampler, sink, pool=None, chunk: int = DEFAULT_PREFILL_CHUNK):
        self.model, self.loops, self.sampler, self.sink = model, loops, sampler, sink
        self.prompt = list(request.prompt_ids)
        self.chunk = chunk
        self.prefilled = None                   # called once the prompt is in the cache
        self.cache = model.new_cache(len(self.prompt) + request.max_tokens, loops, window=request.cache_window,
                                     pool=pool)
        self.cached = CachedPrompt(pool, self.cache, self.prompt, slot_keys(model.config, loops))

    @staticmethod
    def capacity(model, request) -> tuple[int, int]:
        """(cache rows, extra slots) a request needs."""
        return len(request.prompt_ids) + request.max_tokens, 0

    def publish(self) -> None:
        """Every committed full block to the prefix cache (at the end)."""
        self.cached.publish(self.sink.tokens)

    def passes(self):
        """Generator of the forwards this request needs, to its end."""
        model, backend = self.model, self.model.backend
        logits = yield from prefill_passes(model, self.prompt, self.cache, self.loops, self.chunk,
                                           start=self.cached.rows)
        self.cached.publish()
        if self.prefilled is not None:
            self.prefilled()
        self.sink.push(*next_tokens_with_logprobs(self.sampler, backend, logits)[0])
        while self.sink.finish_reason is None:
            position = self.cache.length
            step = Pass(self.cache, np.array([position]), position, self.loops, tokens=[self.sink.tokens[-1]],
                        coda=model.coda_base(self.loops), head="all")
            yield step
            self.cache.length = position + 1
            self.sink.push(*next_tokens_with_logprobs(self.sampler, backend, step.logits)[0])
