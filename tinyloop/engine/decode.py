"""The prompt's prefill (shared by every mode) and plain decoding, one token per step."""
from __future__ import annotations

from tinyloop.engine.sampling import next_tokens_with_logprobs


def prefill(model, prompt: list, cache, loops: int, draft_loops: int | None = None, draft_coda: int | None = None):
    """The prompt through the fast (GEMM) path at `loops`, in as many pieces as the cache
    allows (a ring buffer cannot take a whole long prompt at once). With draft_loops,
    the same pass also fills the draft coda's rows (slots from draft_coda) from its state
    after draft_loops iterations, which the verifier's own iterations then continue:
    the verify-side rows are exactly those of a plain prefill. -> last logits (1, V) on
    the backend."""
    step = cache.max_rows_per_forward
    for start in range(0, len(prompt), step):
        stop = min(start + step, len(prompt))
        plan = model.contiguous_plan(start, stop - start, cache, exact=False)
        if draft_loops is None:
            trunk = model.trunk(prompt[start:stop], plan, cache, loops)
        else:
            trunk = model.trunk(prompt[start:stop], plan, cache, draft_loops)
            model.coda(trunk.hidden, plan, cache, draft_coda)
            trunk = model.resume(trunk, plan, cache, loops)
        hidden = model.coda(trunk.hidden, plan, cache, model.coda_base(loops))
    cache.length = len(prompt)
    return model.head(hidden[-1:], exact=False)


class PlainDecoder:
    """generate(loops): the prompt, then one exact forward per token."""

    def __init__(self, model, request, loops: int, sampler, sink, alloc=None):
        self.model, self.loops, self.sampler, self.sink = model, loops, sampler, sink
        self.prompt = list(request.prompt_ids)
        self.cache = model.new_cache(len(self.prompt) + request.max_tokens, loops, window=request.cache_window,
                                     alloc=alloc)

    @staticmethod
    def capacity(model, request) -> tuple[int, int]:
        """(cache rows, extra slots) a request needs."""
        return len(request.prompt_ids) + request.max_tokens, 0

    def prefill(self) -> None:
        logits = prefill(self.model, self.prompt, self.cache, self.loops)
        self.sink.push(*next_tokens_with_logprobs(self.sampler, self.model.backend, logits)[0])

    def step(self) -> None:
        position = self.cache.length
        logits = self.model.decode(self.sink.tokens[-1], position, self.cache, self.loops)
        self.cache.length = position + 1
        self.sink.push(*next_tokens_with_logprobs(self.sampler, self.model.backend, logits)[0])
