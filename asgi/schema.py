"""Declarative request fields: type checks (422), range checks (400), unknown and
unsupported fields (400), defaults. The same declarations feed /openapi.json."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import bad_request, unprocessable

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 512
MAX_MESSAGES = 4096


@dataclass(frozen=True)
class Field:
    kind: str                       # string, integer, number, boolean, object, or a custom kind below
    default: object = None
    required: bool = False
    low: float | None = None
    high: float | None = None
    choices: tuple | None = None
    doc: str = ""


def describe(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return (_is_int(value) or isinstance(value, float)) and not (isinstance(value, float) and not math.isfinite(value))


def _check_type(name: str, field: Field, value):
    kind = field.kind
    wrong = unprocessable
    if kind == "string":
        if not isinstance(value, str):
            raise wrong(f"'{name}' must be a string, got {describe(value)}", name)
    elif kind == "integer":
        if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) >= 2 ** 53:
            # A huge integer literal that the JSON parser could only hold as a float.
            raise bad_request(f"'{name}' is far out of range: {value:.3g}"
                              + (f"; allowed [{_fmt(field.low)}, {_fmt(field.high)}]"
                                 if field.low is not None and field.high is not None else ""), name)
        if not _is_int(value):
            raise wrong(f"'{name}' must be an integer, got {describe(value)}", name)
    elif kind == "number":
        if not _is_number(value):
            raise wrong(f"'{name}' must be a number, got {describe(value)}", name)
    elif kind == "boolean":
        if not isinstance(value, bool):
            raise wrong(f"'{name}' must be true or false, got {describe(value)}", name)
    elif kind == "object":
        if not isinstance(value, dict):
            raise wrong(f"'{name}' must be an object, got {describe(value)}", name)
    else:
        value = CUSTOM_KINDS[kind](name, value)
    return value


def _check_range(name: str, field: Field, value) -> None:
    if field.choices is not None and value not in field.choices:
        raise bad_request(f"'{name}' must be one of {', '.join(map(str, field.choices))}; got {value!r}", name)
    if field.low is not None and field.high is not None and not field.low <= value <= field.high:
        raise bad_request(f"'{name}' must be in [{_fmt(field.low)}, {_fmt(field.high)}], got {value}", name)
    if field.low is not None and field.high is None and value < field.low:
        raise bad_request(f"'{name}' must be >= {_fmt(field.low)}, got {value}", name)


def _fmt(number) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


def validate(data: dict, fields: dict, unsupported: dict | None = None, elsewhere: dict | None = None) -> dict:
    """Check a request body against its field declarations; return values with defaults.

    unsupported: OpenAI fields we accept only at their default (name -> predicate).
    elsewhere: fields valid on another route (name -> where), refused here with a hint.
    """
    unsupported = unsupported or {}
    elsewhere = elsewhere or {}
    unknown = [k for k in data if k not in fields and k not in unsupported]
    if unknown:
        name = unknown[0]
        if name in elsewhere:
            raise bad_request(f"'{name}' is not accepted on this route; {elsewhere[name]}", name,
                              "unknown_field")
        names = ", ".join(f"'{k}'" for k in unknown)
        raise bad_request(f"unknown field{'s' if len(unknown) > 1 else ''} {names}; accepted fields: "
                          f"{', '.join(sorted(fields))}", name, "unknown_field")
    for name, accepts in unsupported.items():
        if name in data and not accepts(data[name]):
            raise bad_request(f"'{name}' is not supported by this server; omit it or send its default",
                              name, "unsupported_field")
    values = {}
    for name, field in fields.items():
        value = data.get(name)
        if value is None:
            if field.required:
                raise unprocessable(f"'{name}' is required", name, "missing_field")
            values[name] = field.default
            continue
        value = _check_type(name, field, value)
        if field.kind in ("integer", "number", "string"):
            _check_range(name, field, value)
        values[name] = value
    return values


# ------------------------------------------------------------------------ custom kinds
def _stop_strings(name, value):
    """string | string[] -> list of strings."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise unprocessable(f"'{name}' must be a string or an array of strings, got {describe(value)}", name)
    _check_stop_count(name, items)
    return items


def _check_stop_count(name, items):
    if len(items) > MAX_STOP_STRINGS:
        raise bad_request(f"'{name}' may hold at most {MAX_STOP_STRINGS} stop strings, got {len(items)}", name)
    for item in items:
        if isinstance(item, str) and not 1 <= len(item) <= MAX_STOP_LENGTH:
            raise bad_request(f"each stop string in '{name}' must have 1 to {MAX_STOP_LENGTH} characters", name)


def _native_stop(name, value):
    """string | string[] | int[] -> ("strings", [...]) or ("ids", [...])."""
    if isinstance(value, list) and value and all(_is_int(v) for v in value):
        if len(value) > 1024:
            raise bad_request(f"'{name}' may hold at most 1024 stop token ids", name)
        return ("ids", value)
    return ("strings", _stop_strings(name, value))


def _token_ids(name, value):
    if not all(_is_int(v) for v in value):
        raise unprocessable(f"'{name}' must be a string or an array of integer token ids", name)
    return value


def _native_prompt(name, value):
    """string | int[] -> ("text", str) or ("ids", [int])."""
    if isinstance(value, str):
        return ("text", value)
    if isinstance(value, list):
        return ("ids", _token_ids(name, value))
    raise unprocessable(f"'{name}' must be a string or an array of integer token ids, got {describe(value)}",
                        name)


def _completion_prompt(name, value):
    """string | [string] | int[] | [int[]] (one prompt only) -> ("text", str) or ("ids", [int])."""
    if isinstance(value, list) and value and all(isinstance(v, (str, list)) for v in value):
        if len(value) != 1:
            raise bad_request(f"'{name}' holds {len(value)} prompts; only one prompt per request is "
                              "supported (n must be 1)", name)
        value = value[0]
    return _native_prompt(name, value)


def _message_content(where, content):
    if isinstance(content, str):
        return content
    if content is None:
        raise unprocessable(f"'{where}' is required", where)
    if isinstance(content, list):
        texts = []
        for index, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise unprocessable(f"'{where}[{index}]' must be an object with a type", f"{where}[{index}]")
            if part["type"] != "text":
                raise bad_request(f"'{where}[{index}]' has type {part['type']!r}; only text parts are "
                                  "supported", f"{where}[{index}]")
            if not isinstance(part.get("text"), str):
                raise unprocessable(f"'{where}[{index}].text' must be a string", f"{where}[{index}].text")
            texts.append(part["text"])
        return "".join(texts)
    raise unprocessable(f"'{where}' must be a string or an array of text parts, got {describe(content)}", where)


def _stream_options(name, value):
    if not isinstance(value, dict):
        raise unprocessable(f"'{name}' must be an object, got {describe(value)}", name)
    for key, item in value.items():
        if key != "include_usage":
            raise bad_request(f"'{name}.{key}' is not supported; only include_usage is", f"{name}.{key}")
        if not isinstance(item, bool):
            raise unprocessable(f"'{name}.include_usage' must be true or false", f"{name}.include_usage")
    return value


def _loops(name, value):
    """An integer loop count in [1, 64], or "auto" (adaptive depth per token)."""
    if value == "auto":
        return value
    if not _is_int(value):
        raise unprocessable(f"'{name}' must be an integer or \"auto\", got {describe(value)}", name)
    if not 1 <= value <= 64:
        raise bad_request(f"'{name}' must be in [1, 64] or \"auto\", got {value}", name)
    return value


CUSTOM_KINDS = {
    "loops": _loops,
    "stop": _stop_strings,
    "native_stop": _native_stop,
    "native_prompt": _native_prompt,
    "completion_prompt": _completion_prompt,
    "stream_options": _stream_options,
}
