"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API on the chat
completions machinery.

The body (asgi/messages_fields.py) becomes a Conversation (asgi/conversation.py): the
system prompt as a system message, then the turns; tools and tool_choice go through the
same grammar as chat tool calls, so a tool_use input is valid for its input_schema by
construction. The reply is built by MessageEvents (asgi/messages_stream.py), streamed
or sent whole. count_tokens renders the same prompt (system, turns, tools as the
tool_choice leaves them) without generating, so its count is the usage.input_tokens of
the same request. Errors on these routes take Anthropic's shape (asgi/anthropic_errors.py).

thinking {type: disabled} closes a thinking template's section, empty, in the prompt, so
the model answers at once (count_tokens renders it the same way); thinking left out lets
the model think as its template does, and its section is returned only to a request that
turned thinking on (enabled or adaptive). budget_tokens is checked (>= 1024, < max_tokens)
but not enforced: the section may run past it, up to max_tokens (enforcing it would need
the closing tag forced into the generation once the budget is spent, which the engine
does not do).

max_tokens is required by the API, and an agent's value is often larger than a small
model's context: it is an upper bound here, as the API defines it, lowered to the room
the context leaves; a reply that runs out ends with stop_reason max_tokens.
"""
from __future__ import annotations

from .conversation import Conversation, engine_request, matched_stop, render
from .errors import bad_request
from .generation import Generation
from .http import send_json
from .messages_fields import MESSAGES, MESSAGES_UNSUPPORTED, PROMPT
from .messages_stream import MessageEvents
from .reply_events import run_reply
from .schema import validate
from .typed_events import TypedEventStream


def _conversation(values) -> Conversation:
    messages = list(values["messages"])
    if values["system"]:
        messages.insert(0, {"role": "system", "content": values["system"]})
    choice, parallel = values["tool_choice"] or (None, True)
    tools, output_format = values["tools"] or [], values["output_config"]
    if tools and output_format is not None and choice != "none":
        raise bad_request("'output_config.format' and tool calls cannot constrain the same reply; send tool_choice "
                          "{type: 'none'} or drop the format", "output_config.format")
    # Only an explicit disabled stops a thinking template's model from thinking: left out,
    # the API leaves thinking to the model, and this model thinks as its template does.
    think = (values["thinking"] or {}).get("type") != "disabled"
    return Conversation(messages, tools, choice, parallel, output_format, list(values.get("stop_sequences") or []),
                        think)


async def count_tokens(request):
    values = validate(await request.json(), PROMPT, MESSAGES_UNSUPPORTED)
    prompt_ids, _, _ = render(request.state, _conversation(values))
    await send_json(request.send, 200, {"input_tokens": len(prompt_ids)})


async def messages(request):
    values = validate(await request.json(), MESSAGES, MESSAGES_UNSUPPORTED)
    thinking = values["thinking"] or {"type": "disabled"}
    if thinking["type"] == "enabled" and thinking["budget_tokens"] >= values["max_tokens"]:
        raise bad_request("'max_tokens' must be greater than 'thinking.budget_tokens'", "max_tokens")
    state = request.state
    conversation = _conversation(values)
    sampling = {"temperature": float(values["temperature"]), "top_p": float(values["top_p"]),
                "top_k": values["top_k"]}
    engine_req, tools = engine_request(state, conversation, values["max_tokens"], sampling, "max_tokens", "messages")
    generation = Generation(request, engine_req)
    generation.submit()
    # A thinking template's section is returned only to a request that turned thinking on.
    writer = MessageEvents(values["model"], len(engine_req.prompt_ids), thinking["type"] != "disabled")
    stream = None
    if values["stream"]:
        stream = TypedEventStream(request.send, numbered=False, failure=writer.failed)
        request.stream = stream
        await stream.start()
        await stream.events(writer.started())
    calls = await run_reply(request, generation, writer, tools, stream)
    outcome = generation.outcome
    stop_sequence = matched_stop(state, outcome, "".join(writer.released), conversation.stop)
    events = writer.finish(calls, outcome, stop_sequence)
    if stream is None:
        await send_json(request.send, 200, writer.message)
        return
    await stream.events(events)
    await stream.done()
