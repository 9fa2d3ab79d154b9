"""End to end: a real Granian process serving a tiny model, the real `openai` client,
and raw HTTP for the edges (auth, 4xx classes, SSE bytes, 429, disconnects)."""
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import orjson
import pytest
from asgi_client import wait_until

from tinyloop.engine.generate import GenerationRequest, generate
from tinyloop.engine.sampling import SamplingParams
from tinyloop.model.loader import load_model

KEY = "e2e-test-key"
ROOT = Path(__file__).resolve().parent.parent
MAX_WAITING = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]



@pytest.fixture(scope="module")
def server(model_path, tmp_path_factory):
    port = free_port()
    env = {**os.environ, "TINYLOOP_MODEL_PATH": str(model_path), "TINYLOOP_API_KEY": KEY,
           "TINYLOOP_MAX_WAITING": str(MAX_WAITING), "TINYLOOP_STATE_DIR": str(tmp_path_factory.mktemp("st")),
           "TINYLOOP_MAX_RUNNING": "1"}          # the one-at-a-time contract these tests queue on
    log = open(tmp_path_factory.mktemp("log") / "granian.log", "w+")
    process = subprocess.Popen([sys.executable, "-m", "granian", "--interface", "asgi", "--host", "127.0.0.1",
                                "--port", str(port), "asgi.app:app"], cwd=ROOT, env=env, stdout=log,
                               stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{base}/health", headers=auth(), timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("server did not become ready")
        if process.poll() is not None:
            log.seek(0)
            raise AssertionError("granian exited:\n" + log.read())
        yield base
    finally:
        process.terminate()
        process.wait(timeout=20)
        log.seek(0)
        output = log.read()
        assert KEY not in output, "the API key appeared in the server log"


def auth(key=KEY):
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)


def metric(server, name: str) -> float:
    text = httpx.get(f"{server}/metrics", headers=auth()).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_idle(server):
    for _ in range(500):
        if metric(server, "tinyloop_generations_running") == 0 and \
                metric(server, "tinyloop_generations_waiting") == 0:
            return
        time.sleep(0.02)
    raise AssertionError("engine did not become idle")


# ----------------------------------------------------------------------------- openai SDK
def test_sdk_chat_and_completions(client):
    chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hello"}],
                                          max_tokens=8, temperature=0)
    assert chat.object == "chat.completion" and chat.choices[0].finish_reason == "length"
    assert chat.usage.completion_tokens == 8 and isinstance(chat.choices[0].message.content, str)
    completion = client.completions.create(model="tiny", prompt="The looped", max_tokens=5, temperature=0)
    assert completion.object == "text_completion" and completion.usage.completion_tokens == 5
    models = client.models.list()
    assert models.data[0].owned_by == "tinyloop"


def test_sdk_streaming_matches_non_streaming_and_usage_only_when_asked(client):
    request = dict(model="tiny", messages=[{"role": "user", "content": "Tell me"}], max_tokens=12, temperature=0)
    whole = client.chat.completions.create(**request).choices[0].message.content
    chunks = list(client.chat.completions.create(**request, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    assert all(c.usage is None for c in chunks)
    with_usage = list(client.chat.completions.create(**request, stream=True,
                                                     stream_options={"include_usage": True}))
    assert with_usage[-1].choices == [] and with_usage[-1].usage.completion_tokens == 12
    assert with_usage[-2].choices[0].finish_reason == "length"
    text_chunks = list(client.completions.create(model="tiny", prompt="Tell me", max_tokens=6, stream=True,
                                                 temperature=0))
    assert text_chunks[-1].choices[0].finish_reason == "length"


def test_sdk_stop_strings_seeds_and_extensions(client):
    base = dict(model="tiny", prompt="Once", max_tokens=30, temperature=0)
    full = client.completions.create(**base).choices[0].text
    stop = full[8:11]
    stopped = client.completions.create(**base, stop=[stop])
    assert stopped.choices[0].text == full[:full.index(stop)] and stopped.choices[0].finish_reason == "stop"
    sampled = [client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=10, temperature=1.0, seed=seed).choices[0].message.content
               for seed in (5, 5, 6)]
    assert sampled[0] == sampled[1] != sampled[2]
    shallow = client.completions.create(**base, extra_body={"loops": 1}).choices[0].text
    assert shallow != full
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(**base, extra_body={"loops": 99})
    assert "loops" in str(err.value)


def test_sdk_api_v0_speculative(server):
    lm = openai.OpenAI(base_url=f"{server}/api/v0", api_key=KEY, max_retries=0)
    request = dict(model="tiny", prompt="Once", max_tokens=16, temperature=0)
    plain = lm.completions.create(**request, extra_body={"loops": 8})
    tree = lm.completions.create(**request, extra_body={"mode": "tree_speculative", "K_branches": 2})
    assert tree.choices[0].text == plain.choices[0].text
    assert tree.model_extra["stats"]["mode"] == "tree_speculative"


def test_sdk_errors_map_to_sdk_exceptions(client):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], n=2)
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                       max_tokens="many")


# ----------------------------------------------------------------------------- raw HTTP
@pytest.mark.parametrize("kwargs, status", [
    (dict(headers={}), 401),
    (dict(headers=auth("nope")), 401),
    (dict(content=b"{oops"), 400),
    (dict(content=b"\xff\xfe"), 400),
    (dict(content=b"[]"), 422),
    (dict(content=b'{"model": "m"}'), 422),
    (dict(content=b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": 7}'), 400),
    (dict(content=b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": NaN}'), 400),
    (dict(content=b"x" * (2 << 20)), 413),
    (dict(content=b"{}", headers={**auth(), "content-type": "text/plain"}), 415),
])
def test_raw_4xx_classes(server, kwargs, status):
    headers = kwargs.pop("headers", auth())
    headers = {"content-type": "application/json", **headers}
    response = httpx.post(f"{server}/v1/chat/completions", headers=headers, timeout=30, **kwargs)
    assert response.status_code == status
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_raw_routes_and_health(server):
    assert httpx.get(f"{server}/nowhere", headers=auth()).status_code == 404
    assert httpx.get(f"{server}/v1/completions", headers=auth()).status_code == 405
    assert httpx.get(f"{server}/health", headers=auth()).json()["status"] == "ready"
    assert httpx.get(f"{server}/health").status_code == 401
    assert "/generate/speculative" in httpx.get(f"{server}/openapi.json", headers=auth()).json()["paths"]


SSE_EVENT = re.compile(rb"data: (\{.*?\}|\[DONE\])\n\n", re.S)


def test_sse_framing_byte_for_byte(server):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "stream": True,
            "temperature": 0}
    raw = httpx.post(f"{server}/v1/chat/completions", headers=auth(), json=body).content
    events = SSE_EVENT.findall(raw)
    assert b"".join(b"data: " + e + b"\n\n" for e in events) == raw     # nothing else on the wire
    assert events[-1] == b"[DONE]" and raw.endswith(b"data: [DONE]\n\n")
    first = orjson.loads(events[0])
    assert first["choices"][0] == {"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}
    assert orjson.loads(events[-2])["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "length"}
    native = httpx.post(f"{server}/generate", headers=auth(), json={"prompt": "Hi", "max_tokens": 3,
                                                                    "stream": True}).content
    lines = SSE_EVENT.findall(native)
    assert [set(orjson.loads(e)) for e in lines[:3]] == [{"token_id", "text"}] * 3
    assert orjson.loads(lines[3])["token_id"] == -1 and lines[4] == b"[DONE]"


def test_utf8_safe_deltas_keep_a_split_character_whole(server, model_path):
    """Find a sampled output where a multi-byte character spans two tokens; stream it."""
    loaded = load_model(model_path)
    tok = loaded.tokenizer
    prompt = "café 東京 🚀"
    for seed in range(400):
        result = generate(loaded.model, GenerationRequest(tok.encode(prompt), 30,
                                                          sampling=SamplingParams(temperature=1.0, top_k=50,
                                                                                  top_p=0.9, seed=seed)))
        split = _split_character(tok, result.tokens)
        if split:
            break
    else:
        pytest.skip("no sampled output splits a character across tokens")
    raw = httpx.post(f"{server}/generate", headers=auth(), json={
        "prompt": prompt, "max_tokens": 30, "temperature": 1.0, "top_k": 50, "top_p": 0.9, "sample_seed": seed,
        "stream": True}).content
    raw.decode("utf-8")                                          # every byte on the wire is valid UTF-8
    events = [orjson.loads(e) for e in SSE_EVENT.findall(raw)[:-1]]
    assert [e["token_id"] for e in events[:-1]] == result.tokens
    texts = [e["text"] for e in events]
    assert any(split in text for text in texts), (split, texts)
    assert "".join(texts) == tok.decode(result.tokens)


def _split_character(tok, tokens) -> str | None:
    data, bounds = b"", set()
    for token in tokens:
        data += tok.token_bytes[token]
        bounds.add(len(data))
    position = 0
    while position < len(data):
        lead = data[position]
        width = 1 if lead < 0x80 else 2 if lead >> 5 == 6 else 3 if lead >> 4 == 14 else 4 if lead >> 3 == 30 else 1
        try:
            char = data[position:position + width].decode("utf-8")
            if width > 1 and any(position < b < position + width for b in bounds):
                return char
        except UnicodeDecodeError:
            pass
        position += width
    return None


# ----------------------------------------------------------------------------- admission
LONG = {"prompt": "Hi", "max_tokens": 450, "loops": 8}


def test_429_under_concurrent_load(server):
    wait_idle(server)
    results, lock = [], threading.Lock()

    def fire(body):
        response = httpx.post(f"{server}/generate", headers=auth(), json=body, timeout=60)
        with lock:
            results.append((response.status_code, response.headers.get("retry-after")))

    first = threading.Thread(target=fire, args=(LONG,))
    first.start()
    wait_until(lambda: metric(server, "tinyloop_generations_running") >= 1, "the long generation to start")
    waiters = [threading.Thread(target=fire, args=({"prompt": "Hi", "max_tokens": 2},))
               for _ in range(MAX_WAITING)]
    for t in waiters:
        t.start()
    wait_until(lambda: metric(server, "tinyloop_generations_waiting") >= MAX_WAITING, "the queue to fill")
    refused = [threading.Thread(target=fire, args=({"prompt": "Hi", "max_tokens": 2},)) for _ in range(3)]
    for t in refused:
        t.start()
    for t in refused:
        t.join(60)
        assert not t.is_alive(), "a refused request got no answer within 60 s"
    assert metric(server, "tinyloop_generations_running") == 1
    assert sorted(results) == [(429, "1")] * 3                 # only the refused ones are back yet
    for t in [first] + waiters:
        t.join(120)
        assert not t.is_alive(), "an admitted request got no answer within 120 s"
    assert sorted(status for status, _ in results) == [200] * (1 + MAX_WAITING) + [429] * 3


def _cancelled(server) -> float:
    text = httpx.get(f"{server}/metrics", headers=auth()).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("tinyloop_generations_total") and 'finish_reason="cancelled"' in line)


def test_disconnect_mid_stream_stops_the_generation(server):
    wait_idle(server)
    cancelled, tokens = _cancelled(server), metric(server, "tinyloop_completion_tokens_total")
    with httpx.stream("POST", f"{server}/generate", headers=auth(), json={**LONG, "stream": True}) as response:
        for count, _ in enumerate(response.iter_lines()):
            if count >= 6:
                break
    wait_idle(server)
    assert _cancelled(server) == cancelled + 1
    assert metric(server, "tinyloop_completion_tokens_total") - tokens < LONG["max_tokens"]
    quick = httpx.post(f"{server}/generate", headers=auth(), json={"prompt": "Hi", "max_tokens": 3})
    assert quick.status_code == 200 and len(quick.json()["tokens"]) == 3


def test_disconnect_mid_non_stream_stops_the_generation(server):
    wait_idle(server)
    cancelled, tokens = _cancelled(server), metric(server, "tinyloop_completion_tokens_total")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server}/generate", headers=auth(), json=LONG, timeout=httpx.Timeout(5, read=0.3))
    wait_idle(server)
    assert _cancelled(server) == cancelled + 1
    assert metric(server, "tinyloop_completion_tokens_total") - tokens < LONG["max_tokens"]
    assert httpx.post(f"{server}/generate", headers=auth(), json={"prompt": "Hi", "max_tokens": 2}).status_code == 200
