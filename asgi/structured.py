"""What the agent fields make of a chat or completion request, and of its output.

In: response_format and tools/tool_choice/parallel_tool_calls -> one llguidance grammar
(the engine masks every token with it); logprobs/top_logprobs -> how many alternatives
the engine reports; logit_bias/min_p -> sampling.
Out: generated text -> tool calls (validated against their schemas once more, with the
independent `jsonschema` validator, before any is returned); TokenLogprobs -> OpenAI's
logprobs shapes.
"""
from __future__ import annotations

import uuid

import orjson

from tinyloop.errors import RequestError
from tinyloop.grammar.compile import (
    Grammar,
    json_in_lark,
    json_object_grammar,
    json_schema_grammar,
    lark_grammar,
    schema_lark,
    with_thinking,
)
from tinyloop.grammar.schema_check import check_schema, closed_objects
from tinyloop.text import toolformat

from .errors import ApiError, bad_request


def _engine_errors(build):
    try:
        return build()
    except RequestError as exc:
        raise bad_request(str(exc), exc.param) from None


# ------------------------------------------------------------------------------ in
def active_tools(values) -> tuple[list, object]:
    """(tools the prompt declares, tool_choice) after checking the choice against them."""
    tools = values.get("tools") or []
    choice = values.get("tool_choice")
    if choice is None:
        choice = "auto" if tools else "none"
    if choice != "none" and not tools:
        raise bad_request("'tool_choice' needs 'tools'", "tool_choice")
    if isinstance(choice, dict) and choice["function"] not in {t["function"]["name"] for t in tools}:
        raise bad_request(f"'tool_choice' names function {choice['function']!r}, which 'tools' does not declare",
                          "tool_choice")
    if tools and values.get("response_format") and values["response_format"]["type"] != "text" \
            and choice != "none":
        raise bad_request("'response_format' and tool calls cannot constrain the same reply; send tool_choice "
                          "none or drop response_format", "response_format")
    for index, tool in enumerate(tools):
        _engine_errors(lambda: check_schema(tool["function"]["parameters"], f"tools[{index}].function.parameters"))
    return (tools if choice != "none" else []), choice


def grammar_of(state, values, tools, choice, chat: bool = True, think: bool = True) -> Grammar | None:
    """The reply's grammar, or None. A chat reply from a thinking template may think first,
    unless think is False (the prompt already closed the section: ChatTemplate.render)."""
    tokenizer = state.loaded.tokenizer
    thinking = state.template.thinking if chat and think else None
    response_format = values.get("response_format") or {"type": "text"}
    if tools:
        text, param = _tools_lark(tools, choice, values.get("parallel_tool_calls", True)), "tools"
    elif response_format["type"] == "json_object":
        text, param = (json_object_grammar() if thinking is None else f"start: {json_in_lark({'type': 'object'})}\n",
                       "response_format")
    elif response_format["type"] == "json_schema":
        build = json_schema_grammar if thinking is None else schema_lark
        text, param = _engine_errors(lambda: build(response_format["schema"], "response_format")), "response_format"
    else:
        return None
    # The grammar ends the reply with one of these; the engine stops on each of them.
    eos = tuple(state.loaded.config.eos_token_ids) + (state.template.end_of_turn_ids(tokenizer) if chat else ())
    if not eos:
        raise bad_request("this model has no end-of-sequence token, which constrained output (tools, "
                          "response_format) needs to end a reply", param)
    if thinking is not None:
        text = lark_grammar(with_thinking(text, thinking))
    elif tools:
        text = lark_grammar(text)
    return _engine_errors(lambda: Grammar(text, tokenizer, eos, param))


def _tools_lark(tools, choice, parallel: bool) -> str:
    """The reply's grammar: calls only (required, a named function); or (auto) text
    without the call tag, or calls, or text then a newline then calls. A call opens a
    line. parallel false: exactly one call."""
    names = [choice["function"]] if isinstance(choice, dict) else [t["function"]["name"] for t in tools]
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    alternatives = [{"type": "object", "properties": {"name": {"const": name},
                                                      "arguments": closed_objects(by_name[name])},
                     "required": ["name", "arguments"], "additionalProperties": False} for name in names]
    call_schema = alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}
    open_tag, close_tag = toolformat.OPEN, toolformat.CLOSE
    more = f'("\\n{open_tag}\\n" arguments "\\n{close_tag}")*' if parallel else '""'
    start = f'TEXT | "{open_tag}\\n" calls | lead calls' if choice == "auto" else f'"{open_tag}\\n" calls'
    return (f"start: {start}\n"
            f'calls: arguments "\\n{close_tag}" {more}\n'
            f"arguments: {json_in_lark(call_schema)}\n"
            # text that never spells the tag; text (not opening with "<") up to the first call line
            f"TEXT: /[\\s\\S]+/ & ~/[\\s\\S]*{open_tag}[\\s\\S]*/\n"
            f"lead[lazy]: /[^<][\\s\\S]*\\n{open_tag}\\n/\n")


def top_logprobs_of(values, chat: bool) -> int | None:
    if chat:
        if values.get("top_logprobs") is not None and not values.get("logprobs"):
            raise bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs")
        return (values.get("top_logprobs") or 0) if values.get("logprobs") else None
    return values.get("logprobs")


def check_logit_bias(state, bias) -> tuple:
    vocab = state.loaded.config.vocab_size
    for token_id, _ in bias or ():
        if token_id >= vocab:
            raise bad_request(f"'logit_bias' token id {token_id} is outside the vocabulary [0, {vocab})",
                              "logit_bias")
    return tuple(bias or ())


# ------------------------------------------------------------------------------ out
def tool_calls_of(text: str, tools) -> list[dict]:
    """Calls text (<tool_call>...</tool_call>, one per line) -> its whole calls in OpenAI's
    shape (a partial last call, cut by max_tokens, is dropped). Every call is validated
    before any is returned."""
    calls, _ = toolformat.parse_calls(text)
    import jsonschema

    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    out = []
    for call in calls:
        try:
            jsonschema.validate(call["arguments"], schemas[call["name"]])
        except (KeyError, jsonschema.ValidationError) as exc:
            raise ApiError(500, f"a generated tool call failed validation ({exc.__class__.__name__}); this is a "
                                "server bug, please report it", "server_error", None, "invalid_tool_call") from None
        out.append({"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                    "function": {"name": call["name"], "arguments": orjson.dumps(call["arguments"]).decode()}})
    return out


def _token_entry(tokenizer, token_id: int, logprob: float) -> dict:
    raw = tokenizer.token_bytes[token_id]
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}


def chat_logprobs(tokenizer, entries) -> dict:
    """TokenLogprobs -> a chat choice's logprobs: {content: [{token, logprob, bytes, top_logprobs}]}."""
    content = []
    for entry in entries:
        item = _token_entry(tokenizer, entry.token, entry.logprob)
        item["top_logprobs"] = [_token_entry(tokenizer, t, lp) for t, lp in entry.top]
        content.append(item)
    return {"content": content, "refusal": None}


def completion_logprobs(tokenizer, entries, offset: int = 0) -> dict:
    """TokenLogprobs -> a completion choice's logprobs (the legacy shape)."""
    tokens, logprobs, tops, offsets = [], [], [], []
    for entry in entries:
        text = tokenizer.token_bytes[entry.token].decode("utf-8", errors="replace")
        tokens.append(text)
        logprobs.append(entry.logprob)
        top = {}
        for token_id, lp in entry.top:
            top.setdefault(tokenizer.token_bytes[token_id].decode("utf-8", errors="replace"), lp)
        tops.append(top)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets}
