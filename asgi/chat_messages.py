"""The chat `messages` array, tool calls included (OpenAI's shapes).

- system / developer (read as system) / user: {role, content, name?};
- assistant: {role, content (may be null with tool_calls), tool_calls?: [{id, type:
  "function", function: {name, arguments: JSON text of an object}}], reasoning_content?};
- tool: {role, content, tool_call_id} answering an earlier assistant call.

Call ids and array order identify a call; a tool message must answer a call made before
it and not answered yet. Validated messages keep `tool_calls` with parsed arguments.
"""
from __future__ import annotations

import orjson

from .errors import bad_request, unprocessable
from .schema import MAX_MESSAGES, _message_content, describe

ROLES = ("system", "user", "assistant", "tool")
IGNORED_WHEN_EMPTY = ("function_call", "refusal", "audio")
MAX_TOOL_CALLS_PER_MESSAGE = 128


def chat_messages(name, value):
    if not isinstance(value, list):
        raise unprocessable(f"'{name}' must be an array of messages, got {describe(value)}", name)
    if len(value) > MAX_MESSAGES:
        raise bad_request(f"'{name}' may hold at most {MAX_MESSAGES} messages", name)
    messages, open_calls = [], {}
    for index, message in enumerate(value):
        where = f"{name}[{index}]"
        if not isinstance(message, dict):
            raise unprocessable(f"'{where}' must be an object with role and content", where)
        role = message.get("role")
        if not isinstance(role, str):
            raise unprocessable(f"'{where}.role' must be a string, got {describe(role)}", f"{where}.role")
        role = "system" if role == "developer" else role
        if role not in ROLES:
            raise bad_request(f"'{where}.role' must be one of {', '.join(ROLES)} (developer is read as system); "
                              f"got {role!r}", f"{where}.role")
        allowed = {"role", "content", "name"} | {"assistant": {"tool_calls", "reasoning_content", "thinking_blocks"},
                                                 "tool": {"tool_call_id"}}.get(role, set())
        for key in message:
            if key not in allowed and not (key in IGNORED_WHEN_EMPTY + ("tool_calls", "tool_call_id")
                                           and message[key] in (None, [])):
                raise bad_request(f"'{where}.{key}' is not supported on a {role} message", f"{where}.{key}",
                                  "unsupported_field")
        out = {"role": role}
        calls = _tool_calls(where, message.get("tool_calls")) if role == "assistant" else []
        if calls:
            out["tool_calls"] = calls
            for call in calls:
                open_calls[call["id"]] = call["function"]["name"]
        content = message.get("content")
        out["content"] = "" if content is None and (calls or role == "assistant") else \
            _message_content(f"{where}.content", content)
        if role == "assistant":
            _no_opaque_thinking(where, message, out)
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise unprocessable(f"'{where}.tool_call_id' must be the string id of an earlier assistant tool "
                                    "call", f"{where}.tool_call_id")
            if call_id not in open_calls:
                raise bad_request(f"'{where}.tool_call_id' {call_id!r} does not match a tool call of an earlier "
                                  "assistant message that is still unanswered", f"{where}.tool_call_id")
            out["tool_call_id"] = call_id
            out["name"] = open_calls.pop(call_id)
        messages.append(out)
    if not messages:
        raise bad_request(f"'{name}' must contain at least one message", name)
    return messages


def _tool_calls(where, calls):
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise unprocessable(f"'{where}.tool_calls' must be an array, got {describe(calls)}", f"{where}.tool_calls")
    if len(calls) > MAX_TOOL_CALLS_PER_MESSAGE:
        raise bad_request(f"'{where}.tool_calls' may hold at most {MAX_TOOL_CALLS_PER_MESSAGE} calls",
                          f"{where}.tool_calls")
    out, ids = [], set()
    for index, call in enumerate(calls):
        at = f"{where}.tool_calls[{index}]"
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            raise unprocessable(f"'{at}' must be an object with id, type and function", at)
        if call.get("type", "function") != "function":
            raise bad_request(f"'{at}.type' must be 'function'", f"{at}.type")
        extra = set(call) - {"id", "type", "function", "index"}
        if extra:
            raise bad_request(f"'{at}.{sorted(extra)[0]}' is not supported", at)
        position = call.get("index")
        if position is not None and (not isinstance(position, int) or isinstance(position, bool)
                                     or not 0 <= position <= 127):
            raise bad_request(f"'{at}.index' must be an integer from 0 to 127", f"{at}.index")
        call_id, function = call.get("id"), call["function"]
        if not isinstance(call_id, str) or not call_id:
            raise unprocessable(f"'{at}.id' must be a non-empty string", f"{at}.id")
        if call_id in ids:
            raise bad_request(f"'{at}.id' {call_id!r} repeats an id of the same message", f"{at}.id")
        ids.add(call_id)
        name, arguments = function.get("name"), function.get("arguments")
        if not isinstance(name, str) or not name:
            raise unprocessable(f"'{at}.function.name' must be a non-empty string", f"{at}.function.name")
        if not isinstance(arguments, str):
            raise unprocessable(f"'{at}.function.arguments' must be a string holding a JSON object",
                                f"{at}.function.arguments")
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            raise bad_request(f"'{at}.function.arguments' is not valid JSON", f"{at}.function.arguments") from None
        if not isinstance(parsed, dict):
            raise bad_request(f"'{at}.function.arguments' must be a JSON object", f"{at}.function.arguments")
        out.append({"id": call_id, "function": {"name": name, "arguments": parsed}})
    return out


def _no_opaque_thinking(where, message, out):
    """reasoning_content is plain text; thinking_blocks may repeat it (empty or no signature)."""
    reasoning = message.get("reasoning_content")
    if reasoning is not None and not isinstance(reasoning, str):
        raise unprocessable(f"'{where}.reasoning_content' must be a string", f"{where}.reasoning_content")
    blocks = message.get("thinking_blocks")
    if blocks is not None:
        if not isinstance(blocks, list):
            raise unprocessable(f"'{where}.thinking_blocks' must be an array", f"{where}.thinking_blocks")
        texts = []
        for index, block in enumerate(blocks):
            at = f"{where}.thinking_blocks[{index}]"
            if not isinstance(block, dict) or block.get("type") != "thinking" or \
                    not isinstance(block.get("thinking"), str) or block.get("signature") not in (None, "") or \
                    set(block) - {"type", "thinking", "signature"}:
                raise bad_request(f"'{at}' must be a plain thinking block ({{type: 'thinking', thinking: text}}, "
                                  "with an empty or absent signature); opaque thinking data is refused", at)
            texts.append(block["thinking"])
        if "".join(texts) != (reasoning or ""):
            raise bad_request(f"'{where}.thinking_blocks' must repeat the message's reasoning_content exactly",
                              f"{where}.thinking_blocks")
    if reasoning:
        out["reasoning_content"] = reasoning
