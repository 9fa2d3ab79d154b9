"""How tool declarations and calls are written in a chat prompt, and read back.

The format (ChatML-style models such as SmolLM2): the system turn ends with a section
listing each function as one JSON line inside <tools></tools>; a call is
<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>, several calls one per line;
a tool's result is a turn of role "tool". JSON is written with "<", ">" and "&" escaped
(\\u003c ...) so no argument or description can spell a closing tag: every historical
argument is representable, and the tags the model reads are only the ones we wrote.
"""
from __future__ import annotations

import orjson

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def safe_json(value) -> str:
    """Compact JSON (", " and ": " separators, as the grammar writes it) with <, >, & escaped."""
    text = orjson.dumps(value).decode()
    return _spaced(text).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _spaced(text: str) -> str:
    """orjson's compact output with a space after each separator outside strings."""
    out, in_string, escaped = [], False, False
    for ch in text:
        out.append(ch)
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in ",:":
            out.append(" ")
    return "".join(out)


def declarations(tools: list[dict]) -> str:
    """The system-turn section that declares the functions ({type, function} objects)."""
    lines = "\n".join(safe_json(tool) for tool in tools)
    return ("\n\nYou can call functions to help with the user's request. They are declared below, one JSON "
            f"object per line, inside <tools></tools>:\n<tools>\n{lines}\n</tools>\n\n"
            f"To call one, write {OPEN}\\n{{\"name\": <the function's name>, \"arguments\": <a JSON object "
            f"of its parameters>}}\\n{CLOSE}, one such block per call.")


def call_text(name: str, arguments: dict) -> str:
    return f"{OPEN}\n{safe_json({'name': name, 'arguments': arguments})}\n{CLOSE}"


def calls_text(calls: list[dict]) -> str:
    """An assistant turn's calls ({id, function: {name, arguments (parsed)}}), one per line."""
    return "\n".join(call_text(c["function"]["name"], c["function"]["arguments"]) for c in calls)


def parse_calls(text: str) -> tuple[list[dict], bool]:
    """Generated calls text -> ([{name, arguments}] of its whole calls, whether the text is
    nothing but whole calls). A reply cut by max_tokens ends in a partial call."""
    calls, rest = [], text
    while rest:
        if not rest.startswith(OPEN + "\n"):
            return calls, False
        end = rest.find("\n" + CLOSE)
        if end < 0:
            return calls, False
        try:
            call = orjson.loads(rest[len(OPEN) + 1:end])
        except orjson.JSONDecodeError:
            return calls, False
        if not isinstance(call, dict) or set(call) != {"name", "arguments"}:
            return calls, False
        calls.append(call)
        rest = rest[end + len(CLOSE) + 1:]
        rest = rest[1:] if rest.startswith("\n") else rest
    return calls, True
