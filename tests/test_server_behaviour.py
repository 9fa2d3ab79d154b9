"""Server behaviour the README promises, checked at the ASGI level with the real engine:
a client that leaves stops its generation within one engine step; /v1 has no hidden
top_k; native defaults are the API document's; stream final events carry stats;
TINYLOOP_EXIT_ON_FAILURE makes a failed worker exit (a real process and signal)."""
import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from asgi_client import call, run
from test_server_asgi import ready_app

WAIT_S = 30



@pytest.fixture(scope="module")
def app(model_path):
    return ready_app(model_path)


class EngineSpy:
    """Wraps the real engine's submit and cancel (instance attributes shadow the methods):
    records each request, counts its token events, and can hold the engine thread at
    the n-th token, letting the client disconnect there, until the server cancels."""

    def __init__(self, engine, hold_at=None, on_hold=None):
        self.engine, self.hold_at, self.on_hold = engine, hold_at, on_hold
        self.requests, self.tokens, self.final = [], 0, None
        self.tokens_at_cancel = None
        self.cancelled, self.done = threading.Event(), threading.Event()
        self.problem = None
        real_submit, real_cancel = engine.submit, engine.cancel

        def submit(request, on_event=None):
            self.requests.append(request)
            return real_submit(request, self._wrap(on_event))

        def cancel(submission):
            if self.tokens_at_cancel is None:
                self.tokens_at_cancel = self.tokens
            real_cancel(submission)
            self.cancelled.set()
        engine.submit, engine.cancel = submit, cancel

    def _wrap(self, on_event):
        def wrapped(kind, payload):
            if kind == "token":
                self.tokens += 1
                if self.tokens == self.hold_at:
                    self.on_hold()
                    if not self.cancelled.wait(WAIT_S):
                        self.problem = f"the server did not cancel within {WAIT_S} s of the disconnect"
            else:
                self.final = (kind, payload)
                self.done.set()
            on_event(kind, payload)
        return wrapped

    def remove(self):
        del self.engine.submit, self.engine.cancel


@pytest.mark.parametrize("path, body", [
    ("/generate", {"prompt": "Hi", "max_tokens": 400, "loops": 8, "stream": True}),
    ("/generate", {"prompt": "Hi", "max_tokens": 400, "loops": 8}),
    ("/v1/chat/completions", {"model": "tl", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 400,
                              "stream": True}),
    ("/generate/speculative", {"prompt": "Hi", "max_tokens": 400, "draft_loops": 1, "verify_loops": 4,
                               "draft_ahead": 3, "stream": True}),
])
def test_a_client_that_leaves_is_cancelled_within_one_engine_step(app, path, body):
    """The engine is held at the 4th token while the client disconnects; the server must
    cancel it then, and no further step may run: plain decoding ends with exactly those
    4 tokens, a speculative round with at most the rest of its round."""
    async def scenario():
        loop = asyncio.get_running_loop()
        gone = asyncio.Event()
        spy = EngineSpy(app.state.engine, hold_at=4, on_hold=lambda: loop.call_soon_threadsafe(gone.set))
        try:
            await asyncio.wait_for(call(app, "POST", path, body, disconnect_now=gone), WAIT_S)
            assert await loop.run_in_executor(None, spy.done.wait, WAIT_S), "the generation never ended"
        finally:
            spy.remove()
        assert spy.problem is None, spy.problem
        kind, result = spy.final
        assert kind == "done" and result.finish_reason == "cancelled"
        assert spy.tokens_at_cancel == 4
        round_rest = body.get("draft_ahead", 0)           # tokens a speculative round may add after the 4th
        assert 4 <= result.completion_tokens <= 4 + round_rest
        assert spy.tokens == result.completion_tokens
        quick = await call(app, "POST", "/generate", {"prompt": "Hi", "max_tokens": 3})
        assert quick.status == 200 and len(quick.json()["tokens"]) == 3          # the engine is free

    run(scenario())


def sent_request(app, path, body):
    spy = EngineSpy(app.state.engine)
    try:
        response = run(call(app, "POST", path, body))
    finally:
        spy.remove()
    assert response.status == 200, response.body
    (request,) = spy.requests
    return request


def test_v1_sampling_has_no_hidden_top_k(app):
    for path, body in (("/v1/chat/completions", {"model": "tl", "messages": [{"role": "user", "content": "Hi"}]}),
                       ("/v1/completions", {"model": "tl", "prompt": "Hi"})):
        request = sent_request(app, path, {**body, "max_tokens": 2, "top_p": 0.5})
        assert request.sampling.top_k == 0 and request.sampling.top_p == 0.5
        assert request.sampling.temperature == 1.0                    # OpenAI's default
        request = sent_request(app, path, {**body, "max_tokens": 2, "top_k": 7})
        assert request.sampling.top_k == 7


def test_native_defaults_are_the_api_documents(app):
    request = sent_request(app, "/generate", {"prompt": [5, 6, 7]})
    s = request.sampling
    assert (s.temperature, s.top_k, s.top_p, s.repetition_penalty, s.seed) == (0.0, 50, 0.9, 1.0, 0)
    assert (s.presence_penalty, s.frequency_penalty) == (0.0, 0.0)
    assert request.loops is None and request.max_tokens == 128           # None: the model's default_loops
    stats = run(call(app, "POST", "/generate", {"prompt": [5, 6, 7], "max_tokens": 2})).json()["stats"]
    assert stats["loops_used"] == app.state.loaded.config.default_loops == 4
    assert request.cache_window == 0 and request.mode == "generate"
    spec = sent_request(app, "/generate/tree_speculative", {"prompt": [5, 6, 7], "max_tokens": 2})
    p = spec.speculative
    assert (p.draft_loops, p.verify_loops, p.draft_ahead, p.branches) == (2, 8, 4, 1)
    assert spec.mode == "tree_speculative"


STAT_KEYS = {"wall_ms", "tokens_per_second", "prompt_tokens", "completion_tokens", "mode", "loops_used",
             "time_to_first_token_ms"}


@pytest.mark.parametrize("path, mode", [("/generate", "generate"), ("/generate/speculative", "speculative"),
                                        ("/generate/tree_speculative", "tree_speculative")])
def test_native_stream_final_event_carries_stats(app, path, mode):
    events = run(call(app, "POST", path, {"prompt": [5, 6, 7], "max_tokens": 5, "stream": True})).events()
    final = events[-2]
    assert final["token_id"] == -1 and final["finish_reason"] == "length"
    assert STAT_KEYS <= set(final["stats"]) and final["stats"]["mode"] == mode
    assert final["stats"]["completion_tokens"] == 5
    if mode != "generate":
        assert {"rounds", "acceptance_rate", "acceptance_by_depth"} <= set(final["stats"])


@pytest.mark.parametrize("path, body", [
    ("/api/v0/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]}),
    ("/api/v0/completions", {"prompt": "Hi"}),
])
def test_api_v0_stream_final_chunk_carries_stats_model_info_runtime(app, path, body):
    events = run(call(app, "POST", path, {"model": "tl", **body, "max_tokens": 4, "stream": True,
                                          "mode": "speculative", "temperature": 0})).events()
    final = events[-2]
    assert final["choices"][0]["finish_reason"] == "length"
    assert STAT_KEYS <= set(final["stats"]) and final["stats"]["mode"] == "speculative"
    assert final["stats"]["completion_tokens"] == 4
    assert final["model_info"]["kv_cache_mode"] == "fp16" and final["runtime"]["name"] == "tinyloop"
    assert all("stats" not in e for e in events[:-2])


EXIT_SCRIPT = textwrap.dedent("""
    import asyncio, sys, time
    sys.path.insert(0, {tests!r})
    from asgi_client import call
    from test_server_asgi import ready_app
    app = ready_app({model!r}, exit_on_failure={exit_on_failure})
    def broken(*args, **kwargs):
        raise FloatingPointError("simulated kernel fault")
    app.state.loaded.model.trunk = broken
    response = asyncio.run(call(app, "POST", "/generate", {{"prompt": "Hi", "max_tokens": 3}}))
    print("status", response.status, flush=True)
    time.sleep(5)                  # SIGTERM, when sent, ends the process here
    print("still running", app.state.status, flush=True)
""")


@pytest.mark.parametrize("exit_on_failure", [True, False])
def test_exit_on_failure_ends_the_worker_process(model_path, exit_on_failure):
    script = EXIT_SCRIPT.format(tests=str(Path(__file__).parent), model=str(model_path),
                                exit_on_failure=exit_on_failure)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    if exit_on_failure:          # the signal may end it before the 503 is printed
        assert result.returncode == -signal.SIGTERM, (result.returncode, result.stdout)
        assert "still running" not in result.stdout
        assert "TINYLOOP_EXIT_ON_FAILURE is set" in result.stderr
    else:
        assert "status 503" in result.stdout, result.stderr[-2000:]
        assert result.returncode == 0 and "still running worker_failed" in result.stdout
