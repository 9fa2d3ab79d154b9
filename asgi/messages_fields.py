"""The request body of POST /v1/messages and /v1/messages/count_tokens (Anthropic's
Messages API), declared and checked.

`messages` alternate user / assistant; content is a string or blocks:
- text {text} (cache_control and citations accepted and ignored);
- tool_use {id, name, input: object} in an assistant turn -> the turn's tool calls;
- tool_result {tool_use_id, content: string or text blocks, is_error?} in a user turn ->
  a tool message answering that call (is_error: its text is marked "Error: ");
- thinking / redacted_thinking in an assistant turn: accepted and left out of the prompt
  (Anthropic's API drops earlier turns' thinking too).
Images, documents and server tools are a 400 naming the block. The conversation must
end with a user turn (assistant prefill is not supported) and every tool_use must have
its tool_result.
"""
from __future__ import annotations

from .agent_fields import check_function, tool_array
from .conversation import check_tool_schema
from .errors import bad_request, unprocessable
from .schema import CUSTOM_KINDS, MAX_MESSAGES, Field, _check_stop_count, describe

BLOCK_KEYS = {
    "text": {"type", "text", "cache_control", "citations"},
    "tool_use": {"type", "id", "name", "input", "cache_control"},
    "tool_result": {"type", "tool_use_id", "content", "is_error", "cache_control"},
    "thinking": {"type", "thinking", "signature"},
    "redacted_thinking": {"type", "data"},
}
BLOCKS_BY_ROLE = {"user": ("text", "tool_result"), "assistant": ("text", "tool_use", "thinking", "redacted_thinking")}
MIN_THINKING_BUDGET = 1024                  # Anthropic's own lower bound for budget_tokens
# strict changes nothing (every input is generated under its schema's grammar);
# eager_input_streaming and input_examples are hints we have no use for.
TOOL_KEYS = {"type", "name", "description", "input_schema", "cache_control", "strict", "eager_input_streaming",
             "input_examples"}


def _no_extra_keys(at: str, item: dict, allowed: set) -> None:
    extra = sorted(set(item) - allowed)
    if extra:
        raise bad_request(f"'{at}.{extra[0]}' is not supported", f"{at}.{extra[0]}")


def _blocks(at: str, content, allowed: tuple) -> list:
    """A string (one text block) or an array of blocks of the allowed types."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise unprocessable(f"'{at}' must be a string or an array of content blocks, got {describe(content)}", at)
    for index, block in enumerate(content):
        where = f"{at}[{index}]"
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise unprocessable(f"'{where}' must be an object with a type", where)
        if block["type"] not in allowed:
            raise bad_request(f"'{where}.type' {block['type']!r} is not supported here; this turn may hold "
                              f"{', '.join(allowed)} blocks", f"{where}.type")
        _no_extra_keys(where, block, BLOCK_KEYS[block["type"]])
        if block["type"] == "text" and not isinstance(block.get("text"), str):
            raise unprocessable(f"'{where}.text' must be a string", f"{where}.text")
    return content


def _tool_use(at: str, block: dict, open_calls: dict) -> dict:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not call_id:
        raise unprocessable(f"'{at}.id' must be a non-empty string", f"{at}.id")
    if call_id in open_calls:
        raise bad_request(f"'{at}.id' {call_id!r} repeats an unanswered tool_use id", f"{at}.id")
    if not isinstance(name, str) or not name:
        raise unprocessable(f"'{at}.name' must be a non-empty string", f"{at}.name")
    if not isinstance(arguments, dict):
        raise unprocessable(f"'{at}.input' must be an object", f"{at}.input")
    open_calls[call_id] = name
    return {"id": call_id, "function": {"name": name, "arguments": arguments}}


def _tool_result(at: str, block: dict, open_calls: dict) -> dict:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or call_id not in open_calls:
        raise bad_request(f"'{at}.tool_use_id' {call_id!r} does not match an earlier tool_use that is still "
                          "unanswered", f"{at}.tool_use_id")
    content = block.get("content", "")
    texts = [b["text"] for b in _blocks(f"{at}.content", content, ("text",))]
    if not isinstance(block.get("is_error", False), bool):
        raise unprocessable(f"'{at}.is_error' must be true or false", f"{at}.is_error")
    text = "".join(texts)
    if block.get("is_error"):
        text = "Error: " + text
    return {"role": "tool", "content": text, "tool_call_id": call_id, "name": open_calls.pop(call_id)}


def anthropic_messages(name, value):
    """The messages array -> chat-template messages."""
    if not isinstance(value, list):
        raise unprocessable(f"'{name}' must be an array of messages, got {describe(value)}", name)
    if not value:
        raise bad_request(f"'{name}' must hold at least one message", name)
    if len(value) > MAX_MESSAGES:
        raise bad_request(f"'{name}' may hold at most {MAX_MESSAGES} messages", name)
    out, open_calls = [], {}
    for index, message in enumerate(value):
        at = f"{name}[{index}]"
        if not isinstance(message, dict):
            raise unprocessable(f"'{at}' must be an object with role and content", at)
        _no_extra_keys(at, message, {"role", "content"})
        role = message.get("role")
        if role not in BLOCKS_BY_ROLE:
            raise bad_request(f"'{at}.role' must be user or assistant (the system prompt goes in 'system'); "
                              f"got {role!r}", f"{at}.role")
        if message.get("content") is None:
            raise unprocessable(f"'{at}.content' is required", f"{at}.content")
        blocks = _blocks(f"{at}.content", message["content"], BLOCKS_BY_ROLE[role])
        texts, calls = [], []
        for number, block in enumerate(blocks):
            where = f"{at}.content[{number}]"
            if block["type"] == "text":
                texts.append(block["text"])
            elif block["type"] == "tool_use":
                calls.append(_tool_use(where, block, open_calls))
            elif block["type"] == "tool_result":
                out.append(_tool_result(where, block, open_calls))   # results first, as the API orders them
        if role == "assistant":
            turn = {"role": "assistant", "content": "".join(texts)}
            if calls:
                turn["tool_calls"] = calls
            out.append(turn)
        elif texts:
            out.append({"role": "user", "content": "".join(texts)})
    if value[-1].get("role") != "user":
        raise bad_request(f"the last message of '{name}' must be a user turn: continuing an assistant turn "
                          "(prefill) is not supported", f"{name}[{len(value) - 1}].role")
    if open_calls:
        raise bad_request(f"tool_use {next(iter(open_calls))!r} has no tool_result; answer every tool_use in the "
                          "next user turn", name)
    return out


def anthropic_system(name, value):
    """A string or text blocks -> one string."""
    return "".join(block["text"] for block in _blocks(name, value, ("text",)))


def anthropic_tools(name, value):
    """[{name, description?, input_schema}] -> chat-shape declarations."""
    tools, names = [], set()
    for index, tool in enumerate(tool_array(name, value)):
        at = f"{name}[{index}]"
        if not isinstance(tool, dict):
            raise unprocessable(f"'{at}' must be an object {{name, description, input_schema}}", at)
        if tool.get("type", "custom") != "custom":
            raise bad_request(f"'{at}.type' {tool['type']!r} is not supported: only client tools (name, "
                              "input_schema) are", f"{at}.type")
        _no_extra_keys(at, tool, TOOL_KEYS)
        fname = tool.get("name")
        schema = tool.get("input_schema")
        check_function(names, fname, tool.get("description", ""), tool.get("strict", False), schema,
                       tuple(f"{at}.{key}" for key in ("name", "description", "strict", "input_schema")))
        check_tool_schema(schema, f"{at}.input_schema")
        function = {"name": fname, "parameters": schema}
        if tool.get("description"):
            function["description"] = tool["description"]
        tools.append({"type": "function", "function": function})
    return tools


def anthropic_tool_choice(name, value):
    """{type: auto | any | tool | none, name?, disable_parallel_tool_use?} ->
    (the chat machinery's choice, whether parallel calls are allowed)."""
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise unprocessable(f"'{name}' must be an object {{type: auto | any | tool | none}}", name)
    kind = value["type"]
    choices = {"auto": "auto", "any": "required", "none": "none", "tool": None}
    if kind not in choices:
        raise bad_request(f"'{name}.type' must be auto, any, tool or none; got {kind!r}", f"{name}.type")
    _no_extra_keys(name, value, {"type", "disable_parallel_tool_use"} | ({"name"} if kind == "tool" else set()))
    disable = value.get("disable_parallel_tool_use", False)
    if not isinstance(disable, bool):
        raise unprocessable(f"'{name}.disable_parallel_tool_use' must be true or false",
                            f"{name}.disable_parallel_tool_use")
    if kind == "tool":
        if not isinstance(value.get("name"), str):
            raise unprocessable(f"'{name}.name' must name a declared tool", f"{name}.name")
        return {"function": value["name"]}, not disable
    return choices[kind], not disable


def anthropic_thinking(name, value):
    """{type: enabled, budget_tokens >= 1024} | {type: adaptive} | {type: disabled} (display
    optional). For models whose chat template has a thinking section: enabled or adaptive
    returns the section as a thinking block; disabled closes the section, empty, in the
    prompt, so the model does not think. budget_tokens is checked, not enforced
    (messages_api.py says why). For other models it changes nothing."""
    if not isinstance(value, dict) or value.get("type") not in ("enabled", "adaptive", "disabled"):
        raise bad_request(f"'{name}' must be {{type: 'enabled', budget_tokens}}, {{type: 'adaptive'}} or "
                          "{type: 'disabled'}", name)
    if value.get("display") not in (None, "summarized", "omitted"):
        raise bad_request(f"'{name}.display' must be summarized or omitted", f"{name}.display")
    if value["type"] != "enabled":
        _no_extra_keys(name, value, {"type", "display"})
        return value
    _no_extra_keys(name, value, {"type", "budget_tokens", "display"})
    budget = value.get("budget_tokens")
    if isinstance(budget, bool) or not isinstance(budget, int):
        raise unprocessable(f"'{name}.budget_tokens' must be an integer", f"{name}.budget_tokens")
    if budget < MIN_THINKING_BUDGET:
        raise bad_request(f"'{name}.budget_tokens' must be >= {MIN_THINKING_BUDGET}, got {budget}",
                          f"{name}.budget_tokens")
    return value


def anthropic_output_config(name, value):
    """{effort?, format?: {type: json_schema, schema}} -> the reply's output format (the
    same JSON-schema constraint as response_format); effort is accepted and changes nothing."""
    if not isinstance(value, dict):
        raise unprocessable(f"'{name}' must be an object {{effort, format}}", name)
    _no_extra_keys(name, value, {"effort", "format"})
    if value.get("effort") not in (None, "low", "medium", "high", "xhigh", "max"):
        raise bad_request(f"'{name}.effort' must be low, medium, high, xhigh or max", f"{name}.effort")
    spec = value.get("format")
    if spec is None:
        return None
    at = f"{name}.format"
    if not isinstance(spec, dict) or spec.get("type") != "json_schema" or not isinstance(spec.get("schema"), dict):
        raise bad_request(f"'{at}' must be {{type: 'json_schema', schema: {{...}}}}", at)
    _no_extra_keys(at, spec, {"type", "schema"})
    check_tool_schema(spec["schema"], f"{at}.schema")
    return {"type": "json_schema", "schema": spec["schema"]}


def anthropic_metadata(name, value):
    if not isinstance(value, dict):
        raise unprocessable(f"'{name}' must be an object {{user_id}}", name)
    _no_extra_keys(name, value, {"user_id"})
    if not isinstance(value.get("user_id") or "", str) or len(value.get("user_id") or "") > 256:
        raise bad_request(f"'{name}.user_id' must be a string of at most 256 characters", f"{name}.user_id")
    return value


def anthropic_stop(name, value):
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise unprocessable(f"'{name}' must be an array of strings, got {describe(value)}", name)
    _check_stop_count(name, value)
    return value


CUSTOM_KINDS.update({"anthropic_messages": anthropic_messages, "anthropic_system": anthropic_system,
                     "anthropic_tools": anthropic_tools, "anthropic_tool_choice": anthropic_tool_choice,
                     "anthropic_thinking": anthropic_thinking, "anthropic_metadata": anthropic_metadata,
                     "anthropic_stop": anthropic_stop, "anthropic_output_config": anthropic_output_config})

# What decides the prompt: count_tokens takes exactly these, so its count is the prompt's.
PROMPT = {
    "model": Field("string", required=True, doc="Echoed into the response"),
    "messages": Field("anthropic_messages", required=True, doc="Alternating user / assistant turns: text, "
                                                               "tool_use, tool_result blocks"),
    "system": Field("anthropic_system", None, doc="A string or text blocks"),
    "tools": Field("anthropic_tools", None, doc="Client tools [{name, description, input_schema}]"),
    "tool_choice": Field("anthropic_tool_choice", None, doc="{type: auto | any | tool | none, name?, "
                                                            "disable_parallel_tool_use?}"),
    "thinking": Field("anthropic_thinking", None, doc="For models whose chat template has a thinking section: "
                                                      "enabled / adaptive return it as thinking blocks, disabled "
                                                      "stops the model thinking; budget_tokens checked, not "
                                                      "enforced. Other models: no effect"),
    "output_config": Field("anthropic_output_config", None, doc="{format: {type: json_schema, schema}}: output "
                                                                "constrained token by token; effort ignored"),
    "cache_control": Field("object", None, doc="Accepted and ignored (there is no prompt cache yet)"),
}
MESSAGES = {
    **PROMPT,
    "max_tokens": Field("integer", required=True, low=1, doc="Upper bound, lowered to the room the context "
                                                             "leaves"),
    "stop_sequences": Field("anthropic_stop", None, doc="Up to 16 strings; stop_reason stop_sequence names "
                                                        "the one matched"),
    "stream": Field("boolean", False, doc="Typed server-sent events (message_start ... message_stop)"),
    "temperature": Field("number", 1.0, low=0.0, high=1.0, doc="0 = greedy"),
    "top_p": Field("number", 1.0, low=0.0, high=1.0),
    "top_k": Field("integer", 0, low=0, high=1000, doc="0 = off"),
    "metadata": Field("anthropic_metadata", None, doc="{user_id}: accepted and ignored"),
    "service_tier": Field("string", None, choices=("auto", "standard_only"), doc="Accepted and ignored"),
}


def _absent_or(*defaults):
    return lambda value: value is None or value in defaults


# Messages fields this server does not implement: accepted only absent, null or at their default.
MESSAGES_UNSUPPORTED = {
    "speed": _absent_or("standard"),
    "container": _absent_or(),
    "diagnostics": _absent_or(),
    "inference_geo": _absent_or(),
    "mcp_servers": _absent_or(),
    "context_management": _absent_or(),
    "user_profile_id": _absent_or(),
    "workspace_id": _absent_or(),
}
