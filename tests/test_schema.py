"""Request validation against the field tables (asgi/fields.py, the API documents): an
explicit null means the default, limits are inclusive, wrong types are 422, values out
of range 400, and the stop, message and prompt shapes the README promises."""
import pytest

from asgi.errors import ApiError
from asgi.fields import CHAT, COMPLETION, ELSEWHERE, NATIVE, NATIVE_TREE, OPENAI_UNSUPPORTED
from asgi.fields import LMSTUDIO_EXTRAS as EXTRAS
from asgi.schema import validate

USER = [{"role": "user", "content": "hi"}]
API_V0 = {**CHAT, **EXTRAS}


def chat(**fields):
    return validate({"model": "m", "messages": USER, **fields}, CHAT, OPENAI_UNSUPPORTED, ELSEWHERE)


def refused(call, *args, **kwargs) -> ApiError:
    with pytest.raises(ApiError) as info:
        call(*args, **kwargs)
    return info.value


# ------------------------------------------------------------------ defaults and null
V1_DEFAULTS = {"max_tokens": None, "max_completion_tokens": None, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
               "n": 1, "stop": None, "stream": False, "stream_options": None, "seed": None,
               "presence_penalty": 0.0, "frequency_penalty": 0.0, "loops": None, "user": None}
NATIVE_DEFAULTS = {"max_tokens": None, "loops": None, "temperature": 0.0, "top_k": 50, "top_p": 0.9,
                   "repetition_penalty": 1.0, "sample_seed": 0, "stream": False, "stop": None, "cache_window": 0}
V0_DEFAULTS = {"mode": "generate", "draft_loops": 2, "verify_loops": 8, "draft_ahead": 4, "K_branches": 1,
               "cache_window": 0, "repetition_penalty": 1.0}


def test_v1_defaults_have_no_hidden_top_k():
    values = chat()
    assert {k: values[k] for k in V1_DEFAULTS} == V1_DEFAULTS


def test_native_defaults_are_the_documents():
    values = validate({"prompt": "x"}, NATIVE)
    assert {k: values[k] for k in NATIVE_DEFAULTS} == NATIVE_DEFAULTS
    assert validate({"prompt": "x"}, NATIVE_TREE)["K_branches"] == 1


def test_api_v0_extension_defaults():
    values = validate({"model": "m", "messages": USER}, API_V0)
    assert {k: values[k] for k in V0_DEFAULTS} == V0_DEFAULTS


def test_explicit_null_means_the_default():
    assert chat(**{k: None for k in V1_DEFAULTS}) == chat()
    assert validate({"prompt": "x", **{k: None for k in NATIVE_DEFAULTS}}, NATIVE) == validate({"prompt": "x"}, NATIVE)
    values = validate({"model": "m", "messages": USER, **{k: None for k in V0_DEFAULTS}}, API_V0)
    assert {k: values[k] for k in V0_DEFAULTS} == V0_DEFAULTS


@pytest.mark.parametrize("table, body, name", [(CHAT, {"messages": USER}, "model"),
                                               (CHAT, {"model": "m"}, "messages"),
                                               (CHAT, {"model": "m", "messages": None}, "messages"),
                                               (COMPLETION, {"model": "m"}, "prompt"),
                                               (NATIVE, {}, "prompt")])
def test_missing_required_fields_are_422(table, body, name):
    error = refused(validate, body, table)
    assert (error.status, error.param, error.code) == (422, name, "missing_field")


# ------------------------------------------------------------------ ranges, inclusive
@pytest.mark.parametrize("name, lowest, highest, below, above", [
    ("max_tokens", 1, 8192, 0, 8193), ("max_completion_tokens", 1, 8192, 0, 8193),
    ("temperature", 0.0, 2.0, -0.001, 2.001), ("top_p", 0.0, 1.0, -0.01, 1.01), ("top_k", 0, 1000, -1, 1001),
    ("presence_penalty", -2.0, 2.0, -2.01, 2.01), ("frequency_penalty", -2, 2, -3, 3), ("loops", 1, 64, 0, 65),
    ("n", 1, 1, 0, 2), ("seed", -(2 ** 63), 2 ** 64 - 1, -(2 ** 63) - 1, 2 ** 64),
])
def test_v1_limits_are_inclusive(name, lowest, highest, below, above):
    assert chat(**{name: lowest})[name] == lowest
    assert chat(**{name: highest})[name] == highest
    for value in (below, above):
        error = refused(chat, **{name: value})
        assert (error.status, error.param, error.code) == (400, name, "invalid_value"), value


@pytest.mark.parametrize("name, lowest, highest, below, above", [
    ("draft_loops", 1, 32, 0, 33), ("verify_loops", 1, 64, 0, 65), ("repetition_penalty", 0.5, 2.0, 0.49, 2.01),
    ("cache_window", 0, 10 ** 9, -1, None),
])
def test_api_v0_limits_are_inclusive(name, lowest, highest, below, above):
    body = {"model": "m", "messages": USER}
    assert validate({**body, name: lowest}, API_V0)[name] == lowest
    assert validate({**body, name: highest}, API_V0)[name] == highest
    for value in (below, above):
        if value is not None:
            assert refused(validate, {**body, name: value}, API_V0).status == 400


def test_mode_must_be_one_of_the_three():
    body = {"model": "m", "messages": USER}
    for mode in ("generate", "speculative", "tree_speculative"):
        assert validate({**body, "mode": mode}, API_V0)["mode"] == mode
    error = refused(validate, {**body, "mode": "tree"}, API_V0)
    assert error.status == 400 and "generate, speculative, tree_speculative" in error.message


@pytest.mark.parametrize("name, value, kind", [
    ("max_tokens", 1.5, "integer"), ("max_tokens", True, "integer"), ("max_tokens", "8", "integer"),
    ("temperature", "1", "number"), ("temperature", False, "number"), ("temperature", float("nan"), "number"),
    ("temperature", float("inf"), "number"), ("stream", 1, "true or false"), ("model", 3, "string"),
    ("user", [], "string"), ("seed", 1.0, "integer"),
])
def test_wrong_types_are_422(name, value, kind):
    error = refused(chat, **{name: value})
    assert (error.status, error.param, error.code) == (422, name, "invalid_type") and kind in error.message


@pytest.mark.parametrize("value, described", [(None, "null"), (True, "boolean"), (3, "integer"), (1.5, "number"),
                                              ("x", "string"), ([1], "array"), ({"a": 1}, "object")])
def test_type_errors_name_the_json_type_sent(value, described):
    field = "stream" if value is not True else "model"
    body = {"model": "m", "messages": USER, field: value}
    if value is None:
        error = refused(validate, {"model": "m", "messages": None}, CHAT)
        assert error.message == "'messages' is required"
        error = refused(chat, messages=[{"role": None, "content": "x"}])
    else:
        error = refused(validate, body, CHAT)
    assert error.message.endswith(f"got {described}"), error.message


def test_an_integral_float_where_an_integer_belongs_is_a_type_error():
    for value in (4096.0, 200.0, 1.0):
        error = refused(chat, max_tokens=value)
        assert (error.status, error.code) == (422, "invalid_type"), value
    at_the_limit = refused(chat, max_tokens=2.0 ** 53)                 # the first float JSON cannot hold exactly
    assert at_the_limit.status == 400 and "far out of range" in at_the_limit.message
    assert refused(chat, max_tokens=2.0 ** 53 - 2).status == 422
    huge = refused(validate, {"model": "m", "messages": USER, "cache_window": 1e300}, API_V0)
    assert huge.status == 400 and huge.message == "'cache_window' is far out of range: 1e+300"


def test_an_integer_too_big_for_json_is_400_not_422():
    error = refused(chat, max_tokens=1e300)
    assert error.status == 400 and "far out of range" in error.message and "[1, 8192]" in error.message


def test_integral_floats_are_numbers():
    assert chat(temperature=1)["temperature"] == 1


# ------------------------------------------------------------------ stop strings
def test_a_single_stop_string_becomes_a_list():
    assert chat(stop="END")["stop"] == ["END"]


def test_up_to_16_stop_strings_of_up_to_512_characters():
    stops = [f"stop{i}" for i in range(16)]
    assert chat(stop=stops)["stop"] == stops
    error = refused(chat, stop=stops + ["x"])
    assert error.status == 400 and "at most 16" in error.message
    assert chat(stop=["a" * 512])["stop"] == ["a" * 512]
    assert chat(stop=["x", "\n"])["stop"] == ["x", "\n"]                    # one character is enough
    assert chat(stop="a" * 512)["stop"] == ["a" * 512]
    assert refused(chat, stop=["a" * 513]).status == 400
    assert refused(chat, stop=[""]).status == 400
    assert chat(stop=[])["stop"] == []


@pytest.mark.parametrize("value", [3, [1, "a"], {"a": 1}, [None]])
def test_stop_of_the_wrong_shape_is_422(value):
    assert refused(chat, stop=value).status == 422


def test_native_stop_takes_strings_or_token_ids():
    assert validate({"prompt": "x", "stop": "END"}, NATIVE)["stop"] == ("strings", ["END"])
    assert validate({"prompt": "x", "stop": ["a", "b"]}, NATIVE)["stop"] == ("strings", ["a", "b"])
    assert validate({"prompt": "x", "stop": [5, 9]}, NATIVE)["stop"] == ("ids", [5, 9])
    assert validate({"prompt": "x", "stop": list(range(1024))}, NATIVE)["stop"][0] == "ids"
    assert refused(validate, {"prompt": "x", "stop": list(range(1025))}, NATIVE).status == 400
    assert refused(validate, {"prompt": "x", "stop": [f"s{i}" for i in range(17)]}, NATIVE).status == 400


# ------------------------------------------------------------------ messages
def test_developer_is_read_as_system_and_content_parts_are_joined():
    messages = [{"role": "developer", "content": "be brief"}, {"role": "system", "content": "s"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                 "name": "ann"},
                {"role": "assistant", "content": "ok", "tool_calls": None, "refusal": None}]
    assert chat(messages=messages)["messages"] == [
        {"role": "system", "content": "be brief"}, {"role": "system", "content": "s"},
        {"role": "user", "content": "ab"}, {"role": "assistant", "content": "ok"}]


@pytest.mark.parametrize("messages, status, param", [
    ([], 400, "messages"),
    ("hi", 422, "messages"),
    (["hi"], 422, "messages[0]"),
    ([{"role": "tool", "content": "x"}], 422, "messages[0].tool_call_id"),     # a tool result answers a call
    ([{"role": "robot", "content": "x"}], 400, "messages[0].role"),
    ([{"role": None, "content": "x"}], 422, "messages[0].role"),
    ([{"role": "user"}], 422, "messages[0].content"),
    ([{"role": "user", "content": 5}], 422, "messages[0].content"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], 400, "messages[0].content[0]"),
    ([{"role": "user", "content": [{"text": "a"}]}], 422, "messages[0].content[0]"),
    ([{"role": "user", "content": [{"type": "text", "text": 1}]}], 422, "messages[0].content[0].text"),
    ([{"role": "user", "content": "x", "tool_calls": [{"id": "1"}]}], 400, "messages[0].tool_calls"),
    ([{"role": "user", "content": "x", "weight": 1}], 400, "messages[0].weight"),
])
def test_bad_messages(messages, status, param):
    error = refused(chat, messages=messages)
    assert (error.status, error.param) == (status, param), error.message


def test_a_message_without_content_says_content_is_required():
    assert refused(chat, messages=[{"role": "user"}]).message == "'messages[0].content' is required"
    assert refused(chat, messages=[{"role": "user", "content": None}]).message == "'messages[0].content' is required"


def test_up_to_4096_messages():
    assert len(chat(messages=USER * 4096)["messages"]) == 4096
    assert refused(chat, messages=USER * 4097).status == 400


# ------------------------------------------------------------------ prompts
def test_completion_prompt_shapes():
    body = {"model": "m"}
    assert validate({**body, "prompt": "hi"}, COMPLETION)["prompt"] == ("text", "hi")
    assert validate({**body, "prompt": ["hi"]}, COMPLETION)["prompt"] == ("text", "hi")
    assert validate({**body, "prompt": [1, 2]}, COMPLETION)["prompt"] == ("ids", [1, 2])
    assert validate({**body, "prompt": [[1, 2]]}, COMPLETION)["prompt"] == ("ids", [1, 2])
    error = refused(validate, {**body, "prompt": ["a", "b"]}, COMPLETION)
    assert error.status == 400 and "2 prompts" in error.message
    assert refused(validate, {**body, "prompt": [1, "a"]}, COMPLETION).status == 422
    assert refused(validate, {**body, "prompt": 5}, COMPLETION).status == 422


# ------------------------------------------------------------------ unknown and unsupported fields
def test_unknown_fields_are_named_and_extensions_point_to_api_v0():
    error = refused(chat, foo=1, bar=2)
    assert (error.status, error.code, error.param) == (400, "unknown_field", "foo")
    assert "unknown fields 'foo', 'bar'" in error.message and "accepted fields: frequency_penalty" in error.message
    error = refused(chat, mode="speculative")
    assert error.param == "mode" and "/api/v0" in error.message


@pytest.mark.parametrize("name, default, other", [
    ("functions", [], [{"name": "f"}]), ("function_call", "none", {"name": "f"}), ("service_tier", "auto", "flex"),
    ("store", False, True), ("metadata", {}, {"k": "v"}), ("modalities", ["text"], ["text", "audio"]),
])
def test_unsupported_openai_fields_only_at_their_default(name, default, other):
    assert name not in chat(**{name: default})
    assert chat(**{name: None}) == chat()
    error = refused(chat, **{name: other})
    assert (error.status, error.code, error.param) == (400, "unsupported_field", name)


def test_stream_options():
    assert chat(stream=True, stream_options={"include_usage": True})["stream_options"] == {"include_usage": True}
    assert refused(chat, stream_options={"include_usage": 1}).status == 422
    assert refused(chat, stream_options={"other": True}).status == 400
    assert refused(chat, stream_options=[]).status == 422
