"""Plain generation: prefill the prompt, then decode one token per step.

The engine side knows token ids only; text, templates and stop strings live elsewhere.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from tinyloop.errors import RequestError
from tinyloop.model.transformer import LoopedTransformer
from tinyloop.engine.output import TokenSink
from tinyloop.engine.sampling import Sampler, SamplingParams


@dataclass
class GenerationRequest:
    prompt_ids: list
    max_tokens: int = 128
    loops: int | None = None                  # None: the model's default_loops
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: tuple = ()                # in addition to the model's eos ids
    ignore_eos: bool = False
    cache_window: int = 0                     # > 0: attend to the last cache_window positions only


@dataclass
class GenerationResult:
    tokens: list                     # generated ids, without the stop/eos token
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int           # every sampled token, the stop/eos token included
    loops: int
    wall_s: float                    # request start to result
    prefill_s: float
    time_to_first_token_s: float | None
    stop_token_id: int | None = None
    mode: str = "generate"
    speculative: object | None = None   # SpeculativeStats for the speculative modes

    @property
    def tokens_per_second(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        decode_s = self.wall_s - self.prefill_s
        steps = max(self.completion_tokens - 1, 0)
        return steps / decode_s if decode_s > 0 and steps else 0.0


def check_request(model: LoopedTransformer, request: GenerationRequest, loops: int | None = None) -> int:
    """Validate against the model; return the loop count to use."""
    c = model.config
    loops = loops if loops is not None else (c.default_loops if request.loops is None else request.loops)
    c.check_loops(loops)
    if not request.prompt_ids:
        raise RequestError("prompt must contain at least one token", "prompt")
    _check_ids(request.prompt_ids, c.vocab_size, "prompt")
    max_tokens = request.max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise RequestError(f"max_tokens must be an integer >= 1, got {max_tokens!r}", "max_tokens")
    n_prompt = len(request.prompt_ids)
    if n_prompt + max_tokens > c.max_seq_len:
        raise RequestError(
            f"prompt ({n_prompt} tokens) + max_tokens ({max_tokens}) = {n_prompt + max_tokens} exceeds "
            f"the model's context of {c.max_seq_len} tokens", "max_tokens")
    _check_ids(request.stop_token_ids, c.vocab_size, "stop")
    window = request.cache_window
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise RequestError(f"cache_window must be an integer >= 0 (0 = full cache), got {window!r}",
                           "cache_window")
    return loops


def _check_ids(ids, vocab_size: int, param: str) -> None:
    for token_id in ids:
        if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < vocab_size:
            raise RequestError(f"{param} token id {token_id!r} is outside the vocabulary [0, {vocab_size})", param)


def check_cache_budget(model: LoopedTransformer, capacity: int, loops: int, window: int,
                       extra_slots: int = 0) -> None:
    """Refuse a request whose KV cache would not fit the configured budget."""
    budget = model.kv_budget_bytes
    if budget is None:
        return
    need = model.cache_bytes(capacity, loops, extra_slots, window)
    if need > budget:
        slots = model.config.n_layer_instances(loops) + extra_slots
        raise RequestError(
            f"this request needs {need / 2**20:.1f} MiB of KV cache ({slots} layer instances, "
            f"{'window ' + str(window) if window else str(capacity) + ' positions'}, {model.kv_mode}); the budget "
            f"is {budget / 2**20:.1f} MiB (TINYLOOP_KV_BUDGET_MB). Lower max_tokens or loops, set cache_window, "
            f"or use a quantized cache mode", "max_tokens")


def prefill(model: LoopedTransformer, prompt, cache, loops: int):
    """The prompt through the fast (GEMM) path, in as many pieces as the cache allows
    (a ring buffer cannot take a whole long prompt at once). -> last logits (V,)."""
    step = cache.max_rows_per_forward
    for start in range(0, len(prompt), step):
        stop = min(start + step, len(prompt))
        logits = model.forward(prompt[start:stop], range(start, stop), cache, loops, exact=False, last_only=True)
    cache.length = len(prompt)
    return logits[0]


def stop_ids(model: LoopedTransformer, request: GenerationRequest) -> frozenset:
    eos = () if request.ignore_eos else model.config.eos_token_ids
    return frozenset(eos) | frozenset(request.stop_token_ids)


def cancel_check(cancel):
    """cancel: None, an object with is_set() (threading.Event), or a callable -> bool."""
    if cancel is None:
        return lambda: False
    if hasattr(cancel, "is_set"):
        return cancel.is_set
    return cancel


def generate(model: LoopedTransformer, request: GenerationRequest, on_token=None,
             cancel=None) -> GenerationResult:
    """Run one request to completion.

    on_token(token_id) is called for each generated token (not the stop token).
    The cancel flag is checked before every step, so it takes effect within one step.
    """
    start = time.perf_counter()
    loops = check_request(model, request)
    is_cancelled = cancel_check(cancel)
    prompt = list(request.prompt_ids)
    n_prompt = len(prompt)
    sampler = Sampler(request.sampling, model.config.vocab_size, prompt)
    sink = TokenSink(request.max_tokens, stop_ids(model, request), sampler, on_token, start)
    capacity = n_prompt + request.max_tokens
    check_cache_budget(model, capacity, loops, request.cache_window)
    cache = model.new_cache(capacity, loops, window=request.cache_window)

    prefill_s = 0.0
    if is_cancelled():
        sink.cancel()
    else:
        logits = prefill(model, prompt, cache, loops)
        prefill_s = time.perf_counter() - start
        while sink.push(sampler.sample(model.to_host(logits))):
            if is_cancelled():
                sink.cancel()
                break
            position = cache.length
            logits = model.forward([sink.tokens[-1]], [position], cache, loops, exact=True)[0]
            cache.length = position + 1

    return GenerationResult(tokens=sink.tokens, finish_reason=sink.finish_reason, prompt_tokens=n_prompt,
                            completion_tokens=sink.completion_tokens, loops=loops,
                            wall_s=time.perf_counter() - start, prefill_s=prefill_s,
                            time_to_first_token_s=sink.first_token_s, stop_token_id=sink.stop_token_id)
