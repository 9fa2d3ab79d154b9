"""Agent features through the real `openai` SDK against a real Granian process: tool
calls (round trip, streamed assembly, tool_choice, parallel_tool_calls), structured
output, logprobs, and the bad-input table. The default suite serves a tiny random
model (grammar-constrained output is valid whatever the weights); `-m slow` adds the
default real model: 50 random schemas, and a tool round trip.
"""
import json

import jsonschema
import numpy as np
import openai
import pytest
from test_constrained import random_schema
from test_server_e2e import KEY, server  # noqa: F401  (the Granian fixture, fed by model_path below)

from tinyloop.model.testmodels import make_test_model

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 99}, "b": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["a", "b"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("agent") / "tiny.tinyloop"
    make_test_model(path, "tiny-looped", seed=0, max_seq_len=2048)   # room for the tool declarations
    return path


@pytest.fixture(scope="module")
def newline_bias(model_path):
    """logit_bias that makes the model continue after a call (a newline opens the next one)."""
    from tinyloop.model.modelfile import ModelFile
    from tinyloop.text.tokenizer import Tokenizer
    newline, = Tokenizer(ModelFile(model_path).tokenizer_json).encode("\n")
    return {str(newline): 100}


@pytest.fixture(scope="module")
def client(server):  # noqa: F811
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=120)


def check_calls(calls, tools):
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


def test_tool_round_trip(client):
    first = client.chat.completions.create(model="tl", messages=ASK, tools=[WEATHER], tool_choice="required",
                                           max_tokens=200, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    check_calls(choice.message.tool_calls, [WEATHER])
    call = choice.message.tool_calls[0]
    history = ASK + [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21}'}]
    second = client.chat.completions.create(model="tl", messages=history, tools=[WEATHER], tool_choice="none",
                                            max_tokens=12, temperature=0)
    assert second.choices[0].message.tool_calls is None and isinstance(second.choices[0].message.content, str)


def test_streamed_tool_calls_assemble_like_the_buffered_reply(client, newline_bias):
    kwargs = dict(model="tl", messages=ASK, tools=[WEATHER, ADD], tool_choice="required", max_tokens=150,
                  temperature=0, logit_bias=newline_bias)        # calls until max_tokens cuts the last one
    buffered = client.chat.completions.create(**kwargs).choices[0]
    assert len(buffered.message.tool_calls) >= 2 and buffered.finish_reason == "length"
    check_calls(buffered.message.tool_calls, [WEATHER, ADD])
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    calls, finish = {}, None
    for chunk in chunks:
        delta = chunk.choices[0].delta
        for part in delta.tool_calls or []:
            assert part.index not in calls and part.function.arguments       # each call whole, in one chunk
            calls[part.index] = part
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "length" and [calls[i].function.name for i in sorted(calls)] == \
        [c.function.name for c in buffered.message.tool_calls]
    assert [calls[i].function.arguments for i in sorted(calls)] == \
        [c.function.arguments for c in buffered.message.tool_calls]


def test_tool_choice_named_none_and_parallel_false(client, newline_bias):
    named = client.chat.completions.create(model="tl", messages=ASK, tools=[WEATHER, ADD], max_tokens=200,
                                           tool_choice={"type": "function", "function": {"name": "add"}})
    assert {c.function.name for c in named.choices[0].message.tool_calls} == {"add"}
    check_calls(named.choices[0].message.tool_calls, [ADD])
    none = client.chat.completions.create(model="tl", messages=ASK, tools=[WEATHER], tool_choice="none",
                                          max_tokens=8)
    assert none.choices[0].message.tool_calls is None and none.choices[0].finish_reason in ("stop", "length")
    for seed in range(3):
        single = client.chat.completions.create(model="tl", messages=ASK, tools=[ADD], tool_choice="required",
                                                parallel_tool_calls=False, max_tokens=200, temperature=1.0,
                                                seed=seed, logit_bias=newline_bias)   # would call again if it could
        assert len(single.choices[0].message.tool_calls) == 1 and single.choices[0].finish_reason == "tool_calls"


def test_json_schema_output_validates(client):
    rng = np.random.default_rng(21)
    for _ in range(5):
        schema = {"type": "object", "properties": {"a": random_schema(rng)}, "required": ["a"]}
        reply = client.chat.completions.create(
            model="tl", messages=ASK, max_tokens=300, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
        if reply.choices[0].finish_reason == "stop":
            jsonschema.validate(json.loads(reply.choices[0].message.content), schema)


def test_logprobs_buffered_and_streamed(client):
    reply = client.chat.completions.create(model="tl", messages=ASK, max_tokens=6, temperature=0.7, seed=4,
                                           logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens or reply.choices[0].finish_reason == "stop"
    for item in content:
        assert item.logprob <= 0 and len(item.top_logprobs) == 3
        assert sum(np.exp(t.logprob) for t in item.top_logprobs) <= 1 + 1e-9
        if item.logprob >= item.top_logprobs[-1].logprob:
            assert item.token in [t.token for t in item.top_logprobs]
    streamed = [c for c in client.chat.completions.create(model="tl", messages=ASK, max_tokens=6, temperature=0.7,
                                                          seed=4, logprobs=True, top_logprobs=3, stream=True)]
    tokens = [item.token for c in streamed if c.choices and c.choices[0].logprobs
              for item in c.choices[0].logprobs.content]
    assert tokens == [item.token for item in content]
    completion = client.completions.create(model="tl", prompt="hello", max_tokens=4, logprobs=2)
    logprobs = completion.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs)


@pytest.mark.parametrize("extra, fragment", [
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "letters, digits"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                                "if": {}}}}]},
     "unsupported JSON schema keyword 'if'"),
    ({"messages": ASK + [{"role": "tool", "tool_call_id": "call_x", "content": "1"}]}, "does not match"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {
        "type": "object", "dependentRequired": {}}}}}, "dependentRequired"),
])
def test_bad_input_is_a_clear_400(client, extra, fragment):
    body = {"model": "tl", "messages": ASK, "max_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**body)
    assert fragment in info.value.response.json()["error"]["message"]


def test_tool_choice_auto_gives_text_or_valid_calls_streamed_alike(client):
    kinds = set()
    for seed in range(4):
        kwargs = dict(model="tl", messages=ASK, tools=[WEATHER, ADD], max_tokens=48, temperature=1.0, seed=seed,
                      logit_bias={"30": 6} if seed % 2 else None)          # nudges toward "<" (a call's start)
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        message = client.chat.completions.create(**kwargs).choices[0].message
        if message.tool_calls:
            kinds.add("calls")
            check_calls(message.tool_calls, [WEATHER, ADD])
        else:
            kinds.add("text")
            assert "<tool_call>" not in message.content
        content, calls = "", {}
        for chunk in client.chat.completions.create(stream=True, **kwargs):
            delta = chunk.choices[0].delta if chunk.choices else None
            content += (delta.content or "") if delta else ""
            for part in (delta.tool_calls or []) if delta else []:
                calls[part.index] = (part.function.name, part.function.arguments)
        assert (content or None) == message.content
        assert [calls[i] for i in sorted(calls)] == [(c.function.name, c.function.arguments)
                                                    for c in message.tool_calls or []]
