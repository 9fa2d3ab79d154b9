"""Plain generation: prefill the prompt, then decode one token per step.

The engine side knows token ids only; text, templates and stop strings live elsewhere.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .errors import RequestError
from .model import LoopedTransformer
from .sampling import Sampler, SamplingParams

FINISH_STOP = "stop"           # an end-of-sequence or stop token was generated
FINISH_LENGTH = "length"       # max_tokens reached
FINISH_CANCELLED = "cancelled"  # the caller's cancel flag was set


@dataclass
class GenerationRequest:
    prompt_ids: list
    max_tokens: int = 128
    loops: int | None = None                  # None: the model's default_loops
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: tuple = ()                # in addition to the model's eos ids
    ignore_eos: bool = False


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

    @property
    def tokens_per_second(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        decode_s = self.wall_s - self.prefill_s
        steps = max(self.completion_tokens - 1, 0)
        return steps / decode_s if decode_s > 0 and steps else 0.0


def check_request(model: LoopedTransformer, request: GenerationRequest) -> int:
    """Validate against the model; return the loop count to use."""
    c = model.config
    loops = c.default_loops if request.loops is None else request.loops
    c.check_loops(loops)
    if not request.prompt_ids:
        raise RequestError("prompt must contain at least one token", "prompt")
    for token_id in request.prompt_ids:
        if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < c.vocab_size:
            raise RequestError(f"prompt token id {token_id!r} is outside the vocabulary [0, {c.vocab_size})",
                               "prompt")
    max_tokens = request.max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise RequestError(f"max_tokens must be an integer >= 1, got {max_tokens!r}", "max_tokens")
    n_prompt = len(request.prompt_ids)
    if n_prompt + max_tokens > c.max_seq_len:
        raise RequestError(
            f"prompt ({n_prompt} tokens) + max_tokens ({max_tokens}) = {n_prompt + max_tokens} exceeds "
            f"the model's context of {c.max_seq_len} tokens", "max_tokens")
    for token_id in request.stop_token_ids:
        if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < c.vocab_size:
            raise RequestError(f"stop token id {token_id!r} is outside the vocabulary", "stop")
    return loops


def stop_ids(model: LoopedTransformer, request: GenerationRequest) -> frozenset:
    eos = () if request.ignore_eos else model.config.eos_token_ids
    return frozenset(eos) | frozenset(request.stop_token_ids)


def generate(model: LoopedTransformer, request: GenerationRequest, on_token=None,
             cancel=None) -> GenerationResult:
    """Run one request to completion.

    on_token(token_id) is called for each generated token (not the stop token).
    cancel: an object with is_set() (threading.Event) or a callable returning bool;
    it is checked before every step, so cancellation takes effect within one step.
    """
    start = time.perf_counter()
    loops = check_request(model, request)
    is_cancelled = _cancel_check(cancel)
    prompt = list(request.prompt_ids)
    n_prompt = len(prompt)
    stops = stop_ids(model, request)
    sampler = Sampler(request.sampling, model.config.vocab_size, prompt)
    cache = model.new_cache(n_prompt + request.max_tokens, loops)
    tokens: list[int] = []
    finish, stop_token, first_token_at, completion = FINISH_LENGTH, None, None, 0

    prefill_s = 0.0
    if is_cancelled():
        finish = FINISH_CANCELLED
    else:
        logits = model.forward(prompt, range(n_prompt), cache, loops, exact=False, last_only=True)[0]
        cache.length = n_prompt
        prefill_s = time.perf_counter() - start
        while True:
            token = sampler.sample(model.to_host(logits))
            completion += 1
            if first_token_at is None:
                first_token_at = time.perf_counter() - start
            if token in stops:
                finish, stop_token = FINISH_STOP, token
                break
            tokens.append(token)
            sampler.observe(token)
            if on_token is not None:
                on_token(token)
            if len(tokens) >= request.max_tokens:
                break
            if is_cancelled():
                finish = FINISH_CANCELLED
                break
            position = cache.length
            logits = model.forward([token], [position], cache, loops, exact=True)[0]
            cache.length = position + 1

    return GenerationResult(tokens=tokens, finish_reason=finish, prompt_tokens=n_prompt,
                            completion_tokens=completion, loops=loops,
                            wall_s=time.perf_counter() - start, prefill_s=prefill_s,
                            time_to_first_token_s=first_token_at, stop_token_id=stop_token)


def _cancel_check(cancel):
    if cancel is None:
        return lambda: False
    if hasattr(cancel, "is_set"):
        return cancel.is_set
    return cancel
