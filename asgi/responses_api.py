"""POST /v1/responses: OpenAI's Responses API on the chat completions machinery.

The body (asgi/responses_fields.py) becomes a Conversation (asgi/conversation.py):
instructions as a system message, then the input items; function tools and tool_choice
go through the same grammar as chat tool calls, text.format through the same JSON
constraint as response_format. The reply is built by ResponseEvents
(asgi/responses_stream.py), streamed as typed events or sent whole.

Shape errors (a wrong type, a missing field, a body that is not an object) are 400 here,
not the 422 chat completions answers as its documented contract: OpenAI's API answers
every invalid request with 400, and its SDK raises BadRequestError for it.
reasoning.effort none closes a thinking template's section in the prompt (the model
answers at once); usage.output_tokens_details.reasoning_tokens counts the generated
tokens of the section.

Stored responses are not kept: `store: true` and `previous_response_id` are a 400 that
says to send the whole conversation. Why: a replica's memory is not shared with the
other replicas behind the load balancer, nor kept across a restart or a drain, so a
follow-up could reach a server that never saw the first turn; and without a prefix
cache, chaining would save no computation, only the client's bandwidth.
"""
from __future__ import annotations

import time
import uuid

from .conversation import Conversation, engine_request, reasoning_tokens
from .errors import ApiError, bad_request
from .generation import Generation
from .http import send_json
from .reply_events import run_reply
from .responses_fields import RESPONSES, RESPONSES_UNSUPPORTED
from .responses_stream import ResponseEvents
from .schema import validate
from .typed_events import TypedEventStream

NOT_STORED = ("this server keeps no responses (each replica is stateless, so a stored response would be lost "
              "on another replica or a restart); send the whole conversation in 'input' instead")


def _refuse_stored(values) -> None:
    if values["store"]:
        raise bad_request(f"'store': true is not supported: {NOT_STORED}, and send store false or omit it",
                          "store", "unsupported_field")
    if values["previous_response_id"] is not None:
        raise bad_request(f"'previous_response_id' is not supported: {NOT_STORED}", "previous_response_id",
                          "unsupported_field")


def _conversation(values) -> Conversation:
    messages = list(values["input"])
    if values["instructions"]:
        messages.insert(0, {"role": "system", "content": values["instructions"]})
    output_format = (values["text"] or {"format": {"type": "text"}})["format"]
    tools, choice = values["tools"] or [], values["tool_choice"]
    if tools and output_format["type"] != "text" and choice != "none":
        raise bad_request("'text.format' and tool calls cannot constrain the same reply; send tool_choice none or "
                          "text.format {type: text}", "text.format")
    response_format = {"type": output_format["type"]}
    if output_format["type"] == "json_schema":
        response_format["schema"] = output_format["schema"]
    think = (values["reasoning"] or {}).get("effort") != "none"
    return Conversation(messages, tools, choice, values["parallel_tool_calls"], response_format, think=think)


def _echo_tools(tools) -> list:
    return [{"type": "function", "name": t["function"]["name"], "description": t["function"].get("description"),
             "parameters": t["function"]["parameters"], "strict": t["function"].get("strict", False)}
            for t in tools or []]


def _echo_choice(choice):
    if isinstance(choice, dict):
        return {"type": "function", "name": choice["function"]}
    return choice or "auto"


def response_object(state, values) -> dict:
    """The response as it stands when generation starts (what response.created carries)."""
    reasoning = values["reasoning"] or {"effort": None, "summary": None}
    return {"id": "resp_" + uuid.uuid4().hex[:24], "object": "response", "created_at": int(time.time()),
            "status": "in_progress", "completed_at": None, "background": False, "error": None,
            "incomplete_details": None, "instructions": values["instructions"],
            "max_output_tokens": values["max_output_tokens"], "model": values["model"] or state.model_id, "output": [],
            "parallel_tool_calls": values["parallel_tool_calls"], "previous_response_id": None,
            "reasoning": reasoning, "store": False, "temperature": values["temperature"],
            "text": values["text"] or {"format": {"type": "text"}}, "tool_choice": _echo_choice(values["tool_choice"]),
            "tools": _echo_tools(values["tools"]), "top_p": values["top_p"], "truncation": "disabled",
            "usage": None, "user": values["user"], "metadata": values["metadata"] or {}}


async def responses(request):
    try:
        await _respond(request)
    except ApiError as exc:
        if exc.status == 422:             # OpenAI's status for a wrong type or shape (see the top)
            exc.status = 400
        raise


async def _respond(request):
    values = validate(await request.json(), RESPONSES, RESPONSES_UNSUPPORTED)
    _refuse_stored(values)
    state = request.state
    sampling = {"temperature": float(values["temperature"]), "top_p": float(values["top_p"])}
    engine_req, tools = engine_request(state, _conversation(values), values["max_output_tokens"], sampling,
                                       "max_output_tokens", "input")
    generation = Generation(request, engine_req)
    generation.submit()
    writer = ResponseEvents(response_object(state, values))
    stream = None
    if values["stream"]:
        stream = TypedEventStream(request.send, numbered=True, failure=writer.failed)
        request.stream = stream
        await stream.start()
        await stream.events(writer.created())
    calls = await run_reply(request, generation, writer, tools, stream)
    events = writer.finish(calls, generation.outcome, reasoning_tokens(state, generation.outcome))
    if stream is None:
        await send_json(request.send, 200, writer.response)
        return
    await stream.events(events)
    await stream.done()
