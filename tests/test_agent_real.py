"""The default real model (SmolLM2-135M-Instruct) behind Granian, through the openai SDK:
json_schema output valid for 50 random schemas, and a tool round trip. Slow (pulls the
model on first use; a few minutes on 2 CPU cores): python -m pytest -m slow tests/test_agent_real.py"""
import json

import jsonschema
import numpy as np
import openai
import pytest
from test_agent_e2e import ASK, WEATHER
from test_constrained import random_schema
from test_server_e2e import KEY, server  # noqa: F401

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_path():
    from tinyloop.convert.pull import ensure_default_model
    return ensure_default_model()


@pytest.fixture(scope="module")
def client(server):  # noqa: F811
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=300)


def test_fifty_random_schemas_validate(client):
    rng = np.random.default_rng(2024)
    finished = 0
    for case in range(50):
        schema = {"type": "object", "properties": {"item": random_schema(rng), "note": random_schema(rng)},
                  "required": ["item", "note"]}
        reply = client.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": f"Describe item {case} as JSON."}], max_tokens=256,
            temperature=0 if case % 2 else 0.8, seed=case,
            response_format={"type": "json_schema", "json_schema": {"name": "item", "schema": schema}})
        print(f"schema {case}: {reply.usage.completion_tokens} tokens, {reply.choices[0].finish_reason}", flush=True)
        if reply.choices[0].finish_reason == "stop":
            finished += 1
            jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
    assert finished >= 45, f"{finished} of 50 finished within 256 tokens"


def test_tool_round_trip_on_the_default_model(client):
    first = client.chat.completions.create(model="smol", messages=ASK, tools=[WEATHER], max_tokens=100,
                                           temperature=0, tool_choice="required")
    call = first.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    history = ASK + [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 21, "sky": "clear"}'}]
    second = client.chat.completions.create(model="smol", messages=history, tools=[WEATHER], max_tokens=60,
                                            temperature=0)
    assert second.choices[0].message.content
