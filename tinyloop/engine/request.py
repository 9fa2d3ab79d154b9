"""The one request type, from the HTTP layer's validation to the engine, and its result."""
from __future__ import annotations

from dataclasses import dataclass, field

from tinyloop.engine.sampling import SamplingParams
from tinyloop.engine.speculative.params import SpeculativeParams
from tinyloop.errors import RequestError

MODES = ("generate", "speculative", "tree_speculative")


@dataclass
class GenerationRequest:
    prompt_ids: list
    max_tokens: int = 128
    loops: int | str | None = None            # None: the model's default_loops; "auto": adaptive depth
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: tuple = ()                # in addition to the model's eos ids
    stop_strings: tuple = ()                  # matched on the decoded text (needs the tokenizer)
    ignore_eos: bool = False
    cache_window: int = 0                     # > 0: attend to the last cache_window positions only
    mode: str = "generate"                    # generate | speculative | tree_speculative
    speculative: SpeculativeParams | None = None   # draft/verify settings of the speculative modes
    exit_threshold: float | None = None       # loops "auto": the exit criterion's threshold (None: the model's)
    grammar: object | None = None             # tinyloop.grammar.compile.Grammar: output constrained to it
    top_logprobs: int | None = None           # None: no logprobs; else alternatives per token (0..20)


@dataclass
class GenerationResult:
    tokens: list                     # generated ids, without a stop/eos token
    finish_reason: str               # stop | length | cancelled | shutdown
    prompt_tokens: int
    completion_tokens: int           # every sampled token, a stop/eos token included
    loops: int
    wall_s: float                    # request start to result
    prefill_s: float
    time_to_first_token_s: float | None
    stop_token_id: int | None = None
    mode: str = "generate"
    speculative: object | None = None   # SpeculativeStats for the speculative modes
    loops_used: list | None = None      # loops "auto": the depth each generated token ran at
    text: str | None = None             # the released text (with a tokenizer): stop strings cut
    text_tail: str = ""                 # released only at the end (held back for stop strings)
    logprobs: list | None = None        # TokenLogprobs per token of `tokens`, when asked for
    queue_s: float = 0.0                # submitted to the engine -> started (waiting for a running place)
    cached_tokens: int = 0              # prompt tokens whose KV came from the prefix cache

    @property
    def tokens_per_second(self) -> float:
        return self.completion_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        decode_s = self.wall_s - self.prefill_s
        steps = max(self.completion_tokens - 1, 0)
        return steps / decode_s if decode_s > 0 and steps else 0.0


def check_request(model, request: GenerationRequest) -> int:
    """Validate against the model; return the loop count the output is computed at."""
    c = model.config
    if request.mode not in MODES:
        raise RequestError(f"mode must be one of {', '.join(MODES)}, got {request.mode!r}", "mode")
    if request.loops == "auto":
        if request.mode != "generate":
            raise RequestError("loops \"auto\" (adaptive depth) applies to mode generate; the speculative "
                               "modes verify at verify_loops", "loops")
        loops = c.default_loops
        check_exit_threshold(c, request.exit_threshold)
    elif request.exit_threshold is not None:
        raise RequestError("exit_threshold applies to loops \"auto\" only", "exit_threshold")
    elif request.mode == "generate":
        loops = c.check_loops(c.default_loops if request.loops is None else request.loops)
    else:
        if request.speculative is None:
            raise RequestError(f"mode {request.mode} needs speculative parameters", "mode")
        request.speculative.check(c)
        loops = request.speculative.verify_loops
    if not request.prompt_ids:
        raise RequestError("prompt must contain at least one token", "prompt")
    check_ids(request.prompt_ids, c.vocab_size, "prompt")
    max_tokens = request.max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise RequestError(f"max_tokens must be an integer >= 1, got {max_tokens!r}", "max_tokens")
    n_prompt = len(request.prompt_ids)
    if n_prompt + max_tokens > c.max_seq_len:
        raise RequestError(
            f"prompt ({n_prompt} tokens) + max_tokens ({max_tokens}) = {n_prompt + max_tokens} exceeds "
            f"the model's context of {c.max_seq_len} tokens", "max_tokens")
    check_ids(request.stop_token_ids, c.vocab_size, "stop")
    window = request.cache_window
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise RequestError(f"cache_window must be an integer >= 0 (0 = full cache), got {window!r}",
                           "cache_window")
    return loops


def check_exit_threshold(config, threshold) -> None:
    """A gate's threshold is a cumulative probability in [0, 1]; a KL threshold any number >= 0."""
    if threshold is None:
        return
    high = 1.0 if config.exit_gate else float("inf")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0.0 <= threshold <= high \
            or threshold != threshold:
        kind = "a cumulative exit probability in [0, 1] (this model has an exit gate)" if config.exit_gate \
            else "a KL divergence >= 0 (this model has no exit gate)"
        raise RequestError(f"exit_threshold must be {kind}, got {threshold!r}", "exit_threshold")


def check_ids(ids, vocab_size: int, param: str) -> None:
    for token_id in ids:
        if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < vocab_size:
            raise RequestError(f"{param} token id {token_id!r} is outside the vocabulary [0, {vocab_size})", param)


def stop_ids(model, request: GenerationRequest) -> frozenset:
    eos = () if request.ignore_eos else model.config.eos_token_ids
    return frozenset(eos) | frozenset(request.stop_token_ids)
