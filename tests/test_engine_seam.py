"""The engine's seam: the backend interface, one plan per forward, step buffers, the KV
pool, the step-shaped engine (schedule -> run -> postprocess), stop strings below the
HTTP layer, shutdown."""
import inspect
import threading

import numpy as np
import pytest
from asgi_client import wait_until

from tinyloop.backends.base import Backend
from tinyloop.backends.reference import NumpyBackend
from tinyloop.backends.reference.topk import log_normalizer, top_k_ids
from tinyloop.engine.decode import prefill
from tinyloop.engine.engine import Engine, EngineFailed
from tinyloop.engine.generate import GenerationRequest, generate, speculative_generate
from tinyloop.engine.sampling import SamplingParams
from tinyloop.engine.sequence import Sequence
from tinyloop.engine.speculative import SpeculativeParams
from tinyloop.errors import RequestError
from tinyloop.kv.pool import KVPool
from tinyloop.model import plan as plan_module
from tinyloop.model.loader import load_model


# ------------------------------------------------------------------------ the backend
def test_the_cpu_backend_implements_the_whole_interface():
    abstract = {name for name, member in inspect.getmembers(Backend) if getattr(member, "__isabstractmethod__", False)}
    assert abstract and not NumpyBackend.__abstractmethods__
    for name in abstract:
        assert inspect.signature(getattr(NumpyBackend, name)).parameters.keys() == \
            inspect.signature(getattr(Backend, name)).parameters.keys(), name


def test_device_side_greedy_and_top_k_match_the_host_reference():
    rng = np.random.default_rng(0)
    backend = NumpyBackend()
    logits = rng.standard_normal((5, 300)).astype(np.float32)
    logits[2, [7, 11, 40]] = logits[2].max() + 1.0                      # ties: the lowest id wins
    assert list(backend.argmax(logits)) == [int(np.argmax(row.astype(np.float64))) for row in logits]
    assert backend.argmax(logits)[2] == 7
    ids, values, normalizers = backend.top_k(logits, 4)
    for row in range(5):
        scores = logits[row].astype(np.float64)
        expected = sorted(range(300), key=lambda t: (-scores[t], t))[:4]
        assert list(ids[row]) == expected == list(top_k_ids(scores, 4))
        assert np.array_equal(values[row], scores[expected])
        assert normalizers[row] == pytest.approx(np.log(np.exp(scores).sum()), rel=1e-12)
        assert normalizers[row] == log_normalizer(scores)


def test_greedy_speculation_moves_ids_not_vocabularies(tiny):
    """Greedy without penalties: no (T, V) logits array crosses to the host."""
    model = load_model(tiny.file.path).model
    moved = []
    real = model.backend.to_host
    model.backend.to_host = lambda array: (moved.append(np.shape(array)), real(array))[1]
    out = speculative_generate(model, GenerationRequest([5, 6, 7], 20, ignore_eos=True), SpeculativeParams(2, 6, 4, 3))
    assert len(out.tokens) == 20 and moved == []
    penalized = GenerationRequest([5, 6, 7], 5, ignore_eos=True, sampling=SamplingParams(repetition_penalty=1.2))
    speculative_generate(model, penalized, SpeculativeParams(2, 6, 4, 3))
    assert moved and all(shape[-1] == model.config.vocab_size for shape in moved)   # penalties need the rows


# ------------------------------------------------------------------- one plan per forward
def test_a_forward_plans_once_and_every_layer_uses_that_plan(tiny, monkeypatch):
    model = tiny.model
    built, seen = [], []                     # the plan objects themselves (ids can be reused)
    real_build, real_layer = plan_module.build_plan, type(model).layer
    monkeypatch.setattr("tinyloop.model.transformer.build_plan",
                        lambda *a, **k: built.append(real_build(*a, **k)) or built[-1])
    monkeypatch.setattr(type(model), "layer", lambda self, w, h, plan, *a, **k: seen.append(plan)
                        or real_layer(self, w, h, plan, *a, **k))
    cache = model.new_cache(40, 5)
    model.forward(np.arange(30), np.arange(30), cache, 5, exact=False)
    model.forward([3], [30], cache, 5)
    n_layers = tiny.config.n_prelude + tiny.config.n_core * 5 + tiny.config.n_coda
    assert len(built) == 2 and len(seen) == 2 * n_layers
    assert all(plan is built[0] for plan in seen[:n_layers]) and all(plan is built[1] for plan in seen[n_layers:])


def test_step_inputs_live_in_the_preallocated_buffers(tiny):
    model = tiny.model
    cache = model.new_cache(300, 4, window=20)                          # a ring of 128 rows
    assert cache.ring == 128
    prefill(model, list(np.arange(255) % 512), cache, 4)
    plan = model.plan(np.array([255, 256]), 255, cache)                 # rows 127 and 0: the ring wraps
    assert np.array_equal(plan.positions, [255, 256]) and np.shares_memory(plan.positions, model.buffers.positions)
    assert np.array_equal(plan.write_rows, [127, 0]) and np.shares_memory(plan.write_rows, model.buffers.write_rows)
    model.trunk([9, 10], plan, cache, 1)
    assert list(model.buffers.tokens[:2]) == [9, 10]


# ------------------------------------------------------------------------------ the KV pool
def test_caches_take_the_pools_blocks_and_nothing_an_earlier_request_left_reaches_them(tiny):
    model = tiny.model
    pool = KVPool.for_model(model, 8 << 20)
    for array in pool.storage.arrays():                                 # what an earlier request might leave
        array.view(np.uint8)[...] = 0xFF                                # NaN in every float, 65535 in every code
    request = GenerationRequest([5, 17, 200, 33], 30, loops=6, ignore_eos=True)
    fresh = generate(model, request)
    for _ in range(2):                                                  # the same blocks, twice
        sequence = Sequence(model, request, pool=pool)
        storage = sequence.decoder.cache.storage
        assert all(any(np.shares_memory(a, b) for b in pool.storage.arrays()) for a in storage.pool.arrays())
        assert pool.free_blocks == pool.usable_blocks - model.cache_blocks(34, 6)       # reserved when made
        sequence.release()
        assert pool.free_blocks == pool.usable_blocks
        assert generate(model, request, pool=pool).tokens == fresh.tokens
        assert pool.free_blocks == pool.usable_blocks and pool.used_blocks == 0       # every block given back
    speculative = GenerationRequest([5, 17, 200, 33], 30, ignore_eos=True, mode="speculative",
                                    speculative=SpeculativeParams(2, 6, 4))
    assert generate(model, speculative, pool=pool).tokens == generate(model, replace_loops(request, 6)).tokens
    assert pool.free_blocks == pool.usable_blocks


def replace_loops(request, loops):
    return GenerationRequest(request.prompt_ids, request.max_tokens, loops=loops, ignore_eos=True)


# ------------------------------------------------------------------------------- the engine
def engine_events(engine, request):
    events, done = [], threading.Event()

    def on_event(kind, payload):
        events.append((kind, payload))
        if kind in ("done", "error"):
            done.set()
    return events, done, engine.submit(request, on_event)


def test_the_engine_steps_a_request_to_its_end_with_text_and_stop_strings(tiny):
    engine = Engine(tiny, max_waiting=2, max_running=1)
    try:
        reference = generate(tiny.model, GenerationRequest([5, 6, 7], 24, loops=4, ignore_eos=True),
                             tokenizer=tiny.tokenizer)
        text = reference.text
        stop = text[len(text) // 2:len(text) // 2 + 3]
        events, done, _ = engine_events(engine, GenerationRequest([5, 6, 7], 24, loops=4, ignore_eos=True,
                                                                  stop_strings=(stop,)))
        assert done.wait(30)
        kind, result = events[-1]
        assert kind == "done" and result.finish_reason == "stop"
        released = "".join(text for kind, (token, text) in events[:-1]) + result.text_tail
        assert released == text[:text.index(stop)] == result.text
        tokens = [token for kind, (token, _) in events[:-1]]
        assert tokens == reference.tokens[:len(tokens)] and len(tokens) < len(reference.tokens)
    finally:
        engine.stop()


def test_the_engine_refuses_a_bad_request_before_queueing(tiny):
    engine = Engine(tiny, max_waiting=1, kv_budget_bytes=1 << 16, max_running=1)
    try:
        with pytest.raises(RequestError, match="needs .* MiB of KV cache"):
            engine.submit(GenerationRequest([1, 2], 400, loops=8))
        with pytest.raises(RequestError, match="draft_loops"):
            engine.submit(GenerationRequest([1, 2], 4, mode="speculative", speculative=SpeculativeParams(6, 4)))
        assert engine.waiting == 0 and engine.running == 0
    finally:
        engine.stop()


def test_stopping_the_engine_reports_shutdown_not_stop(tiny):
    engine = Engine(tiny, max_waiting=4, max_running=1)
    long = GenerationRequest([5, 6, 7], 400, loops=8, ignore_eos=True)
    running_events, running_done, _ = engine_events(engine, long)
    waiting_events, waiting_done, _ = engine_events(engine, long)
    wait_until(lambda: any(kind == "token" for kind, _ in running_events), "the first token")
    engine.stop()
    assert running_done.wait(30) and waiting_done.wait(30)
    assert running_events[-1][0] == "done" and running_events[-1][1].finish_reason == "shutdown"
    assert waiting_events[-1][0] == "error" and isinstance(waiting_events[-1][1], EngineFailed)
    with pytest.raises(EngineFailed, match="shutting down"):
        engine.submit(long)


def test_a_cancelled_request_ends_within_one_step(tiny):
    engine = Engine(tiny, max_waiting=2, max_running=1)
    try:
        events, done, submission = engine_events(engine, GenerationRequest([5, 6, 7], 400, loops=8, ignore_eos=True))
        wait_until(lambda: sum(kind == "token" for kind, _ in events) >= 3, "three tokens")
        engine.cancel(submission)
        seen = len(events)     # counted after cancel returns: how long this thread took to get here does not matter
        assert done.wait(30)
        # at most the step in flight when the flag was set, then the final event (a count, not a
        # time: the old `< 50 events` failed on a loaded 2-core machine that lagged before cancelling)
        assert events[-1][1].finish_reason == "cancelled" and len(events) <= seen + 2, (seen, len(events))
        events, done, _ = engine_events(engine, GenerationRequest([5, 6, 7], 3, loops=2, ignore_eos=True))
        assert done.wait(30) and events[-1][1].finish_reason == "length"       # the engine is free again
    finally:
        engine.stop()
