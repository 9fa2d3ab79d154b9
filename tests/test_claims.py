"""README claims that had no test of their own (tests/CLAIMS.md maps every claim to its test).

Oracles are the README's own words and numbers, written out here (the command-line
synopsis is read from README.md itself), or facts measured independently of the code
under test (/proc for the process gauges, the responses' own counts for /metrics).
"""
import argparse
import asyncio
import json
import os
import re
import threading
from pathlib import Path

import numpy as np
import orjson
import pytest
from asgi_client import call, run, until, wait_until
from test_server_asgi import CHAT, HELLO, ready_app, settings

import asgi.state
from asgi.app import TinyLoopApp
from asgi.settings import Settings
from tinyloop.cli import build_parser, main
from tinyloop.engine.generate import GenerationRequest, generate
from tinyloop.engine.sampling import SamplingParams
from tinyloop.errors import RequestError
from tinyloop.grammar.compile import Grammar, json_schema_grammar
from tinyloop.kv import pool as kv_pool
from tinyloop.kv.cache import physical_rows_needed
from tinyloop.model.loader import load_model
from tinyloop.model.testmodels import make_test_model

README = Path(__file__).resolve().parents[1] / "README.md"
# the most a wait for a state (the model loaded, a setting applied) may take before it fails: a
# hang's bound, not a speed claim. 30 s was seen to run out loading the model (its kernels
# compiling) beside two busy test workers on 2 cores
WAIT_S = 180



def post(app, path, body, **kw):
    return run(call(app, "POST", path, body, **kw))


# ------------------------------------------------------------------ Talking to the server
def test_a_loading_model_answers_503_model_loading_with_retry_after(model_path, monkeypatch):
    """/health says `loading` (503); a generation gets 503 `model_loading` with
    `Retry-After: 1` (README: Health checks); once loaded, both are served."""
    release, real_load = threading.Event(), asgi.state.load_model

    def held_load(*args, **kwargs):
        if not release.wait(WAIT_S):
            raise TimeoutError("the test never released the model load")
        return real_load(*args, **kwargs)

    monkeypatch.setattr(asgi.state, "load_model", held_load)
    app = TinyLoopApp(settings(model_path))
    app._ensure_state()
    try:
        health = run(call(app, "GET", "/health"))
        assert health.status == 503 and health.json()["status"] == "loading"
        for path, body in [("/generate", {"prompt": "Hi", "max_tokens": 2}),
                           (CHAT, {"model": "tl", "messages": HELLO, "max_tokens": 2}),
                           ("/api/v0/completions", {"model": "tl", "prompt": "Hi", "max_tokens": 2})]:
            response = post(app, path, body)
            assert response.status == 503 and response.headers["retry-after"] == "1", (path, response.body)
            assert response.json()["error"]["code"] == "model_loading"
        assert run(call(app, "GET", "/metrics")).status == 200
    finally:
        release.set()
    wait_until(lambda: app.state.status != "loading", "the model to load", WAIT_S)
    assert run(call(app, "GET", "/health")).json()["status"] == "ready"
    assert post(app, "/generate", {"prompt": "Hi", "max_tokens": 2}).status == 200


def _samples(text: str) -> dict:
    """Prometheus text -> {name{labels}: value} (comments skipped)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def test_metrics_count_exactly_what_was_served(model_path):
    """Every series the README lists for /metrics, against counts taken from the
    responses themselves (prompt lengths sent, tokens received, the speculative stats
    each response reports) and, for the process gauges, from /proc directly."""
    app = ready_app(model_path, max_waiting=0)
    engine, metrics = app.state.engine, app.state.metrics

    async def scenario():                  # one event loop for all: a cancelled job reports to it
        plain = await call(app, "POST", "/generate", {"prompt": [5, 6, 7], "max_tokens": 4})
        spec = await call(app, "POST", "/generate/speculative", {"prompt": [5, 6, 7, 8], "max_tokens": 9,
                                                                 "draft_loops": 2, "verify_loops": 6,
                                                                 "draft_ahead": 3})
        bad = await call(app, "POST", "/generate", {"prompt": "x", "top_k": -1})    # refused before admission
        stream = await call(app, "POST", "/generate", {"prompt": [9, 9], "max_tokens": 300, "loops": 8,
                                                       "stream": True}, disconnect_after_sends=3)
        await until(lambda: metrics.generations[("generate", "cancelled")] == 1 and engine.running == 0,
                    "the cancelled generation to end")
        first = asyncio.ensure_future(call(app, "POST", "/generate", {"prompt": [1], "max_tokens": 200,
                                                                      "loops": 8}))
        await until(lambda: engine.running == 1, "the next generation to start")
        refused = await call(app, "POST", "/generate", {"prompt": [1], "max_tokens": 2})   # max_waiting=0: 429
        return plain, spec.json(), bad, stream, await first, refused

    plain, spec, bad, stream, first, refused = run(scenario())
    assert (plain.status, bad.status, stream.status, first.status, refused.status) == (200, 400, 200, 200, 429)
    m = _samples(run(call(app, "GET", "/metrics")).body.decode())
    cancelled_tokens = m['tinyloop_completion_tokens_total'] - 4 - 9 - 200
    assert 1 <= cancelled_tokens < 300                                    # the stream that left
    assert m["tinyloop_prompt_tokens_total"] == 3 + 4 + 2 + 1
    assert m['tinyloop_generations_total{mode="generate",finish_reason="length"}'] == 2
    assert m['tinyloop_generations_total{mode="speculative",finish_reason="length"}'] == 1
    assert m['tinyloop_generations_total{mode="generate",finish_reason="cancelled"}'] == 1
    assert m["tinyloop_client_disconnects_total"] == 1
    assert m['tinyloop_requests_total{route="/generate",status="200"}'] == 2
    assert m['tinyloop_requests_total{route="/generate",status="499"}'] == 1          # the client that left
    assert m['tinyloop_requests_total{route="/generate",status="400"}'] == 1
    assert m['tinyloop_requests_total{route="/generate",status="429"}'] == 1
    assert m['tinyloop_requests_total{route="/generate/speculative",status="200"}'] == 1
    stats = spec["stats"]
    assert m["tinyloop_speculative_rounds_total"] == stats["rounds"] > 0
    assert m["tinyloop_speculative_drafted_tokens_total"] == stats["drafted_tokens"]
    assert m["tinyloop_speculative_accepted_tokens_total"] == stats["accepted_tokens"]
    assert m["tinyloop_admitted_total"] == 4
    assert m['tinyloop_refused_total{reason="queue_full"}'] == 1
    assert m['tinyloop_settled_total{end="completed"}'] == 3 and m['tinyloop_settled_total{end="cancelled"}'] == 1
    assert m["tinyloop_generations_running"] == 0 and m["tinyloop_generations_waiting"] == 0
    assert m["tinyloop_draining"] == 0
    assert m["tinyloop_time_to_first_token_seconds_count"] == 3                   # the completed ones
    assert m['tinyloop_time_to_first_token_seconds_bucket{le="+Inf"}'] == 3
    assert len(plain.json()["tokens"]) == 4
    # the worker's own gauges, against /proc read here
    assert abs(m["process_threads"] - len(os.listdir("/proc/self/task"))) <= 2     # other tests' timers may end
    assert abs(m["process_open_fds"] - len(os.listdir("/proc/self/fd"))) <= 4
    rss_kib = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:"))
    assert abs(m["process_resident_memory_bytes"] - rss_kib * 1024) < 0.1 * rss_kib * 1024
    app.state.shutdown()


@pytest.mark.parametrize("path, body, role_chunks", [
    ("/generate", {"prompt": "Hi"}, 0),
    ("/v1/completions", {"model": "tl", "prompt": "Hi"}, 0),
    (CHAT, {"model": "tl", "messages": HELLO}, 1),
])
def test_a_queued_stream_sends_its_headers_at_admission_and_no_token_until_it_starts(model_path, path, body,
                                                                                     role_chunks):
    """README (Serving at scale): a stream's headers are sent when the replica admits it
    (so nginx never retries it), and a queued stream sends nothing more until it starts
    (chat streams: their opening role chunk), hence the long proxy_read_timeout."""
    app = ready_app(model_path, max_waiting=1)
    engine = app.state.engine

    async def scenario():
        first = asyncio.ensure_future(call(app, "POST", "/generate", {"prompt": "Hi", "max_tokens": 300,
                                                                      "loops": 8}))
        await until(lambda: engine.running == 1, "the first generation to start")
        sent, request = [], [{"type": "http.request", "body": orjson.dumps({**body, "max_tokens": 3,
                                                                            "stream": True}), "more_body": False}]

        async def receive():
            if request:
                return request.pop()
            await asyncio.sleep(WAIT_S)
            return {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": path, "query_string": b"",
                 "headers": [(b"content-type", b"application/json"), (b"authorization", b"Bearer test-key")]}
        queued = asyncio.ensure_future(app(scope, receive, send))
        await until(lambda: engine.waiting == 1 and sent, "the stream to be admitted and answered")
        await asyncio.sleep(0.05)
        while_waiting = list(sent)
        await asyncio.wait_for(first, WAIT_S)
        await asyncio.wait_for(queued, WAIT_S)
        return while_waiting, sent

    while_waiting, sent = run(scenario())
    assert while_waiting[0]["type"] == "http.response.start" and while_waiting[0]["status"] == 200
    assert dict(while_waiting[0]["headers"])[b"content-type"].startswith(b"text/event-stream")
    assert len(while_waiting) == 1 + role_chunks, while_waiting
    if role_chunks:
        assert orjson.loads(while_waiting[1]["body"][len(b"data: "):])["choices"][0]["delta"] == {
            "role": "assistant"}
    assert sent[-1]["body"] == b"data: [DONE]\n\n" and len(sent) > len(while_waiting) + 1
    app.state.shutdown()


# ------------------------------------------------------------------ Settings
def _clean_env(monkeypatch, home: Path):
    for name in list(os.environ):
        if name.startswith("TINYLOOP_"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(home))


def test_settings_defaults_are_the_readmes(monkeypatch, tmp_path):
    """The README's Settings table: every default, with no TINYLOOP_* variable set."""
    _clean_env(monkeypatch, tmp_path)
    s = Settings.from_env()
    assert s.model_path is None and s.api_key is None and s.auth is True
    assert s.state_dir == tmp_path / ".local" / "state" / "tinyloop"          # ~/.local/state/tinyloop
    assert s.max_waiting == 8 and s.max_body_bytes == 1024 * 1024               # 8; 1 MiB
    assert s.exit_on_failure is False and s.drain_timeout_s == 30
    assert s.kv_mode == "fp16" and s.kv_budget_bytes is None and s.commit is None and s.device is None
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert Settings.from_env().state_dir == tmp_path / "xdg" / "tinyloop"    # $XDG_STATE_HOME/tinyloop


def test_each_setting_reaches_the_server(monkeypatch, tmp_path, model_path):
    """Each variable set: the value the README says it means, seen through the server
    where it shows there (runtime.commit, the body limit, the key, the cache mode)."""
    _clean_env(monkeypatch, tmp_path)
    values = {"TINYLOOP_MODEL_PATH": str(model_path), "TINYLOOP_API_KEY": "k-from-env",
              "TINYLOOP_STATE_DIR": str(tmp_path / "st"), "TINYLOOP_MAX_WAITING": "3",
              "TINYLOOP_MAX_BODY_BYTES": "2048", "TINYLOOP_EXIT_ON_FAILURE": "1", "TINYLOOP_DRAIN_TIMEOUT": "5",
              "TINYLOOP_KV_CACHE": "int8", "TINYLOOP_KV_BUDGET_MB": "64", "TINYLOOP_COMMIT": "deadbeef",
              "TINYLOOP_DEVICE": "cpu", "TINYLOOP_ACTIVATIONS": "fp16"}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    s = Settings.from_env()
    assert (s.model_path, s.api_key, s.state_dir, s.max_waiting, s.max_body_bytes) == (
        str(model_path), "k-from-env", tmp_path / "st", 3, 2048)
    assert (s.exit_on_failure, s.drain_timeout_s, s.kv_mode, s.kv_budget_bytes, s.commit, s.device) == (
        True, 5.0, "int8", 64 * 2**20, "deadbeef", "cpu")
    app = TinyLoopApp(s)
    app._ensure_state()
    wait_until(lambda: app.state.status != "loading", "the model to load", WAIT_S)
    try:
        body = post(app, "/api/v0/completions", {"model": "tl", "prompt": "Hi", "max_tokens": 2}, key="k-from-env")
        assert body.status == 200
        assert body.json()["runtime"]["commit"] == "deadbeef" and body.json()["runtime"]["device"] == "cpu"
        assert body.json()["runtime"]["activations"] == "fp16"
        assert body.json()["model_info"]["kv_cache_mode"] == "int8"
        assert app.state.engine.pool.budget_bytes == 64 * 2**20
        big = run(call(app, "POST", "/generate", body=b'{"prompt": "' + b"x" * 2100 + b'"}', key="k-from-env"))
        assert big.status == 413
        assert run(call(app, "GET", "/health", key="test-key")).status == 401
    finally:
        app.state.shutdown()
    monkeypatch.setenv("TINYLOOP_AUTH", "0")
    assert Settings.from_env().auth is False


# ------------------------------------------------------------------ Command line
def _synopsis() -> dict[str, str]:
    """The README's `## Command line` code block: command -> its usage text."""
    text = README.read_text()
    block = text.split("## Command line", 1)[1].split("```", 2)[1]
    usages, current = {}, None
    for line in block.splitlines():
        match = re.match(r"tinyloop (\S+)", line)
        if match:
            current = match.group(1)
            usages[current] = line
        elif current and line.strip():
            usages[current] += " " + line.strip()
    return usages


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_the_readme_synopsis_lists_every_command_and_option_with_their_defaults(capsys):
    """Every command has --help; the README's synopsis names every command and every
    option each one takes, and a default it writes (`[--port 8000]`) is the parser's
    default, or, where the default comes from a variable or the model, the option's help
    says it. `a|b` values are the choices."""
    usages, parsers = _synopsis(), _subparsers()
    assert set(usages) == set(parsers)
    for command, usage in usages.items():
        with pytest.raises(SystemExit) as exited:
            main([command, "--help"])
        assert exited.value.code == 0 and "usage: tinyloop " + command in capsys.readouterr().out
        actions = {opt: a for a in parsers[command]._actions for opt in a.option_strings}
        documented = set(re.findall(r"\[(--[a-z-]+)", usage)) | set(re.findall(r"\| (--[a-z-]+)", usage)) \
            | set(re.findall(r" (--[a-z-]+)", usage))
        options = {opt for opt in actions if opt.startswith("--") and opt != "--help"}
        assert documented == options, (command, documented ^ options)
        for option, value in re.findall(r"\[(--[a-z-]+) ([^\]\s]+)", usage):
            action = actions[option]
            if value == action.metavar or value.split(".")[0].isupper() or value.startswith("{") or "," in value:
                continue                                  # a placeholder (MODE, N, FILE.png, D,V,AHEAD,K, {8,4,2})
            if "|" in value:
                if action.choices is not None:
                    assert set(value.split("|")) <= set(action.choices), (command, option)
                else:
                    assert all(v in (action.help or "") for v in value.split("|") if not v.isupper()), \
                        (command, option)
                continue
            if action.default is not None:
                assert str(action.default) == value or float(action.default) == float(value), (command, option)
            else:
                assert value in (action.help or ""), (command, option, action.help)


def test_every_default_a_help_text_states_is_the_parsers():
    """`--help` says "(default 128)", "(default 127.0.0.1, ...)": the value the parser
    really uses. (Defaults that come from a variable, "$TINYLOOP_X or Y", are the
    Settings tests'; ones computed from the model or the machine say so in words.)"""
    checked = []
    for command, parser in _subparsers().items():
        for action in parser._actions:
            found = re.search(r"\(default ([^\s,;:)$]+)", action.help or "")
            if not found or action.default is None:
                continue
            value = found.group(1)
            try:
                same = float(action.default) == float(value)
            except (TypeError, ValueError):
                same = str(action.default) == value
            assert same, (command, action.option_strings, action.default, action.help)
            checked.append((command, action.dest))
    assert len(checked) >= 10, checked


def test_quantize_embeddings_quantizes_the_embeddings_and_the_head_too(tmp_path, capsys):
    """`quantize --quantize-embeddings` (RTN): embed and head become quantized weights,
    within one quantization step of their float values; without it they stay as stored."""
    from tinyloop.model.modelfile import ModelFile
    from tinyloop.model.quant import QuantizedTensor, dequantize
    source = tmp_path / "tiny.tinyloop"
    make_test_model(source, "tiny-looped", seed=0)                          # an untied head
    for flag, out in [(True, tmp_path / "q-emb.tinyloop"), (False, tmp_path / "q.tinyloop")]:
        assert main(["quantize", str(source), str(out), "--bits", "8", "--group-size", "32", "--method", "rtn",
                     *(["--quantize-embeddings"] if flag else [])]) == 0
        with ModelFile(source) as original, ModelFile(out) as quantized:
            for name in ("embed.weight", "head.weight"):
                stored = quantized.get(name)
                assert isinstance(stored, QuantizedTensor) is flag, (name, flag)
                if flag:
                    dense = np.asarray(original.get(name), np.float32)
                    groups = dense.reshape(dense.shape[0], -1, 32)
                    step = (groups.max(axis=-1) - groups.min(axis=-1)) / 255                  # 8 bits, groups of 32
                    error = np.abs(dequantize(stored)[:, :dense.shape[1]] - dense).reshape(groups.shape)
                    assert (error <= step[..., None] + 1e-3).all(), name
    capsys.readouterr()


# ------------------------------------------------------------------ KV cache modes
@pytest.mark.parametrize("window, rows", [(1, 128), (62, 128), (63, 192), (64, 192), (126, 192), (127, 256),
                                          (500, 576), (1000, 1088)])
def test_a_window_is_a_ring_of_window_plus_66_rows_rounded_up_to_64(window, rows):
    assert physical_rows_needed(100_000, window) == rows
    assert physical_rows_needed(5000, window) == rows


def test_the_default_kv_pool_is_4_gib_capped_at_a_quarter_of_memory_or_the_devices_share(monkeypatch):
    gib = 2**30

    class Backend:
        def __init__(self, device_share):
            self.device_share = device_share

        def kv_pool_bytes(self):
            return self.device_share

    class Model:
        def __init__(self, device_share=None):
            self.backend = Backend(device_share)

    for memory, expected in [(64 * gib, 4 * gib), (8 * gib, 2 * gib), (None, 4 * gib)]:
        monkeypatch.setattr(kv_pool, "physical_memory_bytes", lambda memory=memory: memory)
        assert kv_pool.default_pool_bytes(Model()) == expected, memory
    assert kv_pool.default_pool_bytes(Model(device_share=70 * gib)) == 70 * gib      # a GPU: half its free memory


@pytest.mark.parametrize("env, named", [
    ({"TINYLOOP_KV_INT8": "1", "TINYLOOP_KV_INT4": "1"}, ("TINYLOOP_KV_INT8", "TINYLOOP_KV_INT4")),
    ({"TINYLOOP_KV_CACHE": "fp32", "TINYLOOP_KV_INT8": "1"}, ("TINYLOOP_KV_CACHE", "TINYLOOP_KV_INT8")),
])
def test_kv_settings_that_disagree_stop_serve_at_startup_naming_them(tmp_path, monkeypatch, capsys, env, named,
                                                                    granian_started):
    """README (KV cache modes): settings that disagree stop the server at startup with a
    message naming them: `tinyloop serve` exits 2 before Granian would start."""
    _clean_env(monkeypatch, tmp_path)
    monkeypatch.setenv("TINYLOOP_API_KEY", "k" * 32)
    path = tmp_path / "m.tinyloop"
    make_test_model(path, "tiny-looped", seed=0)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["serve", "--model", str(path)]) == 2 and not granian_started
    err = capsys.readouterr().err
    assert err.startswith("tinyloop: error:") and all(name in err for name in named), err


# ------------------------------------------------------------------ Agents: schemas
ACCEPTED = {
    "type": {"type": "integer"},
    "properties, required": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    "additionalProperties": {"type": "object", "additionalProperties": {"type": "integer"}},
    "items": {"type": "array", "items": {"type": "integer"}},
    "prefixItems": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]},
    "minItems, maxItems": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3},
    "enum": {"enum": ["a", 1, None]},
    "const": {"const": "x"},
    "anyOf": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
    "oneOf": {"oneOf": [{"type": "integer"}, {"type": "boolean"}]},
    "allOf": {"allOf": [{"type": "integer"}, {"minimum": 3}]},
    "$ref, $defs": {"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"},
    "definitions": {"definitions": {"n": {"type": "integer"}}, "$ref": "#/definitions/n"},
    "minimum, maximum": {"type": "integer", "minimum": 0, "maximum": 9},
    "exclusiveMinimum, exclusiveMaximum": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
    "multipleOf": {"type": "integer", "multipleOf": 3},
    "minLength, maxLength": {"type": "string", "minLength": 1, "maxLength": 4},
    "pattern": {"type": "string", "pattern": "^[a-z]+$"},
    "format": {"type": "string", "format": "date"},
    "minProperties, maxProperties": {"type": "object", "minProperties": 1, "maxProperties": 2},
    "patternProperties": {"type": "object", "patternProperties": {"^x": {"type": "integer"}}},
    "annotations": {"type": "integer", "title": "t", "description": "d", "examples": [1], "default": 1},
}
REFUSED = {"not": {"not": {"type": "integer"}}, "if": {"if": {"type": "integer"}, "then": {"minimum": 1}},
           "uniqueItems": {"type": "array", "uniqueItems": True},
           "contains": {"type": "array", "contains": {"type": "integer"}},
           "dependentRequired": {"type": "object", "dependentRequired": {"a": ["b"]}},
           "colour": {"type": "object", "colour": "red"}}


@pytest.mark.parametrize("keywords", list(ACCEPTED))
def test_every_schema_keyword_the_readme_lists_compiles(keywords):
    assert json_schema_grammar(ACCEPTED[keywords], "response_format")


@pytest.mark.parametrize("keyword", list(REFUSED))
def test_every_keyword_the_readme_refuses_is_named_in_the_error(keyword):
    with pytest.raises(RequestError, match=f"'{keyword}'|{keyword}"):
        json_schema_grammar(REFUSED[keyword], "response_format")


@pytest.fixture(scope="module")
def grammar_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("claims-grammar") / "tiny.tinyloop"
    make_test_model(path, "tiny-looped", seed=3)
    return load_model(path)


def test_objects_that_do_not_mention_additional_properties_are_closed_and_json_is_compact(grammar_model):
    """No invented keys when `properties` is listed and `additionalProperties` is not;
    the text is JSON written with ", " and ": " and no other whitespace (json.dumps'
    default separators: an independent writer)."""
    loaded = grammar_model
    schemas = [{"type": "object", "properties": {}},
               {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string",
                                                                                 "pattern": "^[a-z]{0,3}$"}}}]
    finished = 0
    for schema in schemas:
        grammar = Grammar(json_schema_grammar(schema, "response_format"), loaded.tokenizer,
                          loaded.config.eos_token_ids, "response_format")
        for seed in range(12):
            out = generate(loaded.model, GenerationRequest(loaded.tokenizer.encode(f"object {seed}"), 60, loops=2,
                                                           grammar=grammar,
                                                           sampling=SamplingParams(temperature=1.5, seed=seed)),
                           tokenizer=loaded.tokenizer)
            keys = re.findall(r'"([^"]*)": ', out.text)          # string values cannot hold a quote here
            assert set(keys) <= set(schema["properties"]), (schema, out.text)
            if out.finish_reason == "stop":
                finished += 1
                value = orjson.loads(out.text)
                assert out.text == json.dumps(value), out.text
    assert finished >= 12, f"only {finished} of 24 outputs finished"


def test_annotations_are_accepted_and_change_nothing(grammar_model):
    """The same schema with and without annotations (title, description, examples,
    default): the same sampled tokens for the same seeds."""
    loaded = grammar_model
    bare = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "yy", 3]}}}
    annotated = {**bare, "title": "T", "description": "D", "examples": [{"a": 1}], "default": {"a": 2},
                 "properties": {"a": {"type": "integer", "description": "an a", "title": "A", "default": 4},
                                "b": {"enum": ["x", "yy", 3], "examples": ["x"]}}}
    outputs = []
    for schema in (bare, annotated):
        grammar = Grammar(json_schema_grammar(schema, "response_format"), loaded.tokenizer,
                          loaded.config.eos_token_ids, "response_format")
        outputs.append([generate(loaded.model, GenerationRequest(loaded.tokenizer.encode("x"), 40, loops=2,
                                                                 grammar=grammar,
                                                                 sampling=SamplingParams(temperature=1.2, seed=s)),
                                 tokenizer=loaded.tokenizer).tokens for s in range(4)])
    assert outputs[0] == outputs[1]


def test_tool_choice_none_leaves_the_tools_out_of_the_prompt(tmp_path):
    """Prompt sizes from the server's own usage: with `tool_choice: none` the prompt is
    the one without tools; with `auto` the declarations are in it (they count against
    the context)."""
    path = tmp_path / "eos.tinyloop"
    make_test_model(path, "tiny-looped", seed=3)                          # with an end-of-sequence token
    app = ready_app(path)
    tool = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                             "parameters": {"type": "object",
                                                            "properties": {"city": {"type": "string"}}}}}
    base = {"model": "tl", "messages": HELLO, "max_tokens": 1}
    sizes = {}
    for name, extra in [("bare", {}), ("none", {"tools": [tool], "tool_choice": "none"}),
                        ("auto", {"tools": [tool], "tool_choice": "auto"})]:
        response = post(app, CHAT, {**base, **extra})
        assert response.status == 200, response.body
        sizes[name] = response.json()["usage"]["prompt_tokens"]
    assert sizes["none"] == sizes["bare"] and sizes["auto"] > sizes["bare"] + 10, sizes
    app.state.shutdown()


@pytest.mark.parametrize("path", [CHAT, "/v1/completions", "/api/v0/chat/completions"])
def test_keep_alive_is_accepted_and_changes_nothing(model_path, path):
    """`keep_alive` as a duration string, a number or 0: a 200 with the same greedy text."""
    app = ready_app(model_path)
    body = {"model": "tl", "max_tokens": 6, "temperature": 0,
            **({"prompt": "Hello"} if path.endswith("/completions") and "chat" not in path else {"messages": HELLO})}

    def text(response):
        assert response.status == 200, response.body
        choice = response.json()["choices"][0]
        return choice["text"] if "text" in choice else choice["message"]["content"]

    plain = text(post(app, path, body))
    for keep_alive in ("5m", 300, 0, -1):
        assert text(post(app, path, {**body, "keep_alive": keep_alive})) == plain
    app.state.shutdown()


@pytest.mark.parametrize("arguments, status", [('{"city": "Paris"}', 200), ('{"q": "</tool_call> <b> & x"}', 200),
                                               ("{}", 200), ("[1]", 400), ('"Paris"', 400), ("5", 400),
                                               ("null", 400), ("{oops", 400), (None, 422)])
def test_history_tool_call_arguments_are_json_text_of_an_object(model_path, arguments, status):
    """README (Agents): assistant history `tool_calls` carry arguments as JSON text of an
    object (anything else: 400 naming the field; not a string: 422); any object is
    representable, tags and `&` included."""
    app = ready_app(model_path)
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
                {"role": "tool", "content": "sunny", "tool_call_id": "c1"}]
    response = post(app, CHAT, {"model": "tl", "messages": messages, "max_tokens": 2})
    assert response.status == status, response.body
    if status != 200:
        assert response.json()["error"]["param"] == "messages[1].tool_calls[0].function.arguments"
    app.state.shutdown()


# ------------------------------------------------------------------ Command line: new-model presets
def test_new_model_presets_have_the_readmes_shapes():
    """The README's preset table, written out; doc-407m's ~405M parameters counted here
    by hand from its shape (embeddings, 6 layer instances of attention + GELU MLP with
    biases and two LayerNorms, a final norm, a tied head)."""
    from tinyloop.model.testmodels import PRESETS, train_tokenizer
    p = PRESETS["tiny-looped"]
    assert (p["n_prelude"], p["n_core"], p["n_coda"], p["min_loops"], p["max_loops"], p["default_loops"]) == \
        (1, 2, 1, 1, 8, 4)
    assert (p["dim"], p["n_heads"], p["n_kv_heads"], p["norm"], p["mlp"], p["positions"]) == \
        (64, 4, 2, "rmsnorm", "swiglu", "rope")
    assert p["input_injection"] != "none" and p["tied_head"] is False
    p = PRESETS["tiny-looped-gpt"]
    assert (p["n_prelude"], p["n_core"], p["n_coda"], p["min_loops"], p["max_loops"]) == (0, 2, 0, 1, 6)
    assert (p["dim"], p["n_heads"], p["n_kv_heads"], p["norm"], p["mlp"], p["positions"], p["bias"]) == \
        (48, 3, 3, "layernorm", "gelu", "learned", True)
    assert p["tied_head"] is False
    p = PRESETS["tiny-standard"]
    assert (p["n_prelude"] + p["n_core"] + p["n_coda"], p["max_loops"], p["dim"], p["n_heads"], p["n_kv_heads"]) \
        == (3, 1, 64, 4, 1)
    assert p.get("tied_head", True) is True
    p = PRESETS["doc-407m"]
    assert (p["dim"], p["n_heads"], p["ffn_dim"], p["vocab_size"]) == (2048, 16, 8192, 50257)
    assert (p["n_prelude"], p["n_core"], p["n_coda"], p["min_loops"], p["max_loops"], p["default_loops"]) == \
        (1, 4, 1, 1, 64, 8)
    d, f, layers = 2048, 8192, 1 + 4 + 1
    per_layer = 4 * (d * d + d) + (d * f + f) + (f * d + d) + 2 * 2 * d
    parameters = 50257 * d + layers * per_layer + 2 * d
    assert 400e6 < parameters < 410e6                                     # "~405M parameters"
    assert train_tokenizer().get_vocab_size() == 512                      # "vocabulary 512"


# ------------------------------------------------------------------ the map itself
def test_every_test_named_in_claims_md_exists():
    """tests/CLAIMS.md names test nodes (`tests/test_x.py::test_y`, or S/B/C:: for the
    three server and claim files) and files; each must exist, so the map cannot rot."""
    tests_dir = Path(__file__).resolve().parent
    text = (tests_dir / "CLAIMS.md").read_text()
    short = {"S": "test_server_asgi.py", "B": "test_server_behaviour.py", "C": "test_claims.py"}
    nodes = re.findall(r"`(?:tests/(test_\w+\.py)|([SBC]))::(test_\w+)", text)
    assert len(nodes) > 150
    for file, letter, name in nodes:
        source = (tests_dir / (file or short[letter])).read_text()
        assert re.search(rf"^(async )?def {name}\(", source, re.M), f"{file or short[letter]}::{name}"
    for file in set(re.findall(r"`tests/(test_\w+\.py)", text)):
        assert (tests_dir / file).exists(), file


# ------------------------------------------------------------------ Self-speculative decoding
@pytest.mark.parametrize("branches", [1, 3])
def test_the_verify_pass_reuses_the_drafts_prelude_and_first_draft_loops_iterations(tiny, monkeypatch, branches):
    """Count the rows each layer instance (KV slot) runs after the prompt: every drafted node
    passes through the prelude and the first draft_loops iterations once (drafting it), and
    through the verify's deeper iterations once. A verify that recomputed the shared part
    would run the prelude twice per node; one that skipped reuse would break exactness too,
    but a recompute would not, so only a count shows it."""
    from collections import Counter

    from tinyloop.engine.speculative import SpeculativeParams
    model, config = tiny.model, tiny.model.config
    draft, verify = 2, 6
    prompt = [5, 6, 7]
    rows = Counter()
    layer_rows = type(model).layer_rows

    def counting(self, weights, h, parts, slots, capture=None):
        for (start, stop, part), slot in zip(parts.parts, slots):
            if part.plan.exact:                              # decode steps, drafts, verifies; not the prefill
                rows[slot] += stop - start
        return layer_rows(self, weights, h, parts, slots, capture)
    monkeypatch.setattr(type(model), "layer_rows", counting)
    params = SpeculativeParams(draft, verify, 3, branches)
    spec = generate(model, GenerationRequest(prompt, 24, ignore_eos=True, mode="speculative" if branches == 1
                                             else "tree_speculative", speculative=params))
    P, C = config.n_prelude, config.n_core
    prelude_rows = rows[0]
    assert prelude_rows > 0 and spec.speculative.rounds > 1
    for iteration in range(verify):
        for index in range(C):
            slot = P + iteration * C + index
            # the same rows through every core iteration, shared (< draft) or verify-only (>= draft)
            assert rows[slot] == prelude_rows, (iteration, index, rows[slot], prelude_rows)
    monkeypatch.undo()
    plain = generate(model, GenerationRequest(prompt, 24, loops=verify, ignore_eos=True))
    assert spec.tokens == plain.tokens


def test_the_readmes_python_entry_point_for_speculative_decoding_exists_and_is_exact(tiny):
    """The README names the Python call; read the names from the README, import them,
    and run a greedy chain: it must equal plain generation at verify_loops."""
    import importlib
    found = re.search(r"Python: `([\w.]+)\(model, request, SpeculativeParams\(\.\.\.\)\)`\s+"
                      r"\(`SpeculativeParams` from `([\w.]+)`\)", README.read_text())
    assert found, "the README's Python line for speculative decoding"
    module, _, name = found.group(1).rpartition(".")
    speculative_generate = getattr(importlib.import_module(module), name)
    params = importlib.import_module(found.group(2)).SpeculativeParams(2, 6, 3, 1)
    plain = generate(tiny.model, GenerationRequest([5, 6, 7], 16, loops=6, ignore_eos=True))
    spec = speculative_generate(tiny.model, GenerationRequest([5, 6, 7], 16, ignore_eos=True), params)
    assert spec.tokens == plain.tokens and len(spec.tokens) == 16
