"""Security checks: the key compared in constant time; no key, prompt or generated text
in a real server's log at the default level; loopback by default and a warning when
binding elsewhere without a key; size, nesting, string-length and token limits enforced
before anything is queued."""
import asyncio
import hmac
import time

import httpx
import orjson
import pytest
from asgi_client import call, run
from live_server import LiveServer
from test_server_asgi import ready_app

import asgi.auth
from asgi.schema import MAX_MESSAGES, MAX_STOP_LENGTH, MAX_STOP_STRINGS
from tinyloop.cli import build_parser, is_loopback, main
from tinyloop.model.testmodels import make_test_model

KEY = "tl-Secret-Key-For-The-Log-Test-0123456789"
MARKER = "Zanzibar-quokka-7731"               # a prompt no log line has any reason to contain
# what `tinyloop serve` writes into os.environ for Granian's worker
SERVE_SETS = ("TINYLOOP_MODEL_PATH", "TINYLOOP_MAX_WAITING", "TINYLOOP_AUTH", "TINYLOOP_STATE_DIR",
              "TINYLOOP_DEVICE", "TINYLOOP_EXIT_ON_FAILURE", "TINYLOOP_KV_CACHE", "TINYLOOP_DRAIN_TIMEOUT")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("security") / "tiny.tinyloop"
    make_test_model(path, "tiny-looped", seed=0, eos_token_ids=(), max_seq_len=256)
    return path


# ----------------------------------------------------------------------- the key compare
def test_the_key_is_compared_with_hmac_compare_digest(monkeypatch):
    """Pinned: a plain == leaks how much of a guess matched through its timing."""
    calls, real = [], hmac.compare_digest

    def spy(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(asgi.auth.hmac, "compare_digest", spy)
    assert asgi.auth.authorized([(b"authorization", b"Bearer " + KEY.encode())], KEY)
    assert not asgi.auth.authorized([(b"authorization", b"Bearer " + KEY[:-1].encode())], KEY)
    assert not asgi.auth.authorized([(b"authorization", b"Bearer " + KEY.encode() + b"x")], KEY)
    assert calls == [(KEY.encode(), KEY.encode()), (KEY[:-1].encode(), KEY.encode()),
                     (KEY.encode() + b"x", KEY.encode())]
    assert not asgi.auth.authorized([(b"authorization", b"Basic " + KEY.encode())], KEY)
    assert not asgi.auth.authorized([], KEY)


# ----------------------------------------------------------------------------- the logs
def test_no_key_prompt_or_generated_text_in_the_log_at_the_default_level(model_path):
    texts = []
    with LiveServer(model_path, key=KEY) as server:
        post = lambda path, body: httpx.post(f"{server.base}{path}", json=body, headers=server.auth,  # noqa: E731
                                             timeout=60)
        chat = post("/v1/chat/completions", {"model": "m", "max_tokens": 24,
                                             "messages": [{"role": "user", "content": MARKER}]})
        texts.append(chat.json()["choices"][0]["message"]["content"])
        texts.append(post("/api/v0/completions", {"model": "m", "prompt": MARKER, "max_tokens": 24}).json()
                     ["choices"][0]["text"])
        texts.append(post("/generate", {"prompt": MARKER, "max_tokens": 24}).json()["text"])
        streamed = post("/generate/speculative", {"prompt": MARKER, "max_tokens": 24, "stream": True,
                                                  "draft_loops": 1, "verify_loops": 4})
        texts.append("".join(orjson.loads(line[6:])["text"] for line in streamed.text.splitlines()
                             if line.startswith("data: {")))
        # Requests that fail in every way a client can make them fail, the prompt inside each.
        assert post("/generate", {"prompt": MARKER, "max_tokens": 10 ** 6}).status_code == 400
        assert post("/generate", {"prompt": MARKER, "bogus": MARKER}).status_code == 400
        assert post("/v1/chat/completions", {"model": "m", "messages": [{"role": MARKER, "content": MARKER}]}
                    ).status_code == 400
        assert httpx.post(f"{server.base}/generate", content=b'{"prompt": "' + MARKER.encode(),
                          headers=server.auth).status_code == 400
        assert httpx.post(f"{server.base}/generate", json={"prompt": MARKER},
                          headers={"Authorization": f"Bearer {KEY}x"}).status_code == 401
        with httpx.stream("POST", f"{server.base}/generate", json={"prompt": MARKER, "stream": True,
                                                                    "max_tokens": 200}, headers=server.auth) as r:
            next(r.iter_raw())                         # then leave mid-stream
        server.stop()
        log = server.log()
    assert "model" in log and "loaded" in log          # the log was captured: the startup line is in it
    assert KEY not in log and KEY[3:20] not in log
    assert MARKER not in log
    for text in texts:
        for piece in (text[i:i + 12] for i in range(0, max(1, len(text) - 12), 6)):
            assert len(piece.strip()) < 8 or piece not in log, f"generated text {piece!r} is in the log"


# --------------------------------------------------------------------------- the bind address
def test_serve_binds_loopback_by_default():
    assert build_parser().parse_args(["serve"]).host == "127.0.0.1"


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.8.9.1", True), ("::1", True),
                                            ("[::1]", True), ("localhost", True), ("0.0.0.0", False),
                                            ("::", False), ("192.168.1.20", False), ("example.org", False)])
def test_loopback_addresses(host, loopback):
    assert is_loopback(host) is loopback


@pytest.fixture
def serve(tmp_path, monkeypatch, model_path, granian_started):
    """`tinyloop serve ...` up to where Granian would start; returns its stderr."""
    for name in SERVE_SETS:
        monkeypatch.setenv(name, "")         # recorded, so what `serve` writes to os.environ is undone
        monkeypatch.delenv(name)
    monkeypatch.setenv("TINYLOOP_API_KEY", KEY)

    def run_serve(*flags, capsys):
        assert main(["serve", "--model", str(model_path), *flags]) == 0
        return capsys.readouterr().err
    return run_serve


def test_binding_beyond_loopback_without_a_key_warns(serve, capsys):
    err = serve("--host", "0.0.0.0", "--no-auth", capsys=capsys)
    assert "WARNING" in err and "0.0.0.0" in err and "authentication OFF" in err


@pytest.mark.parametrize("flags", [("--host", "0.0.0.0"), ("--no-auth",), ("--host", "::1", "--no-auth")])
def test_no_warning_with_a_key_or_on_loopback(serve, capsys, flags):
    assert "WARNING" not in serve(*flags, capsys=capsys)


# ------------------------------------------------------------------ limits before queueing
def oversized_requests(context: int) -> list[tuple[str, dict | bytes, int, str]]:
    """(path, body, status, error code or param) for each limit."""
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    nested = b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    return [
        ("/generate", b'{"prompt": "' + b"x" * (1 << 20) + b'"}', 413, "body_too_large"),
        ("/generate", nested, 400, "invalid_json"),                              # nesting past the parser's limit
        ("/generate", {"prompt": "word " * (context * 2)}, 400, "context_length_exceeded"),
        ("/generate", {"prompt": list(range(context + 1))}, 400, "context_length_exceeded"),
        ("/generate", {"prompt": "Hi", "max_tokens": 8193}, 400, "max_tokens"),
        ("/generate", {"prompt": "Hi", "max_tokens": context}, 400, "context_length_exceeded"),
        ("/v1/chat/completions", {**chat, "stop": ["s"] * (MAX_STOP_STRINGS + 1)}, 400, "stop"),
        ("/v1/chat/completions", {**chat, "stop": "s" * (MAX_STOP_LENGTH + 1)}, 400, "stop"),
        ("/v1/chat/completions", {**chat, "messages": chat["messages"] * (MAX_MESSAGES + 1)}, 400, "messages"),
        ("/generate", {"prompt": "Hi", "stop": list(range(1025))}, 400, "stop"),
        ("/generate/tree_speculative", {"prompt": "Hi", "K_branches": 17}, 400, "K_branches"),
        ("/generate/speculative", {"prompt": "Hi", "draft_ahead": 17}, 400, "draft_ahead"),
    ]


def test_every_limit_is_enforced_before_the_request_is_queued(model_path):
    """With the engine busy and no waiting place left, anything that got as far as the
    queue would be a 429: each over-limit request must get its own 4xx instead, and the
    admission counter must not move."""
    app = ready_app(model_path, max_waiting=0, max_body_bytes=1 << 20)
    engine = app.state.engine
    context = app.state.loaded.config.max_seq_len

    async def scenario():
        busy = asyncio.ensure_future(call(app, "POST", "/generate", {"prompt": "Hi", "max_tokens": 200,
                                                                     "loops": 8}))
        deadline = time.monotonic() + 30
        while engine.running == 0:
            assert time.monotonic() < deadline, "the first generation did not start"
            await asyncio.sleep(0.005)
        full = await call(app, "POST", "/generate", {"prompt": "Hi", "max_tokens": 2})
        answers = []
        for path, body, _, _ in oversized_requests(context):
            raw = body if isinstance(body, bytes) else orjson.dumps(body)
            answers.append(await call(app, "POST", path, body=raw))
        running_during = engine.running
        await busy
        return full, answers, running_during

    full, answers, running_during = run(scenario())
    assert full.status == 429                        # the queue really was full
    assert running_during == 1
    for (path, _, status, what), answer in zip(oversized_requests(context), answers):
        error = answer.json()["error"]
        assert answer.status == status and what in (error["code"], error["param"]), (path, what, answer.body[:200])
    metrics = run(call(app, "GET", "/metrics")).body.decode()
    assert "tinyloop_admitted_total 1\n" in metrics and 'tinyloop_refused_total{reason="queue_full"} 1\n' in metrics
