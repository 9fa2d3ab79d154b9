"""Draining at the ASGI level: what was admitted finishes, nothing new starts, the drain
is bounded; SIGTERM starts it without taking the signal from the server's own handler.
(tests/test_deploy_e2e.py drains a real replica behind nginx.)"""
import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from asgi_client import call, run, until

from asgi.app import TinyLoopApp
from asgi.drain import drain_on_signals
from asgi.settings import Settings
from tinyloop.model.testmodels import make_test_model


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    # A long context so that one generation outlasts a short drain timeout by far.
    path = tmp_path_factory.mktemp("drain") / "tiny-long.tinyloop"
    make_test_model(path, "tiny-looped", seed=0, eos_token_ids=(), max_seq_len=4096)
    return path


def ready_app(model_path, drain_timeout_s):
    app = TinyLoopApp(Settings(model_path=str(model_path), api_key="test-key", auth=True,
                               state_dir=Path("/nonexistent"), max_waiting=2, max_body_bytes=65536,
                               exit_on_failure=False, commit=None, device=None, drain_timeout_s=drain_timeout_s,
                               max_running=1))
    state = app._ensure_state()
    deadline = time.monotonic() + 600            # a first load may compile the CPU kernels
    while state.status == "loading":
        assert time.monotonic() < deadline, "the model did not load within 600 s"
        time.sleep(0.01)
    return app


def test_a_drain_lets_admitted_generations_finish_and_refuses_new_ones(model_path):
    app = ready_app(model_path, drain_timeout_s=60)
    engine = app.state.engine

    async def scenario():
        running = asyncio.ensure_future(call(app, "POST", "/generate", {"prompt": "Hi", "max_tokens": 300,
                                                                         "loops": 8}))
        await until(lambda: engine.running == 1, "the first generation to run")
        waiting = asyncio.ensure_future(call(app, "POST", "/generate", {"prompt": "Hi", "max_tokens": 5,
                                                                         "stream": True}))
        await until(lambda: engine.waiting == 1 or waiting.done(), "the second one to queue")
        app.state.drain()
        refused = await call(app, "POST", "/v1/completions", {"model": "m", "prompt": "Hi", "max_tokens": 2})
        health = await call(app, "GET", "/health")
        models = await call(app, "GET", "/v1/models")
        metrics = await call(app, "GET", "/metrics")
        return await running, await waiting, refused, health, models, metrics

    running, waiting, refused, health, models, metrics = run(scenario())
    assert running.status == 200 and len(running.json()["tokens"]) == 300
    assert running.json()["finish_reason"] == "length"
    events = waiting.events()
    assert events[-1] == "[DONE]" and events[-2]["finish_reason"] == "length"
    assert len([e for e in events[:-2] if e["token_id"] != -1]) == 5
    assert refused.status == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "draining"
    assert set(refused.json()["error"]) == {"message", "type", "param", "code"}
    assert health.status == 503 and health.json()["status"] == "draining"
    assert models.status == 200                        # only new generations are refused
    assert "tinyloop_draining 1" in metrics.body.decode()
    assert app.state.engine.running == 0 and app.state.engine.waiting == 0


def test_the_drain_timeout_stops_what_is_left_with_a_503_not_a_finished_answer(model_path):
    app = ready_app(model_path, drain_timeout_s=0.3)
    engine = app.state.engine
    long = {"prompt": "Hi", "max_tokens": 4000, "loops": 8}       # seconds of work, far past 0.3 s

    async def scenario():
        streamed = asyncio.ensure_future(call(app, "POST", "/generate", {**long, "stream": True}))
        await until(lambda: engine.running == 1, "the stream to run")
        waiting = asyncio.ensure_future(call(app, "POST", "/generate", long))
        await until(lambda: engine.waiting == 1, "the second request to queue")
        started = time.monotonic()
        app.state.drain()
        results = await streamed, await waiting
        return results, time.monotonic() - started

    (streamed, waiting), elapsed = run(scenario())
    assert elapsed < 10, f"the drain took {elapsed:.1f} s with a 0.3 s timeout"
    events = streamed.events()
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "shutting_down"
    assert all("finish_reason" not in e for e in events[:-2])         # no finished answer was claimed
    assert 0 < len(events[:-2]) < long["max_tokens"]
    assert waiting.status == 503 and waiting.json()["error"]["code"] == "shutting_down"


def test_a_drain_with_nothing_admitted_refuses_at_once_and_health_says_draining(model_path):
    app = ready_app(model_path, drain_timeout_s=0)
    app.state.drain()
    app.state.drain()                                  # a second signal changes nothing
    refused = run(call(app, "POST", "/v1/chat/completions", {"model": "m", "max_tokens": 2,
                                                             "messages": [{"role": "user", "content": "x"}]}))
    assert refused.status == 503 and refused.json()["error"]["code"] == "draining"
    assert run(call(app, "GET", "/health")).json()["status"] == "draining"


@pytest.fixture
def signal_handlers():
    """Restore SIGTERM's and SIGINT's handlers after the test."""
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


class FakeState:
    def __init__(self):
        self.drains = 0

    def drain(self):
        self.drains += 1


def test_sigterm_drains_and_still_reaches_the_servers_own_asyncio_handler(signal_handlers):
    """Granian's worker listens for SIGTERM with loop.add_signal_handler; the drain is
    chained in front of it and both run."""
    state = FakeState()

    async def scenario():
        loop = asyncio.get_running_loop()
        server_stopped = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, server_stopped.set)
        # Python's own SIGINT handler, as in a foreground process: a process started in the
        # background (SIGINT ignored) has none, and the drain leaves an ignored signal alone
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            assert drain_on_signals(state) == [signal.SIGTERM, signal.SIGINT]
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(server_stopped.wait(), 10)
            await until(lambda: state.drains == 1, "the drain to be scheduled", 10)
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    run(scenario())


def test_a_plain_python_handler_behind_the_drain_is_still_called(signal_handlers):
    state, seen = FakeState(), []
    signal.signal(signal.SIGTERM, lambda number, frame: seen.append(number))

    async def scenario():
        assert signal.SIGTERM in drain_on_signals(state)
        os.kill(os.getpid(), signal.SIGTERM)
        await until(lambda: state.drains == 1 and seen == [signal.SIGTERM], "both handlers", 10)

    run(scenario())


def test_no_handler_is_chained_in_front_of_a_default_action_or_off_the_main_thread(signal_handlers):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)

    async def on_the_main_thread():
        return drain_on_signals(FakeState())

    assert signal.SIGTERM not in run(on_the_main_thread())
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    installed = []

    def elsewhere():
        installed.append(drain_on_signals(FakeState(), loop=asyncio.new_event_loop()))

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "drain_on_signals did not return within 10 s"
    assert installed == [[]]
