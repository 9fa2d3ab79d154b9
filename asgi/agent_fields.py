"""Request fields for agents: tools, tool_choice, response_format, logprobs, logit_bias,
min_p, keep_alive. Checked here for shape (422) and value (400); what they make of the
generation (a grammar, the logprobs count) is worked out in asgi/structured.py."""
from __future__ import annotations

import re

from tinyloop.engine.sampling import MAX_TOP_LOGPROBS

from .errors import bad_request, unprocessable
from .schema import CUSTOM_KINDS, MAX_MESSAGES, Field, describe

MAX_TOOLS = 128
MAX_COMPLETION_LOGPROBS = 5          # OpenAI's limit for /v1/completions
MAX_LOGIT_BIAS = 300
FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def tool_array(name, value) -> list:
    """A tools array's own checks, on every route that takes tools: an array, at most MAX_TOOLS."""
    if not isinstance(value, list):
        raise unprocessable(f"'{name}' must be an array of tools, got {describe(value)}", name)
    if len(value) > MAX_TOOLS:
        raise bad_request(f"'{name}' may hold at most {MAX_TOOLS} tools", name)
    return value


def check_function(names: set, fname, description, strict, parameters, paths: tuple) -> None:
    """One function tool's checks, whatever the route's shape: a valid name not declared before
    (added to `names`), a string description, a boolean strict, an object schema. paths: where
    the route keeps (name, description, strict, parameters), for the errors."""
    name_at, description_at, strict_at, parameters_at = paths
    if not isinstance(fname, str) or not FUNCTION_NAME.match(fname):
        raise bad_request(f"'{name_at}' must be 1 to 64 letters, digits, '_' or '-'", name_at)
    if fname in names:
        raise bad_request(f"'{name_at}' {fname!r} is declared twice", name_at)
    names.add(fname)
    if not isinstance(description, str):
        raise unprocessable(f"'{description_at}' must be a string", description_at)
    if not isinstance(strict, bool):
        raise unprocessable(f"'{strict_at}' must be true or false", strict_at)
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        raise bad_request(f"'{parameters_at}' must be a JSON schema of type object", parameters_at)


def _tools(name, value):
    tools, names = [], set()
    value = tool_array(name, value)
    for index, tool in enumerate(value):
        at = f"{name}[{index}]"
        if not isinstance(tool, dict) or not isinstance(tool.get("function"), dict):
            raise unprocessable(f"'{at}' must be an object {{type: 'function', function: {{name, parameters}}}}", at)
        if tool.get("type") != "function" or set(tool) - {"type", "function"}:
            raise bad_request(f"'{at}' must be {{type: 'function', function: {{...}}}}; other tool types are not "
                              "supported", at)
        function = tool["function"]
        extra = set(function) - {"name", "description", "parameters", "strict"}
        if extra:
            raise bad_request(f"'{at}.function.{sorted(extra)[0]}' is not supported", f"{at}.function")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        check_function(names, function.get("name"), function.get("description", ""), function.get("strict", False),
                       parameters, tuple(f"{at}.function.{key}" for key in ("name", "description", "strict",
                                                                             "parameters")))
        tools.append({"type": "function", "function": {**function, "parameters": parameters}})
    return tools


def _tool_choice(name, value):
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise bad_request(f"'{name}' must be none, auto, required or {{type: 'function', function: {{name}}}}; "
                              f"got {value!r}", name)
        return value
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("function"), dict) \
            and isinstance(value["function"].get("name"), str) and set(value) == {"type", "function"}:
        return {"function": value["function"]["name"]}
    raise unprocessable(f"'{name}' must be a string or {{type: 'function', function: {{name}}}}", name)


def _response_format(name, value):
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise unprocessable(f"'{name}' must be an object with a type", name)
    kind = value["type"]
    if kind in ("text", "json_object"):
        if set(value) != {"type"}:
            raise bad_request(f"'{name}' of type {kind} takes no other keys", name)
        return {"type": kind}
    if kind != "json_schema":
        raise bad_request(f"'{name}.type' must be text, json_object or json_schema; got {kind!r}", f"{name}.type")
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or "schema" not in spec:
        raise unprocessable(f"'{name}.json_schema' must be an object with name and schema", f"{name}.json_schema")
    extra = set(spec) - {"name", "schema", "strict", "description"}
    if extra:
        raise bad_request(f"'{name}.json_schema.{sorted(extra)[0]}' is not supported", f"{name}.json_schema")
    return {"type": "json_schema", "schema": spec["schema"]}


def _logit_bias(name, value):
    """{"token id": bias} -> ((id, bias), ...) sorted; ids are checked against the vocabulary later."""
    if not isinstance(value, dict):
        raise unprocessable(f"'{name}' must be an object mapping token ids to biases", name)
    if len(value) > MAX_LOGIT_BIAS:
        raise bad_request(f"'{name}' may hold at most {MAX_LOGIT_BIAS} entries", name)
    out = []
    for key, bias in value.items():
        if not key.isdigit():
            raise bad_request(f"'{name}' keys must be token ids (decimal strings); got {key!r}", name)
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise bad_request(f"'{name}[{key}]' must be a number in [-100, 100]", name)
        out.append((int(key), float(bias)))
    return tuple(sorted(out))


def _keep_alive(name, value):
    """A number (seconds) or a duration string like "5m": accepted, and changes nothing."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise unprocessable(f"'{name}' must be a number or a duration string", name)
    return value


def _completion_logprobs(name, value):
    if isinstance(value, bool) or not isinstance(value, int):
        raise unprocessable(f"'{name}' must be an integer (alternatives per token), got {describe(value)}", name)
    if not 0 <= value <= MAX_COMPLETION_LOGPROBS:
        raise bad_request(f"'{name}' must be in [0, {MAX_COMPLETION_LOGPROBS}], got {value}", name)
    return value


CUSTOM_KINDS.update({"tools": _tools, "tool_choice": _tool_choice, "response_format": _response_format,
                     "logit_bias": _logit_bias, "keep_alive": _keep_alive,
                     "completion_logprobs": _completion_logprobs})

COMMON = {
    "min_p": Field("number", 0.0, low=0.0, high=1.0, doc="Drop tokens below min_p x the best one's probability"),
    "logit_bias": Field("logit_bias", None, doc="{token id: bias in [-100, 100]} added to the logits"),
    "keep_alive": Field("keep_alive", None, doc="Accepted and ignored (the model stays loaded)"),
    "response_format": Field("response_format", None, doc="text | json_object | json_schema: output constrained "
                                                          "token by token (llguidance)"),
}
CHAT_ONLY = {
    "logprobs": Field("boolean", False, doc="Return each token's logprob"),
    "top_logprobs": Field("integer", None, low=0, high=MAX_TOP_LOGPROBS, doc="0..20 alternatives per token"),
    "tools": Field("tools", None, doc="Function declarations [{type: function, function: {name, parameters}}]"),
    "tool_choice": Field("tool_choice", None, doc="none | auto | required | {type: function, function: {name}}"),
    "parallel_tool_calls": Field("boolean", True, doc="false: at most one call per reply"),
}
COMPLETION_ONLY = {
    "logprobs": Field("completion_logprobs", None, doc="0..5: logprobs with that many alternatives per token"),
}

# /openapi.json shapes of the kinds above
_SCHEMA_OBJECT = {"type": "object", "description": "A JSON schema (see README: supported keywords)"}
OPENAPI_KINDS = {
    "tools": {"type": "array", "maxItems": MAX_TOOLS, "items": {"type": "object", "required": ["type", "function"],
                                                                "properties": {
        "type": {"const": "function"}, "function": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "description": {"type": "string"}, "parameters": _SCHEMA_OBJECT,
            "strict": {"type": "boolean"}}}}}},
    "tool_choice": {"anyOf": [{"enum": ["none", "auto", "required"]}, {"type": "object"}]},
    "response_format": {"type": "object", "properties": {"type": {"enum": ["text", "json_object", "json_schema"]},
                                                         "json_schema": {"type": "object"}}},
    "logit_bias": {"type": "object", "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}},
    "keep_alive": {"anyOf": [{"type": "number"}, {"type": "string"}]},
    "completion_logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_COMPLETION_LOGPROBS},
    "chat_messages": {"type": "array", "minItems": 1, "maxItems": MAX_MESSAGES, "items": {
        "type": "object", "required": ["role"], "properties": {
        "role": {"type": "string", "enum": ["system", "developer", "user", "assistant", "tool"]},
        "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}},
                              {"type": "null"}]},
        "name": {"type": "string"}, "tool_calls": {"type": "array", "items": {"type": "object"}},
        "tool_call_id": {"type": "string"}, "reasoning_content": {"type": "string"},
        "thinking_blocks": {"type": "array", "items": {"type": "object"}}}}},
}
