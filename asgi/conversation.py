"""What the Responses and Messages routes share with chat completions.

Each of those APIs validates its own body into a Conversation: messages in the shape
the chat template renders ({role, content, tool_calls?, tool_call_id?, name?}), tool
declarations in the chat shape ({type: function, function: {name, parameters}}), a
tool choice and an output format. From there on the path is chat completions' own:
the same template render (tools declared in the system turn, counted in the context),
the same llguidance grammar for tool calls and JSON output, the same admission and
engine. A request that turns thinking off (Responses reasoning.effort none, Messages
thinking disabled) has a thinking template's section closed, empty, in its prompt.
Reading back: which of the client's stop sequences ended a reply, and how many
generated tokens were thinking.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tinyloop.engine.request import GenerationRequest
from tinyloop.engine.sampling import SamplingParams
from tinyloop.grammar.schema_check import check_schema
from tinyloop.text.thinking import thinking_tokens

from .errors import ApiError
from .prepare import _engine_errors, fit_max_tokens
from .structured import active_tools, grammar_of


@dataclass
class Conversation:
    messages: list                          # chat-template messages, validated
    tools: list = field(default_factory=list)   # chat-shape function declarations
    tool_choice: object = None              # none | auto | required | {"function": name}; None: auto with tools
    parallel_tool_calls: bool = True
    response_format: dict | None = None     # {"type": text | json_object | json_schema, "schema"?}
    stop: list = field(default_factory=list)    # the client's stop sequences
    think: bool = True                      # False: a thinking template's section is closed, empty, in the prompt


def check_tool_schema(schema, param: str) -> None:
    """A tool's JSON schema against what the grammar supports: a 400 naming `param`
    (the API's own field path, e.g. tools[0].input_schema)."""
    _engine_errors(lambda: check_schema(schema, param))


def render(state, conversation: Conversation) -> tuple[list, list, object]:
    """(prompt ids, the tools the prompt declares, the tool choice). tool_choice none
    leaves the tools out of the prompt, as chat completions does."""
    values = {"tools": conversation.tools, "tool_choice": conversation.tool_choice,
              "response_format": conversation.response_format}
    tools, choice = active_tools(values)
    loaded = state.loaded
    prompt_ids = loaded.with_bos(state.template.render(conversation.messages, loaded.tokenizer, tools,
                                                       conversation.think))
    return prompt_ids, tools, choice


def engine_request(state, conversation: Conversation, max_tokens: int | None, sampling: dict,
                   limit_param: str, prompt_param: str) -> tuple[GenerationRequest, list]:
    """The engine request and the tools its reply may call. max_tokens is an upper bound,
    as both APIs define it: lowered to the room the context leaves (None: all of it); a
    prompt that leaves no room is a 400 naming prompt_param."""
    prompt_ids, tools, choice = render(state, conversation)
    values = {"response_format": conversation.response_format,
              "parallel_tool_calls": conversation.parallel_tool_calls}
    grammar = grammar_of(state, values, tools, choice, think=conversation.think)
    room = state.loaded.config.max_seq_len - len(prompt_ids)
    limit = _renamed(lambda: fit_max_tokens(state, len(prompt_ids), None, room if max_tokens is None else max_tokens),
                     {"messages": prompt_param, "max_tokens": limit_param})
    params = _engine_errors(lambda: SamplingParams(**sampling))
    tokenizer = state.loaded.tokenizer
    stop_strings = tuple(conversation.stop) + tuple(state.template.stop_strings)
    return GenerationRequest(prompt_ids, limit, None, params, tuple(state.template.end_of_turn_ids(tokenizer)),
                             stop_strings, grammar=grammar), tools


def _renamed(build, params: dict):
    """fit_max_tokens names chat completions' fields; say the caller's API's names instead."""
    try:
        return build()
    except ApiError as exc:
        exc.param = params.get(exc.param, exc.param)
        raise


def reasoning_tokens(state, outcome) -> int:
    """How many generated tokens belong to a thinking template's section (0 without one)."""
    tags = state.template.thinking
    if tags is None:
        return 0
    return thinking_tokens(outcome.result.tokens, state.loaded.tokenizer.decode, *tags)


def matched_stop(state, outcome, released: str, stops: list) -> str | None:
    """The client's stop sequence that ended the reply, or None (it ended otherwise). The
    released text stops just before the match; the generated tokens still spell it."""
    result = outcome.result
    if result.finish_reason != "stop" or result.stop_token_id is not None or not stops:
        return None
    rest = state.loaded.tokenizer.decode(result.tokens)[len(released):]
    found = [(rest.find(stop), -len(stop), stop) for stop in stops if stop in rest]
    return min(found)[2] if found else None
