"""The HTTP API at the ASGI level: shapes, streaming, stop strings, validation, errors."""
import asyncio
import time
from pathlib import Path

import orjson
import pytest
from asgi_client import call, run, until

from asgi.app import TinyLoopApp
from asgi.settings import Settings
from tinyloop.engine.generate import GenerationRequest, generate

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "Hello"}]


def settings(model_path, **changes):
    base = dict(model_path=str(model_path) if model_path else None, api_key="test-key", auth=True,
                state_dir=Path("/nonexistent"), max_waiting=2, max_body_bytes=65536, exit_on_failure=False,
                commit="abc123", device=None, max_running=1)     # the one-at-a-time contract these tests queue on
    base.update(changes)
    return Settings(**base)


LOAD_TIMEOUT_S = 600


def ready_app(model_path, **changes):
    app = TinyLoopApp(settings(model_path, **changes))
    state = app._ensure_state()
    # Waits for the state, not for a guess: a first load in a fresh checkout (or the copy
    # scripts/mutation_check.py makes) compiles the CPU kernels, a minute or more on 2 cores.
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while state.status == "loading":
        assert time.monotonic() < deadline, f"the model did not load within {LOAD_TIMEOUT_S} s"
        time.sleep(0.01)
    return app



@pytest.fixture(scope="module")
def app(model_path):
    return ready_app(model_path)


def post(app, path, json, **kw):
    return run(call(app, "POST", path, json, **kw))


# ----------------------------------------------------------------------------- shapes
def test_models_lists_the_model_path(app, model_path):
    body = run(call(app, "GET", "/v1/models")).json()
    assert body["object"] == "list" and body["data"][0]["id"] == str(model_path)
    assert body["data"][0]["owned_by"] == "tinyloop" and isinstance(body["data"][0]["created"], int)
    extended = run(call(app, "GET", "/api/v0/models")).json()["data"][0]
    assert extended["quantization"] == "fp32" and extended["max_context_length"] == 512


def test_chat_completion_shape(app):
    body = post(app, CHAT, {"model": "tl", "messages": HELLO, "max_tokens": 6, "temperature": 0}).json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["model"] == "tl" and isinstance(body["created"], int)
    choice = body["choices"][0]
    assert choice["index"] == 0 and choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "length" and isinstance(choice["message"]["content"], str)
    assert body["usage"]["completion_tokens"] == 6
    assert body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 6
    assert "stats" not in body


def test_completion_shape_and_greedy_text_equals_the_engine(app):
    loaded = app.state.loaded
    ids = loaded.tokenizer.encode("The looped transformer")
    expected = generate(loaded.model, GenerationRequest(ids, 10, loops=4)).tokens
    body = post(app, "/v1/completions", {"model": "tl", "prompt": "The looped transformer", "max_tokens": 10,
                                         "temperature": 0, "loops": 4}).json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"][0]["text"] == loaded.tokenizer.decode(expected)


def test_api_v0_adds_stats_model_info_runtime(app):
    body = post(app, "/api/v0/chat/completions", {"model": "tl", "messages": HELLO, "max_tokens": 5,
                                                   "temperature": 0, "loops": 3}).json()
    stats = body["stats"]
    assert stats["mode"] == "generate" and stats["loops_used"] == 3 and stats["completion_tokens"] == 5
    assert stats["wall_ms"] > 0 and stats["tokens_per_second"] > 0 and stats["time_to_first_token_ms"] > 0
    info = body["model_info"]
    assert info == {**info, "arch": "weight-shared-looped-transformer", "dim": 64, "n_heads": 4,
                    "ffn_dim": 128, "vocab_size": 512, "default_loops": 4, "quant": "fp32",
                    "kv_cache_mode": "fp16"}
    assert body["runtime"] == {"name": "tinyloop", "version": "0.1.0", "commit": "abc123", "device": "cpu",
                               "activations": "fp32"}


@pytest.mark.parametrize("mode, extra", [("speculative", {}), ("tree_speculative", {"K_branches": 3})])
def test_api_v0_speculative_modes_are_exact_and_report_acceptance(app, mode, extra):
    request = {"model": "tl", "prompt": "Hello", "max_tokens": 20, "temperature": 0}
    plain = post(app, "/api/v0/completions", {**request, "loops": 6}).json()
    spec = post(app, "/api/v0/completions", {**request, "mode": mode, "draft_loops": 2, "verify_loops": 6,
                                             "draft_ahead": 4, **extra}).json()
    assert spec["choices"][0]["text"] == plain["choices"][0]["text"]
    stats = spec["stats"]
    assert stats["mode"] == mode and stats["loops_used"] == 6
    assert stats["rounds"] > 0 and 0 <= stats["acceptance_rate"] <= 1
    assert len(stats["acceptance_by_depth"]) == 4


# ----------------------------------------------------------------------------- streaming
def test_chat_stream_framing_and_usage_only_when_asked(app):
    request = {"model": "tl", "messages": HELLO, "max_tokens": 6, "temperature": 0, "stream": True}
    response = post(app, CHAT, request)
    assert response.status == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = response.events()
    assert events[-1] == "[DONE]" and response.body.endswith(b"\n\ndata: [DONE]\n\n")
    assert events[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert events[-2]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "length"}
    assert all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    assert not any("usage" in e for e in events[:-1])
    content = "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-2])
    whole = post(app, CHAT, {**request, "stream": False}).json()["choices"][0]["message"]["content"]
    assert content == whole
    assert all(e["choices"][0]["delta"].get("content") for e in events[1:-2])   # no empty deltas

    with_usage = post(app, CHAT, {**request, "stream_options": {"include_usage": True}}).events()
    assert with_usage[-2]["choices"] == [] and with_usage[-2]["usage"]["completion_tokens"] == 6
    assert with_usage[-3]["choices"][0]["finish_reason"] == "length"


def test_native_stream_events(app):
    response = post(app, "/generate", {"prompt": "Hello", "max_tokens": 5, "stream": True})
    events = response.events()
    assert events[-1] == "[DONE]"
    tokens = [e for e in events[:-1] if e["token_id"] != -1]
    assert len(tokens) == 5 and all(set(e) == {"token_id", "text"} for e in tokens)
    final = events[-2]
    assert final["token_id"] == -1 and final["finish_reason"] == "length"
    whole = post(app, "/generate", {"prompt": "Hello", "max_tokens": 5}).json()
    assert whole["tokens"] == [e["token_id"] for e in tokens]
    assert whole["text"] == "".join(e["text"] for e in tokens) + final["text"]


def test_native_speculative_routes_match_generate(app):
    base = {"prompt": [5, 6, 7, 8], "max_tokens": 24}
    plain = post(app, "/generate", {**base, "loops": 8}).json()
    spec = post(app, "/generate/speculative", {**base, "draft_loops": 3, "verify_loops": 8,
                                               "draft_ahead": 5, "stream": True}).events()
    tree = post(app, "/generate/tree_speculative", {**base, "K_branches": 4}).json()
    assert [e["token_id"] for e in spec[:-2]] == plain["tokens"] == tree["tokens"]
    assert tree["stats"]["mode"] == "tree_speculative" and tree["stats"]["loops_used"] == 8


# ----------------------------------------------------------------------------- stops, seeds
def test_stop_string_across_tokens_ends_the_output_before_it(app):
    request = {"model": "tl", "prompt": "The looped", "max_tokens": 40, "temperature": 0}
    full = post(app, "/v1/completions", request).json()["choices"][0]["text"]
    stop = full[10:14]
    cut = full.index(stop)
    body = post(app, "/v1/completions", {**request, "stop": [stop, "never-seen"]}).json()
    assert body["choices"][0]["text"] == full[:cut] and body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"]["completion_tokens"] < 40
    events = post(app, "/v1/completions", {**request, "stop": stop, "stream": True}).events()
    assert "".join(e["choices"][0]["text"] for e in events[:-1]) == full[:cut]
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


def test_native_stop_token_ids(app):
    tokens = post(app, "/generate", {"prompt": "Hi", "max_tokens": 20}).json()["tokens"]
    stop = tokens[6]
    body = post(app, "/generate", {"prompt": "Hi", "max_tokens": 20, "stop": [stop]}).json()
    assert body["tokens"] == tokens[:tokens.index(stop)] and body["finish_reason"] == "stop"


def test_seed_gives_reproducible_samples(app):
    request = {"model": "tl", "messages": HELLO, "max_tokens": 12, "temperature": 1.0, "seed": 42}
    a = post(app, CHAT, request).json()["choices"][0]["message"]["content"]
    b = post(app, CHAT, request).json()["choices"][0]["message"]["content"]
    c = post(app, CHAT, {**request, "seed": 43}).json()["choices"][0]["message"]["content"]
    assert a == b != c


def test_penalties_and_new_parameter_names(app):
    body = post(app, CHAT, {"model": "tl", "messages": HELLO, "max_completion_tokens": 7, "temperature": 0.5,
                            "seed": 1, "presence_penalty": 1.5, "frequency_penalty": -0.5, "top_p": 0.8,
                            "user": "someone", "logprobs": False, "tools": [], "n": 1}).json()
    assert body["usage"]["completion_tokens"] == 7


# ----------------------------------------------------------------------------- context
def test_context_rules(app):
    long_prompt = [7] * 500
    body = post(app, "/v1/completions", {"model": "tl", "prompt": long_prompt, "max_tokens": 20})
    assert body.status == 400
    assert "prompt (500 tokens) + max_tokens (20) = 520 exceeds the model's context of 512 tokens" \
        in body.json()["error"]["message"]
    lowered = post(app, "/v1/completions", {"model": "tl", "prompt": long_prompt}).json()
    assert lowered["usage"]["completion_tokens"] == 12 and lowered["choices"][0]["finish_reason"] == "length"
    full = post(app, "/v1/completions", {"model": "tl", "prompt": [7] * 512})
    assert full.status == 400 and "no room to generate" in full.json()["error"]["message"]


# ----------------------------------------------------------------------------- bad input
def TOOL(name, parameters=None):
    return {"type": "function", "function": {"name": name, "parameters": parameters or {"type": "object"}}}


BAD_BODIES = [
    # (path, body, status, param, message fragment)
    (CHAT, {"model": "tl"}, 422, "messages", "'messages' is required"),
    (CHAT, {"messages": HELLO}, 422, "model", "'model' is required"),
    (CHAT, {"model": "tl", "messages": "hi"}, 422, "messages", "must be an array of messages"),
    (CHAT, {"model": "tl", "messages": [{"role": "user"}]}, 422, "messages[0].content", "is required"),
    (CHAT, {"model": "tl", "messages": [{"role": 5, "content": "x"}]}, 422, "messages[0].role", "string"),
    (CHAT, {"model": "tl", "messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role", "one of"),
    (CHAT, {"model": "tl", "messages": [{"role": "tool", "content": "x"}]}, 422, "messages[0].tool_call_id",
     "earlier assistant tool call"),
    (CHAT, {"model": "tl", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages[0].content[0]", "only text parts"),
    (CHAT, {"model": "tl", "messages": []}, 400, "messages", "at least one message"),
    (CHAT, {"model": "tl", "messages": HELLO, "temperature": "hot"}, 422, "temperature", "must be a number"),
    (CHAT, {"model": "tl", "messages": HELLO, "temperature": 3}, 400, "temperature", "[0, 2], got 3"),
    (CHAT, {"model": "tl", "messages": HELLO, "max_tokens": -1}, 400, "max_tokens", "[1, 8192]"),
    (CHAT, {"model": "tl", "messages": HELLO, "max_tokens": 10 ** 30}, 400, "max_tokens", "far out of range"),
    (CHAT, {"model": "tl", "messages": HELLO, "max_tokens": 2.5}, 422, "max_tokens", "must be an integer"),
    (CHAT, {"model": "tl", "messages": HELLO, "max_tokens": True}, 422, "max_tokens", "must be an integer"),
    (CHAT, {"model": "tl", "messages": HELLO, "n": 2}, 400, "n", "[1, 1]"),
    (CHAT, {"model": "tl", "messages": HELLO, "stream": "yes"}, 422, "stream", "true or false"),
    (CHAT, {"model": "tl", "messages": HELLO, "stop": [1, 2]}, 422, "stop", "array of strings"),
    (CHAT, {"model": "tl", "messages": HELLO, "stop": [""]}, 400, "stop", "1 to 512 characters"),
    (CHAT, {"model": "tl", "messages": HELLO, "stop": ["a"] * 17}, 400, "stop", "at most 16"),
    (CHAT, {"model": "tl", "messages": HELLO, "colour": "red"}, 400, "colour", "unknown field 'colour'"),
    (CHAT, {"model": "tl", "messages": HELLO, "tools": [{"type": "function"}]}, 422, "tools[0]", "must be an object"),
    (CHAT, {"model": "tl", "messages": HELLO, "tools": [TOOL("f", {"type": "object", "colour": 1})]}, 400,
     "tools[0].function.parameters", "unsupported JSON schema keyword 'colour'"),
    (CHAT, {"model": "tl", "messages": HELLO, "tools": [TOOL("f"), TOOL("f")]}, 400, "tools[1].function.name",
     "declared twice"),
    (CHAT, {"model": "tl", "messages": HELLO, "tools": [TOOL("f")], "tool_choice": {
        "type": "function", "function": {"name": "g"}}}, 400, "tool_choice", "does not declare"),
    (CHAT, {"model": "tl", "messages": HELLO, "tool_choice": "required"}, 400, "tool_choice", "needs 'tools'"),
    (CHAT, {"model": "tl", "messages": HELLO + [{"role": "tool", "content": "4", "tool_call_id": "nope"}]}, 400,
     "messages[1].tool_call_id", "does not match"),
    (CHAT, {"model": "tl", "messages": [{"role": "assistant", "content": None, "tool_calls": [{
        "id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "1", "tool_call_id": "c1"},
        {"role": "tool", "content": "2", "tool_call_id": "c1"}]},
     400, "messages[2].tool_call_id", "still unanswered"),
    (CHAT, {"model": "tl", "messages": [{"role": "assistant", "content": None, "tool_calls": [{
        "id": "c1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}, 400,
     "messages[0].tool_calls[0].function.arguments", "not valid JSON"),
    (CHAT, {"model": "tl", "messages": [{"role": "assistant", "content": "x", "reasoning_content": "a",
                                         "thinking_blocks": [{"type": "thinking", "thinking": "a",
                                                              "signature": "opaque"}]}]}, 400,
     "messages[0].thinking_blocks[0]", "opaque thinking data is refused"),
    (CHAT, {"model": "tl", "messages": HELLO, "top_logprobs": 21, "logprobs": True}, 400, "top_logprobs", "[0, 20]"),
    (CHAT, {"model": "tl", "messages": HELLO, "top_logprobs": 2}, 400, "top_logprobs", "needs 'logprobs'"),
    (CHAT, {"model": "tl", "messages": HELLO, "logit_bias": {"99999": 5}}, 400, "logit_bias", "outside the vocab"),
    (CHAT, {"model": "tl", "messages": HELLO, "logit_bias": {"1": 101}}, 400, "logit_bias", "[-100, 100]"),
    (CHAT, {"model": "tl", "messages": HELLO, "min_p": 1.5}, 400, "min_p", "[0, 1]"),
    (CHAT, {"model": "tl", "messages": HELLO, "keep_alive": [1]}, 422, "keep_alive", "duration"),
    (CHAT, {"model": "tl", "messages": HELLO, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "not": {"required": ["a"]}}}}}, 400, "response_format",
     "unsupported JSON schema keyword 'not'"),
    (CHAT, {"model": "tl", "messages": HELLO, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"anyOf": [{"type": "integer"}] * 17}}}}, 400, "response_format",
     "at most 16"),
    (CHAT, {"model": "tl", "messages": HELLO, "response_format": {"type": "yaml"}}, 400, "response_format.type",
     "json_schema"),
    (CHAT, {"model": "tl", "messages": HELLO, "response_format": {"type": "json_object"}}, 400, "response_format",
     "no end-of-sequence token"),                                    # this test model has none
    ("/v1/completions", {"model": "tl", "prompt": "x", "logprobs": 6}, 400, "logprobs", "[0, 5]"),
    (CHAT, {"model": "tl", "messages": HELLO, "loops": 9}, 400, "loops", "[1, 8] for this model"),
    (CHAT, {"model": "tl", "messages": HELLO, "loops": 65}, 400, "loops", "[1, 64]"),
    (CHAT, {"model": "tl", "messages": HELLO, "mode": "speculative"}, 400, "mode", "/api/v0"),
    (CHAT, {"model": "tl", "messages": HELLO, "stream_options": {"foo": 1}}, 400, "stream_options.foo", "only"),
    (CHAT, {"model": "tl", "messages": HELLO, "seed": "1"}, 422, "seed", "must be an integer"),
    ("/api/v0/chat/completions", {"model": "tl", "messages": HELLO, "mode": "fast"}, 400, "mode", "one of"),
    ("/api/v0/chat/completions", {"model": "tl", "messages": HELLO, "mode": "speculative", "draft_loops": 8,
                                  "verify_loops": 8}, 400, "draft_loops", "must be less than verify_loops"),
    ("/api/v0/chat/completions", {"model": "tl", "messages": HELLO, "mode": "speculative", "K_branches": 2},
     400, "K_branches", "tree_speculative only"),
    ("/api/v0/chat/completions", {"model": "tl", "messages": HELLO, "cache_window": -1}, 400, "cache_window",
     ">= 0"),
    ("/api/v0/completions", {"model": "tl", "prompt": "x", "repetition_penalty": 3}, 400,
     "repetition_penalty", "[0.5, 2]"),
    ("/v1/completions", {"model": "tl", "prompt": ["a", "b"]}, 400, "prompt", "only one prompt"),
    ("/v1/completions", {"model": "tl", "prompt": [1, 99999]}, 400, "prompt", "outside the vocabulary"),
    ("/v1/completions", {"model": "tl", "prompt": ""}, 400, "prompt", "must not be empty"),
    ("/v1/completions", {"model": "tl", "prompt": 5}, 422, "prompt", "string or an array"),
    ("/v1/completions", {"model": "tl", "prompt": "x", "echo": True}, 400, "echo", "not supported"),
    ("/generate", {"prompt": "x", "top_k": 1001}, 400, "top_k", "[0, 1000]"),
    ("/generate", {"prompt": "x", "stop": [1, "a"]}, 422, "stop", "array of strings"),
    ("/generate", {"prompt": "x", "presence_penalty": 1}, 400, "presence_penalty", "unknown field"),
    ("/generate/speculative", {"prompt": "x", "draft_ahead": 17}, 400, "draft_ahead", "[1, 16]"),
    ("/generate/tree_speculative", {"prompt": "x", "K_branches": 16, "draft_ahead": 8}, 400, "K_branches",
     "at most 64"),
    ("/generate/speculative", {"prompt": "x", "verify_loops": 12}, 400, "verify_loops", "[1, 8] for this model"),
]


@pytest.mark.parametrize("path, body, status, param, fragment", BAD_BODIES)
def test_bad_bodies_get_clear_errors(app, path, body, status, param, fragment):
    from orjson import dumps
    if body.get("max_tokens") == 10 ** 30:       # beyond 64 bits: orjson cannot even write it
        raw = b'{"model": "tl", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": ' \
              + b"1" * 31 + b"}"
    else:
        raw = dumps(body)
    response = run(call(app, "POST", path, body=raw))
    assert response.status == status, response.body
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and fragment in error["message"], error


RAW_BODIES = [
    (b"{not json", 400, "not valid JSON"),
    (b'{"model": "tl", "messages": [], "temperature": NaN}', 400, "not valid JSON"),
    (b"\xff\xfe{}", 400, "not valid UTF-8"),
    (b"[1, 2]", 422, "must be a JSON object"),
    (b"", 400, "body is empty"),
    (b"[" * 5000 + b"]" * 5000, 400, "not valid JSON"),
    (b'{"model": "tl", "messages": ' + b"[" * 3000 + b"]" * 3000 + b"}", 400, "not valid JSON"),
]


@pytest.mark.parametrize("raw, status, fragment", RAW_BODIES)
def test_malformed_bodies(app, raw, status, fragment):
    response = run(call(app, "POST", CHAT, body=raw, chunks=3))
    assert response.status == status and fragment in response.json()["error"]["message"]


def test_content_type_and_size_limits(app):
    wrong = run(call(app, "POST", CHAT, {"model": "tl", "messages": HELLO}, content_type=b"text/plain"))
    assert wrong.status == 415 and wrong.json()["error"]["code"] == "unsupported_media_type"
    huge = run(call(app, "POST", CHAT, body=b'{"model": "' + b"x" * 70000 + b'"}', chunks=5))
    assert huge.status == 413 and "65536 bytes" in huge.json()["error"]["message"]


def test_auth_routes_and_methods(app):
    assert run(call(app, "GET", "/health", key=None)).status == 401
    wrong = run(call(app, "GET", "/v1/models", key="nope"))
    assert wrong.status == 401 and wrong.headers["www-authenticate"] == "Bearer"
    assert wrong.json()["error"]["type"] == "authentication_error"
    missing = run(call(app, "GET", "/v2/models"))
    assert missing.status == 404 and missing.json()["error"]["code"] == "not_found"
    method = run(call(app, "GET", CHAT))
    assert method.status == 405 and method.headers["allow"] == "POST"
    assert run(call(app, "POST", "/health")).status == 405


def test_server_keeps_serving_after_errors(app):
    for raw in (b"{", b"\xff", b"[]"):
        run(call(app, "POST", CHAT, body=raw))
    assert post(app, CHAT, {"model": "tl", "messages": HELLO, "max_tokens": 2}).status == 200


def test_health_metrics_openapi(app):
    assert run(call(app, "GET", "/health")).json() == {"status": "ready", "model": app.state.settings.model_path}
    post(app, "/api/v0/completions", {"model": "tl", "prompt": "x", "max_tokens": 4, "mode": "speculative",
                                      "draft_loops": 1, "verify_loops": 4})
    text = run(call(app, "GET", "/metrics")).body.decode()
    assert 'tinyloop_requests_total{route="/api/v0/completions",status="200"}' in text
    assert "tinyloop_generations_running 0" in text and "tinyloop_generations_waiting 0" in text
    assert "tinyloop_speculative_rounds_total" in text and "tinyloop_time_to_first_token_seconds_count" in text
    spec = run(call(app, "GET", "/openapi.json")).json()
    assert {"/v1/chat/completions", "/generate/tree_speculative", "/health", "/metrics"} <= set(spec["paths"])
    chat_schema = spec["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]
    assert chat_schema["schema"]["properties"]["temperature"]["maximum"] == 2.0


def test_model_that_fails_to_load_keeps_the_server_up(tmp_path):
    broken = tmp_path / "broken.tinyloop"
    broken.write_bytes(b"\x00" * 100)
    app = ready_app(broken)
    health = run(call(app, "GET", "/health"))
    assert health.status == 503 and health.json()["status"] == "worker_failed"
    assert "model failed to load" in health.json()["reason"]
    chat = post(app, CHAT, {"model": "tl", "messages": HELLO})
    assert chat.status == 503 and "model failed to load" in chat.json()["error"]["message"]
    assert run(call(app, "GET", "/metrics")).status == 200


def test_no_model_configured_is_503_with_the_reason():
    app = ready_app(None)
    assert "TINYLOOP_MODEL_PATH" in run(call(app, "GET", "/health")).json()["reason"]


def test_auth_off_is_explicit(model_path):
    app = ready_app(model_path, auth=False, api_key=None)
    assert run(call(app, "GET", "/v1/models", key=None)).status == 200


def test_key_file_is_generated_with_mode_0600(model_path, tmp_path):
    state_dir = tmp_path / "state"
    app = ready_app(model_path, api_key=None, state_dir=state_dir)
    key_file = state_dir / "api-key"
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    key = key_file.read_text().strip()
    assert run(call(app, "GET", "/v1/models", key=key)).status == 200
    assert run(call(app, "GET", "/v1/models")).status == 401


# ----------------------------------------------------------------------------- admission
def test_queue_full_gives_429_with_retry_after(model_path):
    app = ready_app(model_path, max_waiting=1)

    async def scenario():
        long = {"prompt": "Hi", "max_tokens": 300, "loops": 8}
        first = asyncio.ensure_future(call(app, "POST", "/generate", long))
        await until(lambda: app.state.engine.running == 1, "the first generation to start")
        second = asyncio.ensure_future(call(app, "POST", "/generate", {"prompt": "Hi", "max_tokens": 2}))
        await until(lambda: app.state.engine.waiting == 1, "a generation to wait")
        third = await call(app, "POST", "/generate", {"prompt": "Hi", "max_tokens": 2})
        assert third.status == 429 and third.headers["retry-after"] == "1"
        assert third.json()["error"]["type"] == "rate_limit_error"
        assert (await first).status == 200 and (await second).status == 200

    run(scenario())


def test_waiting_client_that_leaves_is_dropped_from_the_queue(model_path):
    app = ready_app(model_path, max_waiting=1)

    async def scenario():
        first = asyncio.ensure_future(call(app, "POST", "/generate", {"prompt": "Hi", "max_tokens": 300,
                                                                      "loops": 8}))
        await until(lambda: app.state.engine.running == 1, "the first generation to start")
        leave = asyncio.Event()
        waiting = asyncio.ensure_future(call(app, "POST", "/generate", {"prompt": "Hi", "max_tokens": 2},
                                             disconnect_now=leave))
        await until(lambda: app.state.engine.waiting == 1, "a generation to wait")
        leave.set()
        await waiting
        assert app.state.engine.waiting == 0
        # its place is free again: another client may wait
        third = asyncio.ensure_future(call(app, "POST", "/generate", {"prompt": "Hi", "max_tokens": 2}))
        await asyncio.sleep(0.05)
        assert (await first).status == 200 and (await third).status == 200

    run(scenario())


def test_engine_failure_marks_the_worker_failed(model_path, monkeypatch):
    app = ready_app(model_path)

    def broken(*args, **kwargs):
        raise FloatingPointError("simulated kernel fault")

    monkeypatch.setattr(app.state.loaded.model, "trunk", broken)
    failed = post(app, "/generate", {"prompt": "Hi", "max_tokens": 3})
    assert failed.status == 503 and "simulated kernel fault" in failed.json()["error"]["message"]
    health = run(call(app, "GET", "/health"))
    assert health.status == 503 and health.json()["status"] == "worker_failed"
    again = post(app, "/generate", {"prompt": "Hi", "max_tokens": 3})
    assert again.status == 503 and again.json()["error"]["code"] == "worker_failed"
    assert run(call(app, "GET", "/metrics")).status == 200       # still answering


def test_kv_cache_mode_and_window_through_the_api(model_path):
    app = ready_app(model_path, kv_mode="int4-h")
    body = post(app, "/api/v0/completions", {"model": "tl", "prompt": "Hello", "max_tokens": 30, "temperature": 0,
                                             "cache_window": 16}).json()
    assert body["model_info"]["kv_cache_mode"] == "int4-h"
    loaded = app.state.loaded
    ids = loaded.encode_prompt("Hello")
    expected = generate(loaded.model, GenerationRequest(ids, 30, cache_window=16)).tokens
    assert body["choices"][0]["text"] == loaded.tokenizer.decode(expected)
    spec = post(app, "/generate/tree_speculative", {"prompt": "Hello", "max_tokens": 30, "cache_window": 16,
                                                    "K_branches": 2, "verify_loops": 8}).json()
    plain = post(app, "/generate", {"prompt": "Hello", "max_tokens": 30, "cache_window": 16, "loops": 8}).json()
    assert spec["tokens"] == plain["tokens"]


def test_kv_budget_refusal_is_a_400(model_path):
    app = ready_app(model_path, kv_budget_bytes=1 << 16)
    response = post(app, "/generate", {"prompt": "Hello", "max_tokens": 300, "loops": 8})
    assert response.status == 400 and "TINYLOOP_KV_BUDGET_MB" in response.json()["error"]["message"]


# ------------------------------------------------------------------------- shutdown, dead sockets
def _shut_down_during(app, body):
    """Start a long generation, stop the server while it runs; the response."""
    async def scenario():
        task = asyncio.ensure_future(call(app, "POST", "/generate", body))
        await until(lambda: app.state.engine.running == 1, "the first generation to start")
        await asyncio.get_running_loop().run_in_executor(None, app.state.shutdown)
        return await task
    return run(scenario())


def test_a_shutdown_mid_generation_is_a_503_not_a_finished_answer(model_path):
    long = {"prompt": "The looped transformer", "max_tokens": 400, "loops": 8}
    response = _shut_down_during(ready_app(model_path), long)
    assert response.status == 503
    assert response.json()["error"]["code"] == "shutting_down" and "shutting down" in response.json()["error"]["message"]
    events = _shut_down_during(ready_app(model_path), {**long, "stream": True}).events()
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "shutting_down"
    assert all("finish_reason" not in e for e in events[:-2])          # no "stop" was ever claimed


def test_a_send_that_fails_because_the_client_left_is_a_disconnect_not_a_500(model_path, caplog):
    app = ready_app(model_path)
    sends = []

    async def send(message):
        sends.append(message)
        if message["type"] == "http.response.body":
            raise ConnectionResetError("client closed the connection")

    body = [{"type": "http.request", "body": orjson.dumps({"prompt": "hi", "max_tokens": 3}), "more_body": False}]

    async def receive():
        if body:
            return body.pop()
        await asyncio.Event().wait()                  # no disconnect message: the socket just fails

    scope = {"type": "http", "method": "POST", "path": "/generate", "query_string": b"",
             "headers": [(b"content-type", b"application/json"), (b"authorization", b"Bearer test-key")]}
    run(app(scope, receive, send))
    assert app.state.metrics.requests[("/generate", 499)] == 1
    assert app.state.metrics.requests[("/generate", 500)] == 0
    assert "internal error" not in caplog.text


# ------------------------------------------------------------------------- behind a proxy
@pytest.mark.parametrize("path, body", [
    (CHAT, {"model": "tl", "messages": HELLO}),
    ("/v1/completions", {"model": "tl", "prompt": "Hello"}),
    ("/api/v0/chat/completions", {"model": "tl", "messages": HELLO, "mode": "speculative"}),
    ("/api/v0/completions", {"model": "tl", "prompt": "Hello"}),
    ("/generate", {"prompt": "Hello"}),
    ("/generate/speculative", {"prompt": "Hello"}),
    ("/generate/tree_speculative", {"prompt": "Hello"}),
])
def test_every_event_stream_tells_a_proxy_not_to_buffer_it(app, path, body):
    """nginx buffers proxied responses unless told not to; `X-Accel-Buffering: no` on
    each event stream makes tokens pass through one by one whatever the proxy's setting."""
    response = post(app, path, {**body, "max_tokens": 3, "stream": True})
    assert response.status == 200 and response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-accel-buffering"] == "no"
    assert response.headers["cache-control"] == "no-cache"
    assert response.events()[-1] == "[DONE]"
