"""The Responses API (POST /v1/responses) through the real `openai` SDK and the Messages
API (POST /v1/messages, /v1/messages/count_tokens) through the real `anthropic` SDK,
against a real Granian process serving a tiny random model. Grammar-constrained output
(tool arguments, json_schema) is valid whatever the weights; greedy replies are compared
streamed against whole."""
import json

import anthropic
import httpx
import jsonschema
import openai
import pytest
from test_server_e2e import KEY, auth, server  # noqa: F401  (the Granian fixture, fed by model_path below)

from tinyloop.model.testmodels import make_test_model

WEATHER_SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"]}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "description": "Current weather for a city",
                  "parameters": WEATHER_SCHEMA}
MESSAGES_TOOL = {"name": "get_weather", "description": "Current weather for a city", "input_schema": WEATHER_SCHEMA}
ASK = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("agent-apis") / "tiny.tinyloop"
    make_test_model(path, "tiny-looped", seed=0, max_seq_len=2048)   # room for the tool declarations
    return path


@pytest.fixture(scope="module")
def openai_client(server):  # noqa: F811
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def claude(server):  # noqa: F811
    return anthropic.Anthropic(base_url=server, api_key=KEY, max_retries=0, timeout=120)


# ------------------------------------------------------------------------------- Responses
def test_responses_create_and_stream_agree(openai_client):
    kwargs = dict(model="tl", input="Hello", instructions="Be brief.", max_output_tokens=8, temperature=0,
                  metadata={"run": "1"})
    whole = openai_client.responses.create(**kwargs)
    assert whole.object == "response" and whole.id.startswith("resp_") and whole.metadata == {"run": "1"}
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.output[0].type == "message" and whole.output[0].content[0].type == "output_text"
    assert whole.usage.output_tokens == 8 and whole.usage.input_tokens_details.cached_tokens == 0
    assert whole.usage.total_tokens == whole.usage.input_tokens + 8 and whole.store is False
    with openai_client.responses.stream(**kwargs) as stream:          # the SDK checks each event against the last
        seen = list(stream)
    deltas = [event.delta for event in seen if event.type == "response.output_text.delta"]
    final = seen[-1].response            # get_final_response() is for response.completed only (SDK)
    assert "".join(deltas) == final.output_text == whole.output_text and final.status == "incomplete"
    events = list(openai_client.responses.create(stream=True, **kwargs))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert events[-1].response.usage.input_tokens == whole.usage.input_tokens


def test_responses_tool_round_trip_with_function_call_output(openai_client):
    first = openai_client.responses.create(model="tl", input=ASK, tools=[RESPONSES_TOOL], tool_choice="required",
                                           parallel_tool_calls=False, max_output_tokens=200, temperature=0)
    assert first.status == "completed" and [item.type for item in first.output] == ["function_call"]
    call = first.output[0]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)
    history = [{"role": "user", "content": ASK}, *first.output,
               {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": 21}'}]
    second = openai_client.responses.create(model="tl", input=history, tools=[RESPONSES_TOOL], tool_choice="none",
                                            max_output_tokens=6, temperature=0)
    assert [item.type for item in second.output] == ["message"] and isinstance(second.output_text, str)
    bare = openai_client.responses.create(model="tl", input=ASK, max_output_tokens=1)
    assert second.usage.input_tokens > bare.usage.input_tokens + 10    # the call and its output are in the prompt


def test_responses_streamed_tool_call_arrives_whole(openai_client):
    with openai_client.responses.stream(model="tl", input=ASK, tools=[RESPONSES_TOOL], tool_choice="required",
                                        parallel_tool_calls=False, max_output_tokens=200, temperature=0) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds.count("response.function_call_arguments.delta") == 1 and kinds[-1] == "response.completed"
    call, = final.output
    jsonschema.validate(json.loads(call.arguments), WEATHER_SCHEMA)


def test_responses_json_schema_output_validates(openai_client):
    schema = {"type": "object", "properties": {"answer": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["answer"]}
    reply = openai_client.responses.create(model="tl", input=ASK, max_output_tokens=40, temperature=0,
                                           text={"format": {"type": "json_schema", "name": "s", "schema": schema}})
    assert reply.status == "completed"
    jsonschema.validate(json.loads(reply.output_text), schema)


def test_responses_refusals_are_sdk_errors(openai_client):
    with pytest.raises(openai.BadRequestError) as info:
        openai_client.responses.create(model="tl", input="Hi", previous_response_id="resp_1")
    assert "send the whole conversation" in info.value.message
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=openai_client.base_url, api_key="wrong", max_retries=0).responses.create(
            model="tl", input="Hi")
    with pytest.raises(openai.BadRequestError) as info:     # a wrong shape is a 400, as OpenAI's API answers
        openai_client.responses.create(model="tl", input=5)
    assert info.value.code == "invalid_type" and info.value.param == "input"


def test_responses_output_fed_back_as_input_is_accepted(openai_client):
    """An agent sends the whole previous output back as it got it from the SDK: message
    items whose output_text carries annotations and logprobs, their id and status."""
    first = openai_client.responses.create(model="tl", input="Hello", max_output_tokens=4, temperature=0)
    message, = first.output
    sent = message.model_dump(exclude_unset=True, mode="json")     # as the SDK serializes an item
    assert set(sent) >= {"id", "status", "role", "content"}
    assert set(sent["content"][0]) >= {"type", "text", "annotations", "logprobs"}
    history = [{"role": "user", "content": "Hello"}, *first.output, {"role": "user", "content": "And then?"}]
    second = openai_client.responses.create(model="tl", input=history, max_output_tokens=2, temperature=0)
    assert second.status == "incomplete" and second.output[0].type == "message"
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


# -------------------------------------------------------------------------------- Messages
def test_messages_create_and_stream_agree(claude):
    kwargs = dict(model="tl", max_tokens=8, extra_body={"temperature": 0}, system="Be brief.",
                  messages=[{"role": "user", "content": "Hello"}])
    whole = claude.messages.create(**kwargs)
    assert whole.type == "message" and whole.role == "assistant" and whole.id.startswith("msg_")
    assert whole.stop_reason == "max_tokens" and whole.usage.output_tokens == 8
    assert [block.type for block in whole.content] == ["text"]
    with claude.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == whole.content[0].text
    assert final.stop_reason == "max_tokens" and final.usage.input_tokens == whole.usage.input_tokens


def test_messages_tool_use_and_tool_result_round_trip(claude):
    ask = [{"role": "user", "content": ASK}]
    greedy = {"temperature": 0}           # this SDK's create() no longer lists temperature; the API takes it
    first = claude.messages.create(model="tl", max_tokens=200, extra_body=greedy, messages=ask, tools=[MESSAGES_TOOL],
                                   tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert first.stop_reason == "tool_use" and [b.type for b in first.content] == ["tool_use"]
    use = first.content[0]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, WEATHER_SCHEMA)
    history = ask + [{"role": "assistant", "content": first.content},
                     {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                   "content": [{"type": "text", "text": "21 C"}]}]}]
    second = claude.messages.create(model="tl", max_tokens=6, extra_body=greedy, messages=history,
                                    tools=[MESSAGES_TOOL], tool_choice={"type": "none"})
    assert second.stop_reason == "max_tokens" and [b.type for b in second.content] == ["text"]
    with claude.messages.stream(model="tl", max_tokens=200, extra_body=greedy, messages=ask, tools=[MESSAGES_TOOL],
                                tool_choice={"type": "tool", "name": "get_weather",
                                             "disable_parallel_tool_use": True}) as stream:
        streamed = stream.get_final_message()                 # the SDK assembles input_json_delta
    assert streamed.stop_reason == "tool_use" and streamed.content[0].input == use.input


def test_count_tokens_equals_usage_input_tokens(claude):
    request = dict(model="tl", system=[{"type": "text", "text": "You are terse."}], tools=[MESSAGES_TOOL],
                   messages=[{"role": "user", "content": ASK}])
    counted = claude.messages.count_tokens(**request).input_tokens
    used = claude.messages.create(max_tokens=2, **request).usage
    # Anthropic's accounting: the prompt is input_tokens after the prefix the cache served
    assert counted == used.input_tokens + used.cache_read_input_tokens > 100       # the tool declarations count
    fresh = dict(request, system=[{"type": "text", "text": "Never seen before: " + "z" * 300}])
    used = claude.messages.create(max_tokens=2, **fresh).usage
    assert used.cache_read_input_tokens == 0 and used.input_tokens == claude.messages.count_tokens(**fresh).input_tokens
    again = claude.messages.create(max_tokens=2, **fresh).usage         # its blocks are cached now
    assert again.cache_read_input_tokens >= 64 and again.input_tokens + again.cache_read_input_tokens == \
        used.input_tokens
    bare = claude.messages.count_tokens(model="tl", messages=request["messages"]).input_tokens
    assert bare < counted


def test_messages_errors_are_anthropic_sdk_errors(claude, server):  # noqa: F811
    wrong = anthropic.Anthropic(base_url=server, api_key="wrong-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        wrong.messages.create(model="tl", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert info.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model="tl", max_tokens=4, messages=[{"role": "user", "content": "Hi"}],
                               extra_body={"temperature": 1.5})
    assert info.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                          "message": "'temperature' must be in [0, 1], got 1.5"}}
    with pytest.raises(anthropic.BadRequestError):            # a shape error is a 400 too, as Anthropic's API
        claude.messages.create(model="tl", max_tokens=4, messages="Hi")
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.batches.list()


def test_metrics_count_the_new_routes(server, openai_client, claude):  # noqa: F811
    openai_client.responses.create(model="tl", input="Hi", max_output_tokens=1)
    claude.messages.count_tokens(model="tl", messages=[{"role": "user", "content": "Hi"}])
    text = httpx.get(f"{server}/metrics", headers=auth()).text
    for route in ("/v1/responses", "/v1/messages", "/v1/messages/count_tokens"):
        assert f'tinyloop_requests_total{{route="{route}",status="200"}}' in text, route
