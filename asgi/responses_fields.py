"""The request body of POST /v1/responses (OpenAI's Responses API), declared and checked.

`input` is a string or a list of items; the items become the chat template's messages:
- message {role: user | assistant | system | developer (read as system), content: text
  or [input_text | output_text | refusal parts]} (type "message" may be left out);
- function_call {call_id, name, arguments: JSON text of an object}: a call of the
  assistant turn before it (consecutive calls share one turn);
- function_call_output {call_id, output}: the result of an earlier, unanswered call;
- reasoning: accepted and left out of the prompt (an earlier turn's thinking is not
  rendered back, for models whose chat template has a thinking section or not).
Everything else (images, files, item_reference, built-in tools) is a 400 naming it.
"""
from __future__ import annotations

import orjson

from .agent_fields import check_function, tool_array
from .conversation import check_tool_schema
from .errors import bad_request, unprocessable
from .schema import CUSTOM_KINDS, MAX_MESSAGES, Field, describe

ITEM_KEYS = {
    "message": {"type", "role", "content", "id", "status", "phase"},
    "function_call": {"type", "call_id", "name", "arguments", "id", "status"},
    "function_call_output": {"type", "call_id", "output", "id", "status"},
    "reasoning": {"type", "id", "summary", "content", "encrypted_content", "status"},
}
TEXT_PARTS = ("input_text", "output_text", "refusal")
PART_KEYS = {"type", "text", "refusal", "annotations", "logprobs"}
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
EFFORTS = (None, "none", "minimal", "low", "medium", "high", "xhigh", "max")   # the SDK's ReasoningEffort
SUMMARIES = (None, "auto", "concise", "detailed")
MAX_METADATA_KEYS = 16


def _no_extra_keys(at: str, item: dict, allowed: set) -> None:
    extra = sorted(set(item) - allowed)
    if extra:
        raise bad_request(f"'{at}.{extra[0]}' is not supported", f"{at}.{extra[0]}")


def _text_of(at: str, content, part_types=TEXT_PARTS) -> str:
    """A string, or text parts joined; other parts (images, files, audio) are a 400."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise unprocessable(f"'{at}' must be a string or an array of text parts, got {describe(content)}", at)
    texts = []
    for index, part in enumerate(content):
        where = f"{at}[{index}]"
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise unprocessable(f"'{where}' must be an object with a type", where)
        if part["type"] not in part_types:
            raise bad_request(f"'{where}.type' {part['type']!r} is not supported: only text parts "
                              f"({', '.join(part_types)}) are", f"{where}.type")
        _no_extra_keys(where, part, PART_KEYS)
        key = "refusal" if part["type"] == "refusal" else "text"
        if not isinstance(part.get(key), str):
            raise unprocessable(f"'{where}.{key}' must be a string", f"{where}.{key}")
        texts.append(part[key])
    return "".join(texts)


def _string(at: str, item: dict, key: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise unprocessable(f"'{at}.{key}' must be a non-empty string", f"{at}.{key}")
    return value


def _function_call(at: str, item: dict, messages: list, open_calls: dict) -> None:
    call_id, name = _string(at, item, "call_id"), _string(at, item, "name")
    if call_id in open_calls:
        raise bad_request(f"'{at}.call_id' {call_id!r} repeats an unanswered call's id", f"{at}.call_id")
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        raise unprocessable(f"'{at}.arguments' must be a string holding a JSON object", f"{at}.arguments")
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        raise bad_request(f"'{at}.arguments' is not valid JSON", f"{at}.arguments") from None
    if not isinstance(parsed, dict):
        raise bad_request(f"'{at}.arguments' must be a JSON object", f"{at}.arguments")
    open_calls[call_id] = name
    call = {"id": call_id, "function": {"name": name, "arguments": parsed}}
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":     # the same assistant turn: its text, then its calls
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})


def _call_output(at: str, item: dict, open_calls: dict) -> dict:
    call_id = _string(at, item, "call_id")
    if call_id not in open_calls:
        raise bad_request(f"'{at}.call_id' {call_id!r} does not match an earlier function_call that is still "
                          "unanswered", f"{at}.call_id")
    output = _text_of(f"{at}.output", item.get("output"), ("input_text",))
    return {"role": "tool", "content": output, "tool_call_id": call_id, "name": open_calls.pop(call_id)}


def _reasoning(at: str, item: dict) -> None:
    if not isinstance(item.get("summary", []), list):
        raise unprocessable(f"'{at}.summary' must be an array", f"{at}.summary")


def _message(at: str, item: dict) -> dict:
    role = item.get("role")
    if role not in ROLES:
        raise bad_request(f"'{at}.role' must be user, assistant, system or developer; got {role!r}", f"{at}.role")
    if item.get("content") is None:
        raise unprocessable(f"'{at}.content' is required", f"{at}.content")
    return {"role": ROLES[role], "content": _text_of(f"{at}.content", item["content"])}


def responses_input(name, value):
    """string | [items] -> chat-template messages."""
    if isinstance(value, str):
        if not value:
            raise bad_request(f"'{name}' must not be empty", name)
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise unprocessable(f"'{name}' must be a string or an array of input items, got {describe(value)}", name)
    if not value:
        raise bad_request(f"'{name}' must hold at least one item", name)
    if len(value) > MAX_MESSAGES:
        raise bad_request(f"'{name}' may hold at most {MAX_MESSAGES} items", name)
    messages, open_calls = [], {}
    for index, item in enumerate(value):
        at = f"{name}[{index}]"
        if not isinstance(item, dict):
            raise unprocessable(f"'{at}' must be an object (an input item)", at)
        kind = item.get("type", "message")
        if kind not in ITEM_KEYS:
            raise bad_request(f"'{at}.type' {kind!r} is not supported; input items may be message, function_call, "
                              "function_call_output or reasoning (item_reference needs stored responses, which "
                              "this server does not keep)", f"{at}.type")
        _no_extra_keys(at, item, ITEM_KEYS[kind])
        if kind == "message":
            messages.append(_message(at, item))
        elif kind == "function_call":
            _function_call(at, item, messages, open_calls)
        elif kind == "function_call_output":
            messages.append(_call_output(at, item, open_calls))
        else:
            _reasoning(at, item)
    if open_calls:
        call_id = next(iter(open_calls))
        raise bad_request(f"no function_call_output answers the function_call with call_id {call_id!r}; send "
                          "each call's output after it", name)
    if not messages:
        raise bad_request(f"'{name}' must hold at least one message or function call", name)
    return messages


def responses_tools(name, value):
    """[{type: function, name, description?, parameters?, strict?}] -> chat-shape declarations."""
    tools, names = [], set()
    for index, tool in enumerate(tool_array(name, value)):
        at = f"{name}[{index}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise unprocessable(f"'{at}' must be an object {{type: 'function', name, parameters}}", at)
        if tool["type"] != "function":
            raise bad_request(f"'{at}.type' {tool['type']!r} is not supported: only function tools are",
                              f"{at}.type")
        _no_extra_keys(at, tool, {"type", "name", "description", "parameters", "strict"})
        fname = tool.get("name")
        parameters = tool.get("parameters") or {"type": "object", "properties": {}}
        check_function(names, fname, tool.get("description") or "", tool.get("strict") or False, parameters,
                       tuple(f"{at}.{key}" for key in ("name", "description", "strict", "parameters")))
        check_tool_schema(parameters, f"{at}.parameters")
        function = {"name": fname, "parameters": parameters}
        for key in ("description", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        tools.append({"type": "function", "function": function})
    return tools


def responses_tool_choice(name, value):
    """none | auto | required | {type: function, name} -> the chat machinery's choice."""
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise bad_request(f"'{name}' must be none, auto, required or {{type: 'function', name}}; got {value!r}",
                              name)
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str) \
            and set(value) == {"type", "name"}:
        return {"function": value["name"]}
    if isinstance(value, dict) and value.get("type") == "function":
        raise bad_request(f"'{name}' of type function takes exactly one other key, name (a string)", name)
    if isinstance(value, dict) and isinstance(value.get("type"), str):
        raise bad_request(f"'{name}' of type {value['type']!r} is not supported; send none, auto, required or "
                          "{type: 'function', name}", name)
    raise unprocessable(f"'{name}' must be a string or {{type: 'function', name}}", name)


def responses_text(name, value):
    """{format: {type: text | json_object | json_schema, ...}, verbosity?} (echoed back as sent)."""
    if not isinstance(value, dict):
        raise unprocessable(f"'{name}' must be an object {{format: {{type}}}}", name)
    _no_extra_keys(name, value, {"format", "verbosity"})
    if value.get("verbosity") not in (None, "low", "medium", "high"):
        raise bad_request(f"'{name}.verbosity' must be low, medium or high", f"{name}.verbosity")
    spec = value.get("format") or {"type": "text"}
    at = f"{name}.format"
    if not isinstance(spec, dict) or not isinstance(spec.get("type"), str):
        raise unprocessable(f"'{at}' must be an object with a type", at)
    kind = spec["type"]
    if kind in ("text", "json_object"):
        _no_extra_keys(at, spec, {"type"})
    elif kind == "json_schema":
        _no_extra_keys(at, spec, {"type", "name", "schema", "strict", "description"})
        if not isinstance(spec.get("name"), str) or not isinstance(spec.get("schema"), dict):
            raise unprocessable(f"'{at}' of type json_schema needs name (a string) and schema (an object)", at)
        check_tool_schema(spec["schema"], f"{at}.schema")
    else:
        raise bad_request(f"'{at}.type' must be text, json_object or json_schema; got {kind!r}", f"{at}.type")
    return {"format": spec, **({"verbosity": value["verbosity"]} if value.get("verbosity") else {})}


def responses_reasoning(name, value):
    """{effort?, summary?}: checked and echoed. For models whose chat template has a thinking
    section, effort none closes that section, empty, in the prompt (the model answers at
    once); every other effort lets the model think as its template does. summary changes
    nothing (the section comes back whole as reasoning_text, never summarized)."""
    if not isinstance(value, dict):
        raise unprocessable(f"'{name}' must be an object {{effort, summary}}", name)
    _no_extra_keys(name, value, {"effort", "summary", "generate_summary"})
    if value.get("effort") not in EFFORTS:
        raise bad_request(f"'{name}.effort' must be one of {', '.join(e for e in EFFORTS if e)}", f"{name}.effort")
    for key in ("summary", "generate_summary"):
        if value.get(key) not in SUMMARIES:
            raise bad_request(f"'{name}.{key}' must be auto, concise or detailed", f"{name}.{key}")
    return {"effort": value.get("effort"), "summary": value.get("summary") or value.get("generate_summary")}


def openai_metadata(name, value):
    """Up to 16 string pairs (keys up to 64 characters, values up to 512), echoed back."""
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise unprocessable(f"'{name}' must be an object of string values", name)
    if len(value) > MAX_METADATA_KEYS:
        raise bad_request(f"'{name}' may hold at most {MAX_METADATA_KEYS} keys", name)
    if any(len(k) > 64 or len(v) > 512 for k, v in value.items()):
        raise bad_request(f"'{name}' keys may have at most 64 characters and values at most 512", name)
    return value


def string_list(name, value):
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise unprocessable(f"'{name}' must be an array of strings, got {describe(value)}", name)
    return value


CUSTOM_KINDS.update({"responses_input": responses_input, "responses_tools": responses_tools,
                     "responses_tool_choice": responses_tool_choice, "responses_text": responses_text,
                     "responses_reasoning": responses_reasoning, "openai_metadata": openai_metadata,
                     "string_list": string_list})


def _absent_or(*defaults):
    return lambda value: value is None or any(value == d and type(value) is type(d) for d in defaults)


RESPONSES = {
    "model": Field("string", None, doc="Echoed into the response (default: the served model's id)"),
    "input": Field("responses_input", required=True, doc="Text, or items: message, function_call, "
                                                         "function_call_output, reasoning (left out of the prompt)"),
    "instructions": Field("string", None, doc="A system message placed before the input"),
    "tools": Field("responses_tools", None, doc="Function tools [{type: function, name, parameters, strict}]"),
    "tool_choice": Field("responses_tool_choice", None, doc="none | auto | required | {type: function, name}"),
    "parallel_tool_calls": Field("boolean", True, doc="false: at most one call per reply"),
    "text": Field("responses_text", None, doc="{format: text | json_object | json_schema {name, schema}}: "
                                              "output constrained token by token"),
    "reasoning": Field("responses_reasoning", None, doc="For models whose chat template has a thinking "
                                                        "section: it comes back as a reasoning item, and effort "
                                                        "none stops the model thinking. Other models: echoed, no "
                                                        "effect"),
    "max_output_tokens": Field("integer", None, low=1, doc="Upper bound, lowered to the room the context leaves "
                                                           "(default: all of it)"),
    "temperature": Field("number", 1.0, low=0.0, high=2.0, doc="0 = greedy"),
    "top_p": Field("number", 1.0, low=0.0, high=1.0),
    "metadata": Field("openai_metadata", None, doc="Up to 16 string pairs, echoed back"),
    "user": Field("string", None, doc="Accepted and ignored"),
    "stream": Field("boolean", False, doc="Typed server-sent events (response.created ... response.completed)"),
    "store": Field("boolean", False, doc="Must be false or absent: this server keeps no responses"),
    "previous_response_id": Field("string", None, doc="Refused (400): send the whole conversation in input"),
    "include": Field("string_list", None, doc="Accepted and ignored (nothing optional to include)"),
    "truncation": Field("string", "disabled", choices=("disabled",), doc="disabled only: an input that does "
                                                                         "not fit is a 400"),
    "service_tier": Field("string", None, doc="Accepted and ignored"),
    "prompt_cache_key": Field("string", None, doc="Accepted and ignored"),
    "safety_identifier": Field("string", None, doc="Accepted and ignored"),
}
# Responses fields this server does not implement: accepted only absent, null or at their default.
RESPONSES_UNSUPPORTED = {
    "background": _absent_or(False),
    "conversation": _absent_or(),
    "prompt": _absent_or(),
    "max_tool_calls": _absent_or(),
    "top_logprobs": _absent_or(0),
    "stream_options": lambda v: v is None or isinstance(v, dict),
}
