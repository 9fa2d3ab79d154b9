"""The request fields of every generation route (the API document's tables)."""
from __future__ import annotations

from tinyloop.limits import MAX_BRANCHES, MAX_DRAFT_AHEAD

from .agent_fields import CHAT_ONLY, COMMON, COMPLETION_ONLY
from .chat_messages import chat_messages
from .schema import CUSTOM_KINDS, Field

CUSTOM_KINDS["chat_messages"] = chat_messages

SEED_LOW, SEED_HIGH = -(2 ** 63), 2 ** 64 - 1


def _default_or_none(*defaults):
    return lambda value: value is None or any(value == d and type(value) is type(d) for d in defaults)


# OpenAI fields this server does not implement: accepted only absent, null or at their default.
OPENAI_UNSUPPORTED = {
    "functions": _default_or_none([]),
    "function_call": _default_or_none("none", "auto"),
    "service_tier": _default_or_none("auto", "default"),
    "store": _default_or_none(False),
    "metadata": _default_or_none({}),
    "modalities": lambda v: v is None or v == ["text"],
    "audio": _default_or_none(),
    "prediction": _default_or_none(),
    "reasoning_effort": _default_or_none(),
    "web_search_options": _default_or_none(),
    "verbosity": _default_or_none(),
    "prompt_cache_key": lambda v: v is None or isinstance(v, str),
    "safety_identifier": lambda v: v is None or isinstance(v, str),
}
COMPLETIONS_UNSUPPORTED = {
    "echo": _default_or_none(False),
    "suffix": _default_or_none(""),
    "best_of": _default_or_none(1),
}

EXIT_THRESHOLD_DOC = ("With loops \"auto\": a gated model (Ouro) stops a token once its cumulative exit "
                      "probability reaches this (0-1; higher = deeper); others stop when the KL divergence "
                      "between successive iterations' outputs falls below it. Default: the model's")

SAMPLING_V1 = {
    "model": Field("string", required=True, doc="Echoed into the response"),
    "max_tokens": Field("integer", None, low=1, high=8192,
                        doc="1..8192; default 128, lowered to the room the context leaves"),
    "max_completion_tokens": Field("integer", None, low=1, high=8192, doc="Newer name of max_tokens"),
    "temperature": Field("number", 1.0, low=0.0, high=2.0, doc="0 = greedy"),
    "top_p": Field("number", 1.0, low=0.0, high=1.0, doc="Nucleus sampling mass (no hidden top_k)"),
    "top_k": Field("integer", 0, low=0, high=1000, doc="TinyLoop extension; 0 = off"),
    "n": Field("integer", 1, low=1, high=1, doc="Must be 1"),
    "stop": Field("stop", None, doc="String or up to 16 strings, matched on the decoded text"),
    "stream": Field("boolean", False),
    "stream_options": Field("stream_options", None, doc="{include_usage: bool}"),
    "seed": Field("integer", None, low=SEED_LOW, high=SEED_HIGH, doc="Deterministic sampling"),
    "presence_penalty": Field("number", 0.0, low=-2.0, high=2.0, doc="Additive, by presence (OpenAI)"),
    "frequency_penalty": Field("number", 0.0, low=-2.0, high=2.0, doc="Additive, by count (OpenAI)"),
    "loops": Field("loops", None, doc="TinyLoop extension: loop depth, or \"auto\" (adaptive depth per token)"),
    "user": Field("string", None, doc="Accepted and ignored"),
}
LMSTUDIO_EXTRAS = {
    "mode": Field("string", "generate", choices=("generate", "speculative", "tree_speculative")),
    "draft_loops": Field("integer", 2, low=1, high=32, doc="Draft loop depth (speculative modes)"),
    "verify_loops": Field("integer", 8, low=1, high=64, doc="Verify loop depth (speculative modes)"),
    "draft_ahead": Field("integer", 4, low=1, high=MAX_DRAFT_AHEAD, doc="Draft tokens per round / tree depth"),
    "K_branches": Field("integer", 1, low=1, high=MAX_BRANCHES, doc="Tree branching factor (tree_speculative)"),
    "cache_window": Field("integer", 0, low=0, doc="Attend to the last N positions only, with a bounded "
                                                  "ring-buffer cache (0 = full)"),
    "repetition_penalty": Field("number", 1.0, low=0.5, high=2.0),
    "exit_threshold": Field("number", None, low=0.0, doc=EXIT_THRESHOLD_DOC),
}
ELSEWHERE = {name: "it is a TinyLoop extension accepted on /api/v0/*" for name in LMSTUDIO_EXTRAS}

CHAT = {"messages": Field("chat_messages", required=True, doc="Array of {role, content}; assistant tool_calls, "
                                                           "tool messages with tool_call_id"),
        **SAMPLING_V1, **COMMON, **CHAT_ONLY}
COMPLETION = {"prompt": Field("completion_prompt", required=True, doc="String (or one-element array, or "
                                                                      "token ids)"),
              **SAMPLING_V1, **COMMON, **COMPLETION_ONLY}

NATIVE = {
    "prompt": Field("native_prompt", required=True, doc="Text or token ids"),
    "max_tokens": Field("integer", None, low=1, high=8192, doc="Default 128, lowered to the room left"),
    "loops": Field("loops", None, doc="Default: the model's default_loops; \"auto\": adaptive depth per token"),
    "exit_threshold": Field("number", None, low=0.0, doc=EXIT_THRESHOLD_DOC),
    "temperature": Field("number", 0.0, low=0.0, high=2.0),
    "top_k": Field("integer", 50, low=0, high=1000),
    "top_p": Field("number", 0.9, low=0.0, high=1.0),
    "repetition_penalty": Field("number", 1.0, low=0.5, high=2.0),
    "sample_seed": Field("integer", 0, low=SEED_LOW, high=SEED_HIGH),
    "stream": Field("boolean", False),
    "stop": Field("native_stop", None, doc="String(s) matched on text, or token ids"),
    "cache_window": Field("integer", 0, low=0),
}
NATIVE_SPECULATIVE = {
    **{k: v for k, v in NATIVE.items() if k not in ("loops", "exit_threshold")},
    "draft_loops": Field("integer", 2, low=1, high=32),
    "verify_loops": Field("integer", 8, low=1, high=64),
    "draft_ahead": Field("integer", 4, low=1, high=MAX_DRAFT_AHEAD),
}
NATIVE_TREE = {**NATIVE_SPECULATIVE, "K_branches": Field("integer", 1, low=1, high=MAX_BRANCHES)}
