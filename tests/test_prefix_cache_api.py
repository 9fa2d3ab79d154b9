"""What the prefix cache and the batching engine report through the HTTP API: OpenAI's
usage.prompt_tokens_details.cached_tokens, stats.cached_tokens and stats.queue_ms on /api/v0
and the native routes, and /metrics (prefix-cache lookups by outcome, cached blocks, KV
blocks, the batch-size histogram); TINYLOOP_PREFIX_CACHE=0 reports no reuse."""
import re

import pytest
from asgi_client import call, run
from test_server_asgi import ready_app

from tinyloop.engine.generate import GenerationRequest, generate

SYSTEM = "You are the helpful assistant of a large library. " * 8         # about 200 tokens


def chat(app, question, path="/v1/chat/completions", **extra):
    body = {"model": "tl", "max_tokens": 4, "temperature": 0, "loops": 4,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}], **extra}
    response = run(call(app, "POST", path, body))
    assert response.status == 200, response.body
    return response.json()


def metric(app, name, **labels):
    text = run(call(app, "GET", "/metrics")).body.decode()
    label = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = "^" + re.escape(name + (f"{{{label}}}" if label else "")) + r" (\S+)$"
    return float(re.search(pattern, text, re.MULTILINE).group(1))


@pytest.fixture(scope="module")
def app(model_path):
    return ready_app(model_path, max_running=4)


def test_a_second_question_reports_its_cached_prompt_tokens(app):
    first = chat(app, "Where are the maps?")
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    hits_before = metric(app, "tinyloop_prefix_cache_lookups_total", outcome="hit")
    second = chat(app, "Where are the atlases?")
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 128 and cached % 64 == 0 and cached < second["usage"]["prompt_tokens"]
    assert metric(app, "tinyloop_prefix_cache_lookups_total", outcome="hit") == hits_before + cached
    assert metric(app, "tinyloop_prefix_cache_blocks") > 0
    # the answer is the cold one: what the engine gives that prompt with nothing cached
    loaded = app.state.loaded
    ids = loaded.with_bos(app.state.template.render(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Where are the atlases?"}],
        loaded.tokenizer, None))
    cold = generate(loaded.model, GenerationRequest(ids, 4, loops=4, ignore_eos=True,
                                                    stop_token_ids=tuple(app.state.template.end_of_turn_ids(
                                                        loaded.tokenizer))))
    assert second["choices"][0]["message"]["content"] == loaded.tokenizer.decode(cold.tokens)


def test_stats_carry_cached_tokens_and_queue_time(app):
    chat(app, "Warm the cache.", path="/api/v0/chat/completions")
    body = chat(app, "Now read from it.", path="/api/v0/chat/completions")
    assert body["stats"]["cached_tokens"] >= 128 and body["stats"]["queue_ms"] >= 0
    native = run(call(app, "POST", "/generate", {"prompt": SYSTEM + " Native?", "max_tokens": 2, "loops": 4}))
    again = run(call(app, "POST", "/generate", {"prompt": SYSTEM + " Native again?", "max_tokens": 2, "loops": 4}))
    assert native.status == again.status == 200 and again.json()["stats"]["cached_tokens"] >= 128


def test_metrics_show_the_engine_and_its_kv_blocks(app):
    chat(app, "Count me.")
    assert metric(app, "tinyloop_engine_steps_total") > 0
    assert metric(app, "tinyloop_engine_batch_size_count") == metric(app, "tinyloop_engine_steps_total")
    free = metric(app, "tinyloop_kv_blocks", state="free")
    idle = metric(app, "tinyloop_kv_blocks", state="cached_idle")
    assert free > 0 and idle > 0 and metric(app, "tinyloop_kv_blocks", state="held") == 0     # nothing runs now
    assert metric(app, "tinyloop_kv_block_bytes") > 0 and metric(app, "tinyloop_generations_running") == 0
    finished = sum(n for n in app.state.metrics.generations.values())
    assert metric(app, "tinyloop_queue_seconds_count") == finished and metric(app, "tinyloop_queue_seconds_sum") >= 0


def test_the_cache_turned_off_reuses_nothing(model_path):
    off = ready_app(model_path, prefix_cache=False)
    chat(off, "Where are the maps?")
    assert chat(off, "Where are the atlases?")["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert "tinyloop_prefix_cache_lookups_total" not in run(call(off, "GET", "/metrics")).body.decode()
