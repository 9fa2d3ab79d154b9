"""Continuous batching changes no answer: a request's tokens and logprobs, in every mode (plain
at any loop count, loops "auto", speculative chains and trees), greedy or seeded sampling,
with penalties, logprobs or a grammar, in every KV cache mode and with windows, are bit for
bit those of the same request run alone (generate() with the same prefill chunk, the oracle:
one sequence, one pass at a time), whatever runs beside it, whenever it joined, and whichever of its passes the engine
put off to a later step. Then the engine itself: several at once, joining and leaving,
waiting for KV blocks, a cancel and a failing request that end alone."""
import threading

import numpy as np
import pytest

from tinyloop.engine.engine import Engine
from tinyloop.engine.generate import GenerationRequest, generate
from tinyloop.engine.sampling import SamplingParams
from tinyloop.engine.sequence import Sequence
from tinyloop.engine.speculative import SpeculativeParams
from tinyloop.errors import RequestError
from tinyloop.grammar.compile import Grammar, json_schema_grammar
from tinyloop.kv.modes import KV_MODES
from tinyloop.kv.pool import KVPool
from tinyloop.model.batch import run_passes
from tinyloop.model.loader import load_model
from tinyloop.model.testmodels import make_test_model
from tinyloop.model.transformer import LoopedTransformer

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "b": {"enum": ["x", "y"]}}, "required": ["a", "b"]}


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    path = tmp_path_factory.mktemp("batching") / "tiny.tinyloop"
    make_test_model(path, "tiny-looped", seed=5)
    return load_model(path)


@pytest.fixture(scope="module")
def grammar(loaded):
    return Grammar(json_schema_grammar(SCHEMA, "response_format"), loaded.tokenizer, loaded.config.eos_token_ids,
                   "response_format")


def random_request(rng, config, grammar=None, window_choices=(0,)) -> GenerationRequest:
    """Any mode, loop count, sampling, penalty, logprobs and grammar the engine serves."""
    prompt = [int(t) for t in rng.integers(3, config.vocab_size, int(rng.integers(1, 90)))]
    sampling = SamplingParams()
    if rng.random() < 0.5:
        sampling = SamplingParams(temperature=float(rng.choice([0.7, 1.0, 1.3])), top_k=int(rng.choice([0, 5, 40])),
                                  top_p=float(rng.choice([1.0, 0.9])), seed=int(rng.integers(1 << 30)))
    if rng.random() < 0.3:
        sampling = SamplingParams(**{**sampling.__dict__, "repetition_penalty": 1.3, "presence_penalty": 0.5,
                                     "frequency_penalty": 0.4})
    mode = str(rng.choice(["generate", "generate", "auto", "speculative", "tree_speculative"]))
    kw = dict(max_tokens=int(rng.integers(1, 24)), sampling=sampling, ignore_eos=bool(rng.random() < 0.7),
              cache_window=int(rng.choice(window_choices)),
              top_logprobs=int(rng.choice([0, 3])) if rng.random() < 0.3 else None)
    if grammar is not None and mode == "generate" and rng.random() < 0.4:
        kw.update(grammar=grammar, ignore_eos=False, max_tokens=40)
    if mode == "generate":
        return GenerationRequest(prompt, loops=int(rng.integers(1, config.max_loops + 1)), **kw)
    if mode == "auto":
        return GenerationRequest(prompt, loops="auto", exit_threshold=float(rng.choice([1e-3, 0.05, 1.0])), **kw)
    verify = int(rng.integers(2, config.max_loops + 1))
    branches = 1 if mode == "speculative" else int(rng.integers(2, 4))
    params = SpeculativeParams(int(rng.integers(1, verify)), verify, int(rng.integers(1, 6)), branches)
    return GenerationRequest(prompt, mode=mode, speculative=params, **kw)


def outcome(result) -> tuple:
    return (tuple(result.tokens), result.finish_reason, result.completion_tokens,
            None if result.logprobs is None else tuple(result.logprobs))


def run_mix(model, requests, tokenizer, rng, joins, chunk, pool_bytes=64 << 20, pool=None) -> list:
    """The engine's loop, driven by hand: request i joins at step joins[i]; each step every
    running sequence names its next pass and a random non-empty subset of them runs (the rest
    wait for a later step, as a prefill chunk over the token budget does), in one batched
    forward; finished sequences give their blocks back. -> each request's outcome."""
    pool = pool or KVPool.for_model(model, pool_bytes)
    running, results, step = {}, {}, 0
    while len(results) < len(requests):
        for i, request in enumerate(requests):
            if joins[i] == step:
                running[i] = Sequence(model, request, tokenizer, pool, prefill_chunk=chunk)
        ready = [(i, s.next_pass()) for i, s in running.items() if not s.finished]
        ready = [(i, p) for i, p in ready if p is not None]
        if ready:
            keep = rng.random(len(ready)) < 0.75
            keep[int(rng.integers(len(ready)))] = True
            chosen = [item for item, k in zip(ready, keep) if k]
            run_passes(model, [p for _, p in chosen])
            for i, _ in chosen:
                running[i].advance()
        for i, sequence in list(running.items()):
            if sequence.finished or sequence.next_pass() is None:
                results[i] = outcome(sequence.result())
                sequence.release()
                del running[i]
        step += 1
    idle = pool.prefix.idle_blocks if pool.prefix is not None else 0
    assert pool.free_blocks == pool.usable_blocks and pool.used_blocks == idle    # every block given back
    return [results[i] for i in range(len(requests))]


@pytest.mark.exactness(sample=4)
@pytest.mark.parametrize("case", range(12))
def test_random_mixes_give_every_request_its_solo_tokens(loaded, grammar, case):
    rng = np.random.default_rng(1000 + case)
    model = loaded.model
    requests = [random_request(rng, model.config, grammar, (0, 0, 40)) for _ in range(int(rng.integers(3, 8)))]
    chunk = int(rng.choice([16, 64, 128]))
    solo = [outcome(generate(model, r, tokenizer=loaded.tokenizer, prefill_chunk=chunk)) for r in requests]
    joins = [0] + [int(rng.integers(0, 30)) for _ in requests[1:]]
    assert run_mix(model, requests, loaded.tokenizer, rng, joins, chunk) == solo


@pytest.mark.exactness(sample=2)
@pytest.mark.parametrize("mode", KV_MODES)
def test_every_kv_mode_and_window_batches_exactly(loaded, mode):
    rng = np.random.default_rng(77 + KV_MODES.index(mode))
    model = LoopedTransformer(loaded.config, loaded.model.weights, loaded.backend, kv_mode=mode)
    requests = [random_request(rng, model.config, None, (0, 24, 70)) for _ in range(6)]
    solo = [outcome(generate(model, r, prefill_chunk=32)) for r in requests]
    assert run_mix(model, requests, None, rng, [0, 0, 2, 5, 9, 14], 32) == solo


def engine_results(engine, requests) -> list:
    """Submit every request at once; -> their outcomes, in order."""
    done = [threading.Event() for _ in requests]
    finals = [None] * len(requests)

    def on_event(i):
        def record(kind, payload):
            if kind in ("done", "error"):
                finals[i] = (kind, payload)
                done[i].set()
        return record
    for i, request in enumerate(requests):
        engine.submit(request, on_event(i))
    for event in done:
        assert event.wait(120), "a generation did not finish"
    return [outcome(payload) if kind == "done" else (kind, str(payload)) for kind, payload in finals]


def test_the_engine_runs_many_at_once_and_each_gets_its_solo_answer(loaded, grammar):
    rng = np.random.default_rng(4)
    model = loaded.model
    requests = [random_request(rng, model.config, grammar) for _ in range(10)]
    solo = [outcome(generate(model, r, tokenizer=loaded.tokenizer, prefill_chunk=16)) for r in requests]
    engine = Engine(loaded, max_waiting=16, max_running=4, prefill_chunk=16, step_tokens=24)
    try:
        assert engine_results(engine, requests) == solo
        assert max(engine.stats.batch_sizes) > 1                     # they did share steps
        assert engine.pool.free_blocks == engine.pool.usable_blocks   # every block given back
    finally:
        engine.stop()


def test_a_full_pool_makes_new_requests_wait_and_corrupts_no_running_one(loaded):
    """A pool that holds two of these caches at a time: eight requests, eight running places;
    they start two at a time as blocks come free, and each still gets its solo answer."""
    model = loaded.model
    requests = [GenerationRequest([5 + i, 9, 11 + i], 60, loops=8, ignore_eos=True) for i in range(8)]
    need = Sequence.cache_blocks(model, requests[0], 8)
    solo = [outcome(generate(model, r)) for r in requests]
    block_bytes = KVPool.for_model(model, 1 << 20).block_bytes
    engine = Engine(loaded, max_waiting=16, max_running=8, kv_budget_bytes=(2 * need + 1) * block_bytes)
    try:
        assert engine_results(engine, requests) == solo
        assert max(engine.stats.batch_sizes) == 2                    # never more than the pool holds
    finally:
        engine.stop()


def test_a_cancelled_or_failing_request_ends_alone(loaded, monkeypatch):
    """One of four is cancelled, one raises a RequestError mid-way: each of those ends alone
    (cancelled; an error naming the request), the engine does not fail, the others are exact."""
    model = loaded.model
    requests = [GenerationRequest([5, 6 + i, 7], 30, loops=4, ignore_eos=True) for i in range(4)]
    solo = [outcome(generate(model, r)) for r in requests]
    real_advance = Sequence.advance
    calls = {}

    def advance(self):
        if self.request is requests[1]:
            calls[1] = calls.get(1, 0) + 1
            if calls[1] == 6:
                raise RequestError("this request's grammar has no way out", "response_format")
        return real_advance(self)
    monkeypatch.setattr(Sequence, "advance", advance)
    engine = Engine(loaded, max_waiting=8, max_running=4)
    events = {i: [] for i in range(4)}
    done = [threading.Event() for _ in range(4)]
    try:
        submissions = []
        for i, request in enumerate(requests):
            def record(kind, payload, i=i):
                events[i].append((kind, payload))
                if kind in ("done", "error"):
                    done[i].set()
            submissions.append(engine.submit(request, record))
        while not any(kind == "token" for kind, _ in events[2]):
            threading.Event().wait(0.001)
        engine.cancel(submissions[2])
        assert all(event.wait(60) for event in done)
        assert events[1][-1][0] == "error" and "no way out" in str(events[1][-1][1])
        assert events[2][-1][0] == "done" and events[2][-1][1].finish_reason == "cancelled"
        assert [outcome(events[i][-1][1]) for i in (0, 3)] == [solo[0], solo[3]]
        assert engine.failure is None and engine.running == 0
        assert engine.pool.free_blocks == engine.pool.usable_blocks
    finally:
        engine.stop()


def test_the_engine_cuts_prompts_at_its_backends_default_chunk_unless_told(loaded, monkeypatch):
    """The CPU backend's chunk (32 rows: backends/cpu/backend.py) is the engine's default, a
    setting wins, and a 100-token prompt is prefilled in forwards of at most that many rows
    that end at its multiples."""
    import tinyloop.engine.engine as engine_module

    assert loaded.model.backend.default_prefill_chunk == 32
    chunks = []
    real = engine_module.run_passes

    def recording(model, passes):
        chunks.extend((int(p.positions[0]), int(p.positions[-1]) + 1) for p in passes if not p.exact)
        return real(model, passes)
    monkeypatch.setattr(engine_module, "run_passes", recording)
    engine = Engine(loaded, max_running=2)
    told = Engine(loaded, max_running=2, prefill_chunk=48)
    try:
        assert (engine.prefill_chunk, engine.step_tokens, told.prefill_chunk) == (32, 64, 48)
        request = GenerationRequest(list(range(3, 103)), 2, ignore_eos=True)
        assert engine_results(engine, [request]) == [outcome(generate(loaded.model, request))]
        assert chunks == [(0, 32), (32, 64), (64, 96), (96, 100)]
    finally:
        engine.stop()
        told.stop()
