"""Engine admission (README "Admission"): one generation runs, up to max_waiting wait and
start in the order they came, more are refused; a cancelled generation stops within one
engine step, a waiting one is dropped; an engine error fails everything admitted.

The engine thread is held still by a gate in the running request's event callback (it
is called on the engine thread), so every check is about order, never about timing."""
import threading

import pytest

from tinyloop.engine.engine import Engine, EngineFailed, QueueFull
from tinyloop.engine.generate import GenerationRequest
from tinyloop.engine.sequence import Sequence
from tinyloop.engine.speculative import SpeculativeParams

WAIT_S = 30


class Recorder:
    """Events of one submission; optionally holds the engine thread at its n-th token
    until released."""

    def __init__(self, name, log, hold_at=None):
        self.name, self.log, self.hold_at = name, log, hold_at
        self.tokens, self.final = [], None
        self.held, self.release, self.done = threading.Event(), threading.Event(), threading.Event()

    def __call__(self, kind, payload):
        if kind == "token":
            if not self.tokens:
                self.log.append(self.name)                   # the order generations start in
            self.tokens.append(payload[0])
            if len(self.tokens) == self.hold_at:
                self.held.set()
                if not self.release.wait(WAIT_S):
                    self.final = ("error", "the test never released the engine")
        else:
            self.final = (kind, payload)
            self.done.set()

    def wait_held(self):
        assert self.held.wait(WAIT_S), f"{self.name} never reached token {self.hold_at}"

    def wait_done(self):
        assert self.done.wait(WAIT_S), f"{self.name} did not finish within {WAIT_S} s"
        return self.final


def request(max_tokens=6, **kw):
    return GenerationRequest([5, 6, 7], max_tokens, loops=2, ignore_eos=True, **kw)


@pytest.fixture
def engine(tiny):
    engines = []

    def make(**kw):
        engines.append(Engine(tiny, **{"max_running": 1, **kw}))     # the one-at-a-time contract unless a test says
        return engines[-1]
    yield make
    for e in engines:
        e.stop()


def test_waiting_generations_start_in_the_order_they_came(engine):
    eng = engine(max_waiting=4)
    started = []
    first = Recorder("first", started, hold_at=1)
    eng.submit(request(), first)
    first.wait_held()
    others = [Recorder(name, started) for name in ("a", "b", "c", "d")]
    for recorder in others:
        eng.submit(request(), recorder)
    assert eng.waiting == 4 and eng.running == 1
    first.release.set()
    for recorder in [first] + others:
        kind, result = recorder.wait_done()
        assert kind == "done" and result.finish_reason == "length" and len(recorder.tokens) == 6
    assert started == ["first", "a", "b", "c", "d"]


@pytest.mark.parametrize("max_waiting", [0, 1, 3])
def test_a_submit_beyond_max_waiting_is_refused_and_the_place_frees_up(engine, max_waiting):
    eng = engine(max_waiting=max_waiting)
    started = []
    first = Recorder("first", started, hold_at=1)
    eng.submit(request(), first)
    first.wait_held()
    waiting = [Recorder(f"w{i}", started) for i in range(max_waiting)]
    for recorder in waiting:
        eng.submit(request(), recorder)
    with pytest.raises(QueueFull, match=f"1 generation running \\(TINYLOOP_MAX_RUNNING=1\\) and {max_waiting} "
                                        f"waiting \\(TINYLOOP_MAX_WAITING={max_waiting}\\)"):
        eng.submit(request(), Recorder("refused", started))
    first.release.set()
    for recorder in [first] + waiting:
        assert recorder.wait_done()[0] == "done"
    late = Recorder("late", started)
    eng.submit(request(), late)                          # idle again: admitted
    assert late.wait_done()[0] == "done"
    assert "refused" not in started


@pytest.mark.parametrize("mode", ["generate", "speculative"])
def test_a_cancelled_generation_emits_nothing_after_the_step_in_progress(engine, mode):
    eng = engine(max_waiting=2)
    started = []
    spec = dict(mode="speculative", speculative=SpeculativeParams(1, 2, 3)) if mode == "speculative" else {}
    running = Recorder("running", started, hold_at=3)
    submission = eng.submit(request(200, **spec), running)
    running.wait_held()
    eng.cancel(submission)                              # while its step is in progress
    running.release.set()
    kind, result = running.wait_done()
    assert kind == "done" and result.finish_reason == "cancelled"
    # plain decoding: the step in progress emitted token 3 and nothing more follows;
    # speculative: at most the rest of that round (draft_ahead + 1 tokens)
    limit = 3 if mode == "generate" else 3 + 3
    assert len(running.tokens) <= limit and result.completion_tokens == len(running.tokens)


def test_a_cancelled_waiting_generation_is_dropped_without_running(engine):
    eng = engine(max_waiting=2)
    started = []
    first = Recorder("first", started, hold_at=1)
    eng.submit(request(), first)
    first.wait_held()
    leaving = Recorder("leaving", started)
    staying = Recorder("staying", started)
    leaving_submission = eng.submit(request(), leaving)
    eng.submit(request(), staying)
    eng.cancel(leaving_submission)
    assert eng.waiting == 1
    first.release.set()
    assert staying.wait_done()[0] == "done"
    assert started == ["first", "staying"] and leaving.final is None and not leaving.tokens


def test_an_engine_error_fails_the_running_and_the_waiting_and_every_later_submit(engine, monkeypatch):
    failures = []
    eng = engine(max_waiting=2, on_failure=failures.append)
    started = []
    first = Recorder("first", started, hold_at=2)
    eng.submit(request(), first)
    first.wait_held()
    waiting = Recorder("waiting", started)
    eng.submit(request(), waiting)
    from tinyloop.engine import engine as engine_module
    real_forward = engine_module.run_passes

    def failing_forward(model, passes):                # where a kernel error would surface
        raise FloatingPointError("simulated kernel fault")
    monkeypatch.setattr(engine_module, "run_passes", failing_forward)
    first.release.set()
    kind, error = first.wait_done()
    assert kind == "error" and isinstance(error, EngineFailed)
    assert str(error) == "engine error: FloatingPointError: simulated kernel fault"
    kind, error = waiting.wait_done()
    assert kind == "error" and isinstance(error, EngineFailed)
    assert failures == ["engine error: FloatingPointError: simulated kernel fault"]
    monkeypatch.setattr(engine_module, "run_passes", real_forward)
    with pytest.raises(EngineFailed, match="simulated kernel fault"):
        eng.submit(request(), Recorder("late", started))
    assert started == ["first"]


def test_stopping_an_idle_engine_ends_its_thread_and_refuses_work(tiny):
    eng = Engine(tiny, max_waiting=1, max_running=1)
    eng.stop()
    assert not eng._thread.is_alive(), "the engine thread was not woken to stop"
    with pytest.raises(EngineFailed, match="shutting down"):
        eng.submit(request(), Recorder("late", []))


def test_on_job_done_sees_every_finished_generation(engine):
    finished = []
    eng = engine(max_waiting=2, on_job_done=finished.append)
    recorders = [Recorder(name, []) for name in ("a", "b")]
    for recorder, max_tokens in zip(recorders, (3, 5)):
        eng.submit(request(max_tokens), recorder)
    results = [recorder.wait_done()[1] for recorder in recorders]
    assert finished == results and [r.completion_tokens for r in finished] == [3, 5]


def test_capacity_does_not_depend_on_when_the_engine_thread_wakes(tiny, monkeypatch):
    """One running + max_waiting waiting, even before the engine thread has taken the first
    request off the queue (it holds the running slot, not a waiting one): with the thread
    held at its next schedule, max_waiting + 1 requests are admitted and one more is refused.
    (Before, the third of three concurrent requests to an idle engine could get a 429.)"""
    gate, original = threading.Event(), Engine._schedule

    def held_schedule(self):
        assert gate.wait(WAIT_S), "the test never opened the gate"
        return original(self)
    monkeypatch.setattr(Engine, "_schedule", held_schedule)
    engine = Engine(tiny, max_waiting=2, max_running=1)
    try:
        log = []
        recorders = [Recorder(name, log) for name in "abc"]
        for recorder in recorders:
            engine.submit(request(), recorder)
        with pytest.raises(QueueFull):
            engine.submit(request(), Recorder("d", log))
        gate.set()
        assert [r.wait_done()[0] for r in recorders] == ["done"] * 3
        assert log == ["a", "b", "c"]
    finally:
        gate.set()
        engine.stop()
