"""Validated request values -> the engine's GenerationRequest (prompt ids, limits, sampling)."""
from __future__ import annotations

from tinyloop.engine.request import GenerationRequest
from tinyloop.engine.sampling import SamplingParams
from tinyloop.engine.speculative import SpeculativeParams
from tinyloop.errors import RequestError

from .errors import bad_request

DEFAULT_MAX_TOKENS = 128
# A thinking model's default budget: the answer's 128 tokens plus room to think first.
THINKING_DEFAULT_MAX_TOKENS = DEFAULT_MAX_TOKENS + 1024


def _seed(value):
    return None if value is None else value % (2 ** 64)


def fit_max_tokens(state, n_prompt: int, requested: int | None, default: int = DEFAULT_MAX_TOKENS) -> int:
    """The context rule: an explicit max_tokens must fit; an omitted one is lowered."""
    context = state.loaded.config.max_seq_len
    room = context - n_prompt
    if room <= 0:
        raise bad_request(f"the prompt has {n_prompt} tokens; the model's context is {context} tokens, "
                          "which leaves no room to generate", "messages", "context_length_exceeded")
    if requested is None:
        return min(default, room)
    if requested > room:
        raise bad_request(f"prompt ({n_prompt} tokens) + max_tokens ({requested}) = {n_prompt + requested} "
                          f"exceeds the model's context of {context} tokens; at most {room} tokens can be "
                          "generated for this prompt", "max_tokens", "context_length_exceeded")
    return requested


def _engine_errors(build):
    try:
        return build()
    except RequestError as exc:
        raise bad_request(str(exc), exc.param) from None


def _speculative(state, values, mode):
    if mode == "generate":
        return None
    params = SpeculativeParams(values["draft_loops"], values["verify_loops"], values["draft_ahead"],
                               values.get("K_branches") or 1)
    if mode == "speculative" and params.branches != 1:
        raise bad_request("K_branches applies to mode tree_speculative only", "K_branches")
    _engine_errors(lambda: params.check(state.loaded.config))
    return params


def _loops(state, values):
    loops = values.get("loops")
    if loops is not None and loops != "auto":
        _engine_errors(lambda: state.loaded.config.check_loops(loops))
    return loops


def prepare_openai(state, values, prompt_ids, stop_strings, stop_ids, extended: bool, grammar=None,
                   top_logprobs: int | None = None, logit_bias: tuple = (), thinking: bool = False
                   ) -> GenerationRequest:
    if values.get("max_tokens") is not None and values.get("max_completion_tokens") is not None \
            and values["max_tokens"] != values["max_completion_tokens"]:
        raise bad_request("max_tokens and max_completion_tokens disagree; send one of them",
                          "max_completion_tokens")
    requested = values.get("max_tokens") or values.get("max_completion_tokens")
    mode = values.get("mode", "generate") if extended else "generate"
    sampling = _engine_errors(lambda: SamplingParams(
        temperature=float(values["temperature"]), top_k=values["top_k"], top_p=float(values["top_p"]),
        repetition_penalty=float(values.get("repetition_penalty", 1.0)),
        presence_penalty=float(values["presence_penalty"]), frequency_penalty=float(values["frequency_penalty"]),
        seed=_seed(values["seed"]), min_p=float(values.get("min_p") or 0.0), logit_bias=logit_bias))
    speculative = _speculative(state, values, mode)
    default = THINKING_DEFAULT_MAX_TOKENS if thinking else DEFAULT_MAX_TOKENS
    return GenerationRequest(prompt_ids, fit_max_tokens(state, len(prompt_ids), requested, default),
                             _loops(state, values), sampling, tuple(stop_ids), tuple(stop_strings),
                             cache_window=values.get("cache_window") or 0, mode=mode, speculative=speculative,
                             exit_threshold=values.get("exit_threshold"), grammar=grammar, top_logprobs=top_logprobs)


def prompt_ids_of(state, prompt) -> list:
    """A validated ("text", str) or ("ids", [int]) prompt -> token ids (BOS added to text)."""
    kind, value = prompt
    if kind == "text" and not value:
        raise bad_request("prompt must not be empty", "prompt")
    if kind == "text":
        prompt_ids = state.loaded.encode_prompt(value)
    else:
        prompt_ids = _engine_errors(lambda: state.loaded.tokenizer.check_ids(value, "prompt"))
    if not prompt_ids:
        raise bad_request("prompt must not be empty", "prompt")
    return prompt_ids


def prepare_native(state, values, mode: str) -> GenerationRequest:
    tokenizer = state.loaded.tokenizer
    prompt_ids = prompt_ids_of(state, values["prompt"])
    stop_strings, stop_ids = [], []
    if values["stop"] is not None:
        stop_kind, items = values["stop"]
        if stop_kind == "ids":
            stop_ids = _engine_errors(lambda: tokenizer.check_ids(items, "stop"))
        else:
            stop_strings = items
    sampling = _engine_errors(lambda: SamplingParams(
        temperature=float(values["temperature"]), top_k=values["top_k"], top_p=float(values["top_p"]),
        repetition_penalty=float(values["repetition_penalty"]), seed=_seed(values["sample_seed"])))
    speculative = _speculative(state, values, mode)
    max_tokens = fit_max_tokens(state, len(prompt_ids), values["max_tokens"])
    return GenerationRequest(prompt_ids, max_tokens, _loops(state, values), sampling, tuple(stop_ids),
                             tuple(stop_strings), cache_window=values["cache_window"], mode=mode,
                             speculative=speculative, exit_threshold=values.get("exit_threshold"))
