"""POST /v1/responses and /v1/messages at the ASGI level (no server, fast): every bad
input is a clear 4xx in the route's own error shape, naming what was wrong; the
guarantees shared with chat completions (auth, admission, draining, disconnects, the
context rule, stop sequences, grammar-ended replies) hold on the new routes."""
import asyncio
from types import SimpleNamespace

import orjson
import pytest
from asgi_client import call, run, until
from openai.types.responses import Response, ResponseError, ResponseStreamEvent
from pydantic import TypeAdapter
from test_server_asgi import ready_app

from asgi import messages_api, responses_api
from asgi.generation import Generation, Outcome
from tinyloop.model.modelfile import write_model_file
from tinyloop.model.testmodels import make_test_model, preset_config, random_weights, train_tokenizer

RESPONSES, MESSAGES, COUNT = "/v1/responses", "/v1/messages", "/v1/messages/count_tokens"
HI = [{"role": "user", "content": "Hi"}]
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}
R_TOOL = {"type": "function", "name": "get_weather", "parameters": SCHEMA}
M_TOOL = {"name": "get_weather", "input_schema": SCHEMA}
CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'}
USE = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """A model with an end-of-sequence token (grammar-constrained replies end with it)."""
    path = tmp_path_factory.mktemp("agent-apis-asgi") / "tiny.tinyloop"
    make_test_model(path, "tiny-looped", seed=0, max_seq_len=1024)
    return ready_app(path)


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    """A model whose ChatML template has a thinking section (what an Ouro-Thinking import gets)."""
    tokenizer = train_tokenizer()
    config = preset_config("tiny-looped", tokenizer, max_seq_len=1024)
    path = write_model_file(tmp_path_factory.mktemp("agent-apis-thinker") / "think.tinyloop", config,
                            random_weights(config, 0), tokenizer.to_str(),
                            chat_template='{"name": "chatml", "thinking": true}')
    return ready_app(path)


def script_reply(monkeypatch, module, app, text, finish_reason="stop"):
    """The route in `module` gets `text`'s tokens as its generation instead of sampling (a
    random model never writes a thinking section); all that follows the engine runs as
    for sampled tokens: the reply split, the writers, the usage counts."""
    tokenizer = app.state.loaded.tokenizer
    ids = tokenizer.encode(text)

    class Scripted(Generation):
        def submit(self):                 # nothing queued: settle() has no submission to give back
            pass

        async def batches(self):
            result = SimpleNamespace(tokens=ids, prompt_tokens=len(self.request.prompt_ids), stop_token_id=None,
                                     completion_tokens=len(ids), finish_reason=finish_reason, cached_tokens=0,
                                     queue_s=0.0)
            self.outcome = Outcome(result, finish_reason, len(ids), None)
            yield [(token, tokenizer.decode([token])) for token in ids]

    monkeypatch.setattr(module, "Generation", Scripted)


def post(app, path, body, **kw):
    return run(call(app, "POST", path, body, **kw))


def typed_events(response) -> list[tuple[str, dict]]:
    """`event: name\\ndata: json` blocks -> [(name, payload)]; the name must be the payload's type."""
    out = []
    for block in response.body.decode().split("\n\n"):
        if block:
            name_line, data_line = block.split("\n")
            name, payload = name_line.removeprefix("event: "), orjson.loads(data_line.removeprefix("data: "))
            assert payload["type"] == name
            out.append((name, payload))
    return out


# ------------------------------------------------------------------------- Responses: refusals
@pytest.mark.parametrize("body, status, param, fragment", [
    ({}, 400, "input", "'input' is required"),                 # shapes too: OpenAI's API has no 422
    ({"input": 5}, 400, "input", "string or an array"),
    ({"input": [{"role": "user"}]}, 400, "input[0].content", "is required"),
    ({"input": []}, 400, "input", "at least one item"),
    ({"input": [{"type": "input_image", "image_url": "x"}]}, 400, "input[0].type", "not supported"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 400,
     "input[0].content[0].type", "only text parts"),
    ({"input": [{"role": "critic", "content": "x"}]}, 400, "input[0].role", "user, assistant"),
    ({"input": [{"role": "user", "content": "x", "colour": 1}]}, 400, "input[0].colour", "not supported"),
    ({"input": [{"type": "function_call_output", "call_id": "call_9", "output": "1"}]}, 400, "input[0].call_id",
     "does not match"),
    ({"input": [CALL]}, 400, "input", "no function_call_output answers"),
    ({"input": [{**CALL, "arguments": "{oops"}]}, 400, "input[0].arguments", "not valid JSON"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, 400, "input[0].type", "stored responses"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, 400, "tools[0].type", "only function tools"),
    ({"input": "x", "tools": [{**R_TOOL, "name": "bad name!"}]}, 400, "tools[0].name", "letters, digits"),
    ({"input": "x", "tools": [{**R_TOOL, "parameters": {"type": "object", "if": {}}}]}, 400,
     "tools[0].parameters", "'if'"),
    ({"input": "x", "tool_choice": "maybe"}, 400, "tool_choice", "none, auto, required"),
    ({"input": "x", "tool_choice": "required"}, 400, "tool_choice", "needs 'tools'"),
    ({"input": "x", "tools": [R_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
     400, "tool_choice", "exactly one other key, name"),
    ({"input": "x", "tools": [R_TOOL], "tool_choice": {"type": "allowed_tools", "tools": []}}, 400, "tool_choice",
     "'allowed_tools' is not supported"),
    ({"input": "x", "tools": [R_TOOL], "tool_choice": {"type": "function", "name": "nope"}}, 400, "tool_choice",
     "does not declare"),
    ({"input": "x", "text": {"format": {"type": "xml"}}}, 400, "text.format.type", "json_schema"),
    ({"input": "x", "text": {"format": {"type": "json_schema", "name": "s", "schema": {
        "type": "object", "dependentRequired": {}}}}}, 400, "text.format.schema", "dependentRequired"),
    ({"input": "x", "tools": [R_TOOL], "text": {"format": {"type": "json_object"}}}, 400, "text.format",
     "cannot constrain the same reply"),
    ({"input": "x", "store": True}, 400, "store", "keeps no responses"),
    ({"input": "x", "previous_response_id": "resp_1"}, 400, "previous_response_id", "send the whole conversation"),
    ({"input": "x", "truncation": "auto"}, 400, "truncation", "disabled"),
    ({"input": "x", "background": True}, 400, "background", "not supported"),
    ({"input": "x", "seed": 1}, 400, "seed", "unknown field"),
    ({"input": "x", "temperature": 3}, 400, "temperature", "[0, 2]"),
    ({"input": "x", "max_output_tokens": 0}, 400, "max_output_tokens", ">= 1"),
    ({"input": "x", "metadata": {str(i): "v" for i in range(17)}}, 400, "metadata", "at most 16"),
    ({"input": "x", "reasoning": {"effort": "huge"}}, 400, "reasoning.effort", "one of"),
    ({"input": "x", "reasoning": "high"}, 400, "reasoning", "must be an object"),
])
def test_responses_bad_inputs_are_clear_4xx(app, body, status, param, fragment):
    response = post(app, RESPONSES, {"model": "tl", **body})
    error = response.json()["error"]
    assert (response.status, error["param"]) == (status, param), error
    assert fragment in error["message"] and error["type"] == "invalid_request_error"


def test_stored_responses_are_not_kept(app):
    for method in ("GET", "DELETE"):
        response = run(call(app, method, "/v1/responses/resp_123"))
        assert response.status == 404 and "keeps no responses" in response.json()["error"]["message"]


def test_responses_an_input_that_fills_the_context_is_a_400_naming_input(app):
    response = post(app, RESPONSES, {"model": "tl", "input": "word " * 1100})
    error = response.json()["error"]
    assert response.status == 400 and error["param"] == "input" and error["code"] == "context_length_exceeded"


# ------------------------------------------------------------------------- Responses: behaviour
def test_responses_limit_is_lowered_to_the_room_left_and_reported_incomplete(tmp_path):
    path = tmp_path / "short.tinyloop"               # no end-of-sequence token: runs to its limit; 64 context
    make_test_model(path, "tiny-looped", seed=0, max_seq_len=64, eos_token_ids=())
    body = post(ready_app(path), RESPONSES, {"input": "Hi", "max_output_tokens": 5000, "temperature": 0}).json()
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["usage"]["input_tokens"] + body["usage"]["output_tokens"] == 64
    assert body["model"] == str(path) and body["max_output_tokens"] == 5000


def test_responses_reasoning_and_include_are_accepted_and_add_nothing(app):
    body = post(app, RESPONSES, {"model": "tl", "input": "Hi", "max_output_tokens": 3, "store": False,
                                 "reasoning": {"effort": "high", "summary": "auto"},
                                 "include": ["reasoning.encrypted_content"], "user": "u1"}).json()
    assert [item["type"] for item in body["output"]] == ["message"]
    assert body["reasoning"] == {"effort": "high", "summary": "auto"}
    assert body["usage"]["output_tokens_details"] == {"reasoning_tokens": 0}
    # a reasoning item handed back in the input is left out of the prompt
    replayed = post(app, RESPONSES, {"input": [{"type": "reasoning", "id": "rs_1", "summary": []}, *HI],
                                     "max_output_tokens": 1}).json()
    assert replayed["usage"]["input_tokens"] == post(app, RESPONSES, {"input": HI, "max_output_tokens": 1}).json()[
        "usage"]["input_tokens"]


def test_responses_instructions_are_a_system_turn(app):
    plain = post(app, RESPONSES, {"input": "Hi", "max_output_tokens": 1}).json()
    told = post(app, RESPONSES, {"input": "Hi", "instructions": "Answer in French.", "max_output_tokens": 1}).json()
    assert told["usage"]["input_tokens"] > plain["usage"]["input_tokens"] and told["instructions"]


def test_responses_json_formats_end_with_the_grammar(app):
    body = post(app, RESPONSES, {"input": "Hi", "max_output_tokens": 200, "temperature": 0, "text": {
        "format": {"type": "json_schema", "name": "city", "schema": SCHEMA}}}).json()
    assert body["status"] == "completed" and set(orjson.loads(body["output"][0]["content"][0]["text"])) == {"city"}
    assert body["text"]["format"]["name"] == "city"
    body = post(app, RESPONSES, {"input": "Hi", "max_output_tokens": 60, "temperature": 0,
                                 "text": {"format": {"type": "json_object"}}}).json()
    text = body["output"][0]["content"][0]["text"]
    assert text.startswith("{") and (body["status"] == "incomplete" or isinstance(orjson.loads(text), dict))


def test_responses_stream_shutdown_ends_with_response_failed(model_path):
    app = ready_app(model_path)

    async def scenario():
        task = asyncio.ensure_future(call(app, "POST", RESPONSES, {"input": "Hi", "stream": True,
                                                                   "max_output_tokens": 400}))
        await until(lambda: app.state.engine.running == 1, "the generation to start")
        await asyncio.get_running_loop().run_in_executor(None, app.state.shutdown)
        return await task
    events = typed_events(run(scenario()))
    name, last = events[-1]
    assert name == "response.failed" and last["response"]["status"] == "failed"
    error = last["response"]["error"]        # the SDK's ResponseError: code from its fixed list, ours in the message
    assert ResponseError.model_validate(error).code == "server_error"
    assert error["message"] == "the server is shutting down; the generation was stopped (shutting_down)"
    assert not any(n in ("response.completed", "response.incomplete") for n, _ in events)
    assert [e["sequence_number"] for _, e in events] == list(range(len(events)))


def test_responses_shape_errors_are_400_while_chat_completions_keep_422(app):
    """OpenAI's API answers a wrong shape with 400 (the SDK's BadRequestError); chat
    completions keep the 422 their contract documents."""
    for path in (RESPONSES, "/v1/chat/completions"):
        response = run(call(app, "POST", path, body=b"[1]"))
        error = response.json()["error"]
        assert response.status == (400 if path == RESPONSES else 422), path
        assert (error["type"], error["code"]) == ("invalid_request_error", "invalid_type")
    assert post(app, "/v1/chat/completions", {"messages": 5}).status == 422


def test_responses_named_tool_choice_calls_that_function(app):
    other = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "string", "maxLength": 8}}, "required": ["zone"]}}
    for name, schema in (("get_time", other["parameters"]), ("get_weather", SCHEMA)):
        body = post(app, RESPONSES, {"input": "Hi", "tools": [other, R_TOOL], "temperature": 0,
                                     "tool_choice": {"type": "function", "name": name},
                                     "parallel_tool_calls": False, "max_output_tokens": 200}).json()
        call_item, = body["output"]
        assert (call_item["type"], call_item["name"], body["status"]) == ("function_call", name, "completed")
        assert set(orjson.loads(call_item["arguments"])) == set(schema["required"])
        assert body["tool_choice"] == {"type": "function", "name": name}


def test_responses_queue_full_is_429_and_draining_503(model_path):
    app = ready_app(model_path, max_waiting=0)

    async def scenario():
        first = asyncio.ensure_future(call(app, "POST", "/generate", {"prompt": "Hi", "max_tokens": 300, "loops": 8}))
        await until(lambda: app.state.engine.running == 1, "the first generation to start")
        busy = await call(app, "POST", RESPONSES, {"input": "Hi", "max_output_tokens": 2})
        assert busy.status == 429 and busy.headers["retry-after"] == "1"
        assert (busy.json()["error"]["type"], busy.json()["error"]["code"]) == ("rate_limit_error", "queue_full")
        await first
    run(scenario())
    app.state.drain()
    draining = post(app, RESPONSES, {"input": "Hi", "max_output_tokens": 2})
    assert draining.status == 503 and draining.json()["error"]["code"] == "draining"
    app.state.shutdown()


def test_a_responses_stream_whose_client_leaves_is_cancelled(model_path):
    app = ready_app(model_path)

    async def scenario():                 # one event loop: the engine thread posts to it until cancelled
        response = await call(app, "POST", RESPONSES, {"input": "Hi", "max_output_tokens": 400, "stream": True},
                              disconnect_after_sends=3)
        await until(lambda: app.state.engine.running == 0, "the generation to stop")
        return response
    assert run(scenario()).status == 200
    assert app.state.metrics.settled["cancelled"] == 1 and app.state.metrics.disconnects == 1


def test_responses_replies_and_events_are_the_sdks_types(app):
    """Every reply and streamed event validates as the installed openai SDK's own types
    (usage.input_tokens_details.cache_write_tokens is required there); completed_at is
    set once the response is completed, and only then."""
    schema = {"format": {"type": "json_schema", "name": "city", "schema": SCHEMA}}
    done = post(app, RESPONSES, {"input": "Hi", "max_output_tokens": 200, "temperature": 0, "text": schema}).json()
    reply = Response.model_validate(done)
    assert reply.status == "completed" and reply.completed_at >= reply.created_at
    assert reply.usage.input_tokens_details.cache_write_tokens == 0
    cut = Response.model_validate(post(app, RESPONSES, {"input": "Hi", "max_output_tokens": 2}).json())
    assert cut.status == "incomplete" and cut.completed_at is None
    events = TypeAdapter(ResponseStreamEvent)
    for body in ({"input": "Hi", "max_output_tokens": 3}, {"input": "Hi", "max_output_tokens": 200, "text": schema}):
        streamed = [events.validate_python(e) for _, e in typed_events(post(app, RESPONSES, {**body, "stream": True}))]
        assert streamed[0].response.completed_at is None
        assert (streamed[-1].response.completed_at is None) == (streamed[-1].type == "response.incomplete")


# ------------------------------------------------------------------------- Responses: a thinking template
def test_responses_reasoning_tokens_count_the_thinking_sections_tokens(thinker, monkeypatch):
    script_reply(monkeypatch, responses_api, thinker, "<think>plan it</think>The answer")
    # the tokenizer splits ">The" into ">", "The": the section is exactly these tokens
    section = len(thinker.state.loaded.tokenizer.encode("<think>plan it</think>"))
    body = post(thinker, RESPONSES, {"input": "Hi"}).json()
    assert [(item["type"], item["status"]) for item in body["output"]] == [("reasoning", "completed"),
                                                                          ("message", "completed")]
    usage = body["usage"]
    assert usage["output_tokens_details"]["reasoning_tokens"] == section
    assert usage["output_tokens"] == len(thinker.state.loaded.tokenizer.encode("<think>plan it</think>The answer"))
    streamed = typed_events(post(thinker, RESPONSES, {"input": "Hi", "stream": True}))
    assert streamed[-1][1]["response"]["usage"] == usage
    script_reply(monkeypatch, responses_api, thinker, "No section here")
    assert post(thinker, RESPONSES, {"input": "Hi"}).json()["usage"]["output_tokens_details"] == {
        "reasoning_tokens": 0}


def test_responses_a_reasoning_item_cut_short_is_incomplete(thinker, monkeypatch):
    script_reply(monkeypatch, responses_api, thinker, "<think>still planning", finish_reason="length")
    body = post(thinker, RESPONSES, {"input": "Hi", "max_output_tokens": 8}).json()
    assert body["status"] == "incomplete"
    assert [(item["type"], item["status"]) for item in body["output"]] == [("reasoning", "incomplete"),
                                                                          ("message", "incomplete")]
    assert body["usage"]["output_tokens_details"]["reasoning_tokens"] == body["usage"]["output_tokens"]
    events = typed_events(post(thinker, RESPONSES, {"input": "Hi", "max_output_tokens": 8, "stream": True}))
    done = [e["item"] for name, e in events if name == "response.output_item.done"]
    assert [item["status"] for item in done] == ["incomplete", "incomplete"]
    # a section that closed before the limit is complete; the answer it cut is not
    script_reply(monkeypatch, responses_api, thinker, "<think>plan</think>The ans", finish_reason="length")
    body = post(thinker, RESPONSES, {"input": "Hi", "max_output_tokens": 8}).json()
    assert [item["status"] for item in body["output"]] == ["completed", "incomplete"]


def _closed_section_tokens(app) -> int:
    """The tokens an empty, closed thinking section adds after ChatML's assistant header."""
    tokenizer = app.state.loaded.tokenizer
    return len(tokenizer.encode("assistant\n<think>\n\n</think>\n\n")) - len(tokenizer.encode("assistant\n"))


def test_effort_none_and_thinking_disabled_close_a_thinking_section_in_the_prompt(thinker, app):
    """A thinking template's model is told not to think by a prompt whose thinking section
    is already written, empty and closed; a model without a section gets the same prompt."""
    closed = _closed_section_tokens(thinker)
    assert closed > 0

    def responses_prompt(model, **reasoning):
        body = {"input": "Hi", "max_output_tokens": 1, **({"reasoning": reasoning} if reasoning else {})}
        return post(model, RESPONSES, body).json()["usage"]["input_tokens"]

    def messages_prompt(model, **thinking):
        body = {"model": "tl", "messages": HI, **({"thinking": thinking} if thinking else {})}
        return post(model, COUNT, body).json()["input_tokens"]

    base = responses_prompt(thinker)
    assert responses_prompt(thinker, effort="none") == base + closed
    assert responses_prompt(thinker, effort="high") == responses_prompt(thinker, effort="minimal") == base
    base = messages_prompt(thinker)
    assert messages_prompt(thinker, type="disabled") == base + closed
    disabled = {"model": "tl", "messages": HI, "max_tokens": 1, "thinking": {"type": "disabled"}}
    assert post(thinker, MESSAGES, disabled).json()["usage"]["input_tokens"] == base + closed   # as counted
    assert messages_prompt(thinker, type="enabled", budget_tokens=1024) == messages_prompt(thinker, type="adaptive") \
        == base
    assert responses_prompt(app, effort="none") == responses_prompt(app)
    assert messages_prompt(app, type="disabled") == messages_prompt(app)


def test_effort_none_leaves_no_thinking_branch_in_the_grammar(thinker):
    """With the section closed in the prompt, constrained output starts with the answer."""
    request = {"input": "Hi", "max_output_tokens": 60, "temperature": 0, "reasoning": {"effort": "none"},
               "text": {"format": {"type": "json_schema", "name": "city", "schema": SCHEMA}}}
    body = post(thinker, RESPONSES, request).json()
    assert [item["type"] for item in body["output"]] == ["message"], body["output"]
    assert set(orjson.loads(body["output"][0]["content"][0]["text"])) == {"city"}


def test_messages_thinking_block_only_when_thinking_is_on_through_the_route(thinker, monkeypatch):
    script_reply(monkeypatch, messages_api, thinker, "<think>plan it</think>The answer")
    request = {"model": "tl", "max_tokens": 2048, "messages": HI}
    on = post(thinker, MESSAGES, {**request, "thinking": {"type": "enabled", "budget_tokens": 1024}}).json()
    assert on["content"] == [{"type": "thinking", "thinking": "plan it", "signature": ""},
                             {"type": "text", "text": "The answer"}]
    assert post(thinker, MESSAGES, request).json()["content"] == [{"type": "text", "text": "The answer"}]


# ------------------------------------------------------------------------- Messages: refusals
@pytest.mark.parametrize("body, fragment", [
    ({"messages": HI}, "'max_tokens' is required"),
    ({"max_tokens": 4}, "'messages' is required"),
    ({"max_tokens": 4, "messages": []}, "at least one message"),
    ({"max_tokens": 4, "messages": "Hi"}, "array of messages"),
    ({"max_tokens": 0, "messages": HI}, "'max_tokens' must be >= 1"),
    ({"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]}, "goes in 'system'"),
    ({"max_tokens": 4, "messages": HI + [{"role": "assistant", "content": "Sure"}]}, "prefill"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "'image' is not supported"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "odd": 1}]}]},
     "'messages[0].content[0].odd' is not supported"),
    ({"max_tokens": 4, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_9", "content": "1"}]}]}, "does not match"),
    ({"max_tokens": 4, "messages": HI + [{"role": "assistant", "content": [USE]},
                                         {"role": "user", "content": "and?"}]}, "has no tool_result"),
    ({"max_tokens": 4, "messages": HI, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "only client tools"),
    ({"max_tokens": 4, "messages": HI, "tools": [{"name": "f", "input_schema": {"type": "string"}}]},
     "JSON schema of type object"),
    ({"max_tokens": 4, "messages": HI, "tools": [M_TOOL], "tool_choice": {"type": "tool", "name": "nope"}},
     "does not declare"),
    ({"max_tokens": 4, "messages": HI, "tool_choice": {"type": "maybe"}}, "auto, any, tool or none"),
    ({"max_tokens": 4, "messages": HI, "thinking": {"type": "enabled", "budget_tokens": 10}}, ">= 1024"),
    ({"max_tokens": 1024, "messages": HI, "thinking": {"type": "enabled", "budget_tokens": 1024}},
     "greater than 'thinking.budget_tokens'"),
    ({"max_tokens": 4, "messages": HI, "temperature": 1.5}, "'temperature' must be in [0, 1]"),
    ({"max_tokens": 4, "messages": HI, "stop_sequences": "x"}, "array of strings"),
    ({"max_tokens": 4, "messages": HI, "colour": "red"}, "unknown field 'colour'"),
    ({"max_tokens": 4, "messages": HI, "container": "c1"}, "'container' is not supported"),
    ({"max_tokens": 4, "messages": HI, "output_config": {"format": {"type": "json_schema", "schema": {
        "type": "object", "not": {}}}}}, "'not'"),
    ({"max_tokens": 4, "messages": HI, "tools": [M_TOOL], "tool_choice": {"type": "any"},
      "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}, "cannot constrain the same reply"),
])
def test_messages_bad_inputs_are_anthropic_400s(app, body, fragment):
    response = post(app, MESSAGES, {"model": "tl", **body})
    assert response.status == 400, response.body
    assert response.json()["type"] == "error" and response.json()["error"]["type"] == "invalid_request_error"
    assert fragment in response.json()["error"]["message"]


def test_messages_auth_by_x_api_key_and_errors_in_anthropic_shape(app):
    body = {"model": "tl", "max_tokens": 2, "messages": HI}
    by_header = post(app, MESSAGES, body, key=None, headers=[(b"x-api-key", b"test-key"),
                                                              (b"anthropic-version", b"2023-06-01")])
    assert by_header.status == 200 and by_header.json()["type"] == "message"
    wrong = post(app, MESSAGES, body, key=None, headers=[(b"x-api-key", b"nope")])
    assert wrong.status == 401 and wrong.json() == {"type": "error", "error": {
        "type": "authentication_error", "message": wrong.json()["error"]["message"]}}
    assert post(app, MESSAGES, body).status == 200                                  # a bearer token alone
    for keys in ([(b"x-api-key", b"nope")], [(b"x-api-key", b"test-key")]):          # beside a right / wrong bearer
        assert post(app, MESSAGES, body, key="test-key" if keys[0][1] == b"nope" else "nope",
                    headers=keys).status == 401
    assert post(app, MESSAGES, body, headers=[(b"x-api-key", b"test-key")]).status == 200  # both right
    # x-api-key belongs to the Anthropic routes; the OpenAI routes keep bearer keys only
    elsewhere = post(app, RESPONSES, {"input": "Hi"}, key=None, headers=[(b"x-api-key", b"test-key")])
    assert elsewhere.status == 401 and elsewhere.json()["error"]["type"] == "authentication_error"
    missing = run(call(app, "POST", MESSAGES + "/batches", body))
    assert missing.status == 404 and missing.json()["error"]["type"] == "not_found_error"
    assert run(call(app, "POST", COUNT, body=b"{")).json()["error"]["type"] == "invalid_request_error"
    too_big = run(call(app, "POST", MESSAGES, body=b"x" * 70000))
    assert too_big.status == 413 and too_big.json()["error"]["type"] == "request_too_large"


def test_messages_queue_full_is_429_rate_limit_error_and_draining_503_overloaded(model_path):
    app = ready_app(model_path, max_waiting=0)

    async def scenario():
        first = asyncio.ensure_future(call(app, "POST", "/generate", {"prompt": "Hi", "max_tokens": 300, "loops": 8}))
        await until(lambda: app.state.engine.running == 1, "the first generation to start")
        busy = await call(app, "POST", MESSAGES, {"model": "tl", "max_tokens": 2, "messages": HI})
        assert busy.status == 429 and busy.headers["retry-after"] == "1"
        assert busy.json()["error"]["type"] == "rate_limit_error"
        await first
    run(scenario())
    app.state.drain()
    draining = post(app, MESSAGES, {"model": "tl", "max_tokens": 2, "messages": HI})
    assert draining.status == 503 and draining.json()["error"]["type"] == "overloaded_error"
    app.state.shutdown()


# ------------------------------------------------------------------------- Messages: behaviour
def test_messages_stop_sequence_is_named_whole_and_streamed(model_path):
    short = ready_app(model_path)
    base = {"model": "tl", "max_tokens": 24, "temperature": 0, "messages": HI}
    text = post(short, MESSAGES, base).json()["content"][0]["text"]
    stop = next(text[i:i + 2] for i in range(3, len(text) - 2) if "\ufffd" not in text[i:i + 2])
    whole = post(short, MESSAGES, {**base, "stop_sequences": ["never-said", stop]}).json()
    assert (whole["stop_reason"], whole["stop_sequence"]) == ("stop_sequence", stop)
    assert whole["content"][0]["text"] == text[:text.index(stop)]
    events = typed_events(post(short, MESSAGES, {**base, "stop_sequences": [stop], "stream": True}))
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}          # nothing else is sent (AGENT_APIS.md)
    delta = events[-2][1]["delta"]
    assert (delta["stop_reason"], delta["stop_sequence"]) == ("stop_sequence", stop)
    streamed = "".join(e["delta"]["text"] for n, e in events if n == "content_block_delta")
    assert streamed == whole["content"][0]["text"]


def test_messages_output_format_ends_the_turn_with_valid_json(app):
    body = post(app, MESSAGES, {"model": "tl", "max_tokens": 200, "temperature": 0, "messages": HI,
                                "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}}).json()
    assert body["stop_reason"] == "end_turn" and body["stop_sequence"] is None
    assert set(orjson.loads(body["content"][0]["text"])) == {"city"}


def test_messages_thinking_is_accepted_and_adds_no_thinking_block(app):
    body = post(app, MESSAGES, {"model": "tl", "max_tokens": 2000, "messages": HI, "tools": [M_TOOL],
                                "thinking": {"type": "enabled", "budget_tokens": 1024},
                                "tool_choice": {"type": "any", "disable_parallel_tool_use": True}}).json()
    assert [block["type"] for block in body["content"]] == ["tool_use"] and body["stop_reason"] == "tool_use"
    for thinking in ({"type": "adaptive"}, {"type": "disabled"}, {"type": "enabled", "budget_tokens": 2048,
                                                                  "display": "omitted"}):
        assert post(app, COUNT, {"model": "tl", "messages": HI, "thinking": thinking}).status == 200
    # thinking blocks handed back in an assistant turn are left out of the prompt
    turns = [HI[0], {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"},
                                                      {"type": "redacted_thinking", "data": "x"},
                                                      {"type": "text", "text": "Hello"}]}, HI[0]]
    plain = [HI[0], {"role": "assistant", "content": "Hello"}, HI[0]]
    assert post(app, COUNT, {"model": "tl", "messages": turns}).json() == \
        post(app, COUNT, {"model": "tl", "messages": plain}).json()


def test_messages_tool_result_takes_a_string_and_marks_is_error(app):
    """A tool_result's content may be a string (one text block); is_error starts its text
    "Error: " in the prompt."""
    def prompt_tokens(result: dict) -> int:
        turns = HI + [{"role": "assistant", "content": [USE]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", **result}]}]
        response = post(app, COUNT, {"model": "tl", "messages": turns, "tools": [M_TOOL]})
        assert response.status == 200, response.body
        return response.json()["input_tokens"]
    blocks = prompt_tokens({"content": [{"type": "text", "text": "no such city"}]})
    assert prompt_tokens({"content": "no such city"}) == prompt_tokens({"content": "no such city",
                                                                         "is_error": False}) == blocks
    assert prompt_tokens({"content": "no such city", "is_error": True}) == \
        prompt_tokens({"content": "Error: no such city"}) > blocks
    turns = HI + [{"role": "assistant", "content": [USE]}, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "no such city", "is_error": True}]}]
    reply = post(app, MESSAGES, {"model": "tl", "max_tokens": 2, "messages": turns, "tools": [M_TOOL]})
    assert reply.status == 200 and reply.json()["type"] == "message"


def test_messages_top_k_and_top_p_reach_the_sampler(app):
    """At temperature 1 the reply is sampled; top_k 1, or top_p 0, leaves only the most
    likely token, so the reply is the greedy one."""
    def text(**sampling) -> str:
        body = post(app, MESSAGES, {"model": "tl", "max_tokens": 16, "messages": HI, **sampling}).json()
        return "".join(block["text"] for block in body["content"])
    greedy = text(temperature=0)
    assert {text(temperature=1) for _ in range(3)} != {greedy}        # sampling would tell them apart
    assert text(temperature=1, top_k=1) == text(temperature=1, top_p=0) == greedy


def test_ignored_fields_are_accepted_and_change_nothing(app):
    """Fields both APIs define that have nothing to act on here: the same greedy reply,
    the same prompt, with or without them."""
    plain = {"input": "Hi", "max_output_tokens": 6, "temperature": 0}
    ignored = {"text": {"format": {"type": "text"}, "verbosity": "low"}, "service_tier": "auto", "user": "u1",
               "prompt_cache_key": "k", "safety_identifier": "s", "stream_options": {}, "include": []}
    want, got = (post(app, RESPONSES, body).json() for body in (plain, {**plain, **ignored}))
    assert got["output"][0]["content"] == want["output"][0]["content"]
    assert got["usage"]["input_tokens"] == want["usage"]["input_tokens"]
    plain = {"model": "tl", "max_tokens": 6, "temperature": 0, "messages": HI}
    ignored = {"output_config": {"effort": "low"}, "metadata": {"user_id": "u1"}, "service_tier": "standard_only",
               "cache_control": {"type": "ephemeral"}}
    want, got = (post(app, MESSAGES, body).json() for body in (plain, {**plain, **ignored}))
    assert (got["content"], got["usage"]) == (want["content"], want["usage"])


def test_count_tokens_follows_tool_choice_none_like_the_prompt(app):
    request = {"model": "tl", "messages": HI, "system": "Be terse.", "tools": [M_TOOL], "tool_choice": {"type": "none"}}
    counted = post(app, COUNT, request).json()["input_tokens"]
    used = post(app, MESSAGES, {**request, "max_tokens": 1}).json()["usage"]["input_tokens"]
    assert counted == used == post(app, COUNT, {"model": "tl", "messages": HI, "system": "Be terse."}).json()[
        "input_tokens"]


def test_a_messages_stream_whose_client_leaves_is_cancelled(model_path):
    app = ready_app(model_path)

    async def scenario():                 # one event loop: the engine thread posts to it until cancelled
        response = await call(app, "POST", MESSAGES, {"model": "tl", "max_tokens": 400, "messages": HI,
                                                      "stream": True}, disconnect_after_sends=3)
        await until(lambda: app.state.engine.running == 0, "the generation to stop")
        return response
    assert run(scenario()).status == 200
    assert app.state.metrics.settled["cancelled"] == 1 and app.state.metrics.disconnects == 1


def test_a_messages_stream_that_fails_ends_with_an_error_event(model_path):
    app = ready_app(model_path)

    async def scenario():
        task = asyncio.ensure_future(call(app, "POST", MESSAGES, {"model": "tl", "max_tokens": 400, "messages": HI,
                                                                  "stream": True}))
        await until(lambda: app.state.engine.running == 1, "the generation to start")
        await asyncio.get_running_loop().run_in_executor(None, app.state.shutdown)
        return await task
    events = typed_events(run(scenario()))
    assert events[-1] == ("error", {"type": "error", "error": {"type": "overloaded_error", "message": (
        "the server is shutting down; the generation was stopped")}})
    assert "message_stop" not in [name for name, _ in events]


# ------------------------------------------------------------------------- a thinking template
def _thinking_reply(writer, text="<think>plan it</think>The answer"):
    """Feed one reply of a thinking template through an API's writer; its events."""
    from types import SimpleNamespace

    from asgi.reply import Reply
    reply = Reply(("<think>", "</think>"), [])
    outcome = SimpleNamespace(finish_reason="stop", completion_tokens=9,
                              result=SimpleNamespace(prompt_tokens=4, cached_tokens=0))
    events = writer.feed(reply.feed(text))
    events += writer.feed(reply.finish()[0])
    return events + (writer.finish([], outcome, None) if hasattr(writer, "message") else writer.finish([], outcome))


def test_a_thinking_templates_section_is_a_thinking_block_only_when_thinking_is_on():
    """A model whose chat template has a thinking section gets its section back as an
    (unsigned) thinking block when the request turns thinking on."""
    from asgi.messages_stream import MessageEvents
    on = MessageEvents("m", 4, thinking=True)
    events = _thinking_reply(on)
    assert [block["type"] for block in on.message["content"]] == ["thinking", "text"]
    assert on.message["content"][0] == {"type": "thinking", "thinking": "plan it", "signature": ""}
    assert {"type": "thinking_delta", "thinking": "plan it"} in [e.get("delta") for e in events]
    off = MessageEvents("m", 4, thinking=False)
    _thinking_reply(off)
    assert off.message["content"] == [{"type": "text", "text": "The answer"}]


def test_a_thinking_templates_section_is_a_reasoning_item_in_a_response():
    from asgi.responses_stream import ResponseEvents
    writer = ResponseEvents({"status": "in_progress", "output": []})
    events = _thinking_reply(writer)
    reasoning, message = writer.response["output"]
    assert reasoning["type"] == "reasoning" and reasoning["content"] == [{"type": "reasoning_text", "text": "plan it"}]
    assert message["content"][0]["text"] == "The answer" and writer.response["status"] == "completed"
    assert [e["type"] for e in events if "reasoning_text" in e["type"]] == ["response.reasoning_text.delta",
                                                                            "response.reasoning_text.done"]


def test_every_test_named_in_agent_apis_md_exists():
    """tests/AGENT_APIS.md names test nodes as A::, E::, F::, P::; each must exist."""
    import re
    from pathlib import Path
    tests_dir = Path(__file__).resolve().parent
    files = {"A": "test_responses_messages_asgi.py", "E": "test_responses_messages_e2e.py", "F": "test_fuzz_api.py",
             "P": "test_protocol_abuse.py"}
    nodes = re.findall(r"`([AEFP])::(test_\w+)`", (tests_dir / "AGENT_APIS.md").read_text())
    assert len(nodes) > 30
    for letter, name in nodes:
        assert re.search(rf"^def {name}\(", (tests_dir / files[letter]).read_text(), re.M), f"{letter}::{name}"
