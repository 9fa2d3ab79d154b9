"""The prefix cache changes no answer and reuses what it should: requests whose prompts share
random prefixes (ending on a 64-row block boundary and off it), in every mode and KV cache
mode, greedy and seeded sampling, alone or beside other requests, get bit for bit the tokens
a cold run gives (generate() without a pool: no cache); and the cache serves the blocks the
rules of kv/prefix.py say it does (loop counts, a speculative request's draft coda, adaptive
depth, windows), evicts idle blocks instead of refusing, and gives every block back."""
import threading

import numpy as np
import pytest
from test_batching import engine_results, outcome, random_request, run_mix

from tinyloop.engine.engine import Engine
from tinyloop.engine.generate import GenerationRequest, generate
from tinyloop.engine.sampling import SamplingParams
from tinyloop.engine.sequence import Sequence, run
from tinyloop.engine.speculative import SpeculativeParams
from tinyloop.kv.modes import KV_MODES
from tinyloop.kv.pool import KVPool
from tinyloop.kv.prefix import PrefixCache
from tinyloop.model.loader import load_model
from tinyloop.model.testmodels import make_test_model
from tinyloop.model.transformer import LoopedTransformer


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    path = tmp_path_factory.mktemp("prefix") / "tiny.tinyloop"
    make_test_model(path, "tiny-looped", seed=6, eos_token_ids=())
    return load_model(path)


def cached_pool(model, nbytes=64 << 20) -> KVPool:
    pool = KVPool.for_model(model, nbytes)
    PrefixCache(pool, (model.kv_mode, model.backend.activations))
    return pool


def run_cached(model, request, pool, chunk=64):
    """One request through a pool with the prefix cache -> (outcome, cached prompt rows)."""
    result = run(Sequence(model, request, pool=pool, prefill_chunk=chunk))
    return outcome(result), result.cached_tokens


def shared_prompts(rng, vocab, n, prefix_len):
    prefix = [int(t) for t in rng.integers(3, vocab, prefix_len)]
    return [prefix + [int(t) for t in rng.integers(3, vocab, int(rng.integers(1, 80)))] for _ in range(n)]


@pytest.mark.exactness(sample=3)
@pytest.mark.parametrize("case", range(9))
def test_requests_sharing_random_prefixes_get_their_cold_tokens(loaded, case):
    """Every request of a random mix (all modes, sampling, penalties, logprobs) on prompts that
    share a prefix of 64 k + {0, 1, 37, 63} tokens equals its cold run; from the second on, each
    reuses every full block of the shared prefix."""
    rng = np.random.default_rng(200 + case)
    model = loaded.model
    prefix_len = 64 * int(rng.integers(1, 4)) + int(rng.choice([0, 1, 37, 63]))
    prompts = shared_prompts(rng, model.config.vocab_size, 6, prefix_len)
    pool = cached_pool(model)
    templates = [random_request(rng, model.config) for _ in prompts[:-1]]
    templates.append(templates[0])                      # the last repeats the first's settings: a sure hit
    for i, (prompt, template) in enumerate(zip(prompts, templates)):
        request = GenerationRequest(prompt, template.max_tokens, template.loops, template.sampling, ignore_eos=True,
                                    mode=template.mode, speculative=template.speculative,
                                    exit_threshold=template.exit_threshold, top_logprobs=template.top_logprobs)
        got, cached = run_cached(model, request, pool)
        assert got == outcome(generate(model, request, prefill_chunk=64)), i
        if i == 0:
            assert cached == 0
    assert cached >= prefix_len // 64 * 64             # every full block of the shared prefix
    assert pool.free_blocks == pool.usable_blocks and pool.reserved == 0


@pytest.mark.exactness(sample=2)
@pytest.mark.parametrize("mode", KV_MODES)
def test_every_kv_mode_reuses_exactly(loaded, mode):
    rng = np.random.default_rng(300 + KV_MODES.index(mode))
    model = LoopedTransformer(loaded.config, loaded.model.weights, loaded.backend, kv_mode=mode)
    pool = cached_pool(model)
    for prompt in shared_prompts(rng, model.config.vocab_size, 3, 150):
        request = GenerationRequest(prompt, 12, loops=int(rng.integers(1, 9)), ignore_eos=True)
        assert run_cached(model, request, pool)[0] == outcome(generate(model, request, prefill_chunk=64))


def test_cached_requests_beside_others_stay_exact(loaded):
    """The batching mix of test_batching.py, its prompts sharing prefixes, through one pool
    whose prefix cache they fill and read while they run together."""
    rng = np.random.default_rng(9)
    model = loaded.model
    prompts = shared_prompts(rng, model.config.vocab_size, 8, 130)
    requests = []
    for prompt in prompts:
        r = random_request(rng, model.config)
        requests.append(GenerationRequest(prompt, r.max_tokens, r.loops, r.sampling, ignore_eos=True, mode=r.mode,
                                          speculative=r.speculative, exit_threshold=r.exit_threshold))
    solo = [outcome(generate(model, r, prefill_chunk=32)) for r in requests]
    pool = cached_pool(model)
    assert run_mix(model, requests, None, rng, [0, 3, 3, 9, 20, 21, 40, 41], 32, pool=pool) == solo
    assert pool.prefix.hit_tokens > 0


def test_a_second_question_reuses_the_system_prompt_and_a_chat_reuses_its_turns(loaded):
    model = loaded.model
    rng = np.random.default_rng(11)
    system = [int(t) for t in rng.integers(3, 500, 300)]
    pool = cached_pool(model)
    first = GenerationRequest(system + [7, 8, 9], 20, loops=4, ignore_eos=True)
    out1, cached1 = run_cached(model, first, pool)
    assert cached1 == 0
    _, cached2 = run_cached(model, GenerationRequest(system + [10, 11], 5, loops=4, ignore_eos=True), pool)
    assert cached2 == 256                                   # every full block of the 300 shared tokens
    # the chat's next turn: everything the first request's cache held, except the partial last block
    turn = system + [7, 8, 9] + list(out1[0]) + [12, 13, 14]
    _, cached3 = run_cached(model, GenerationRequest(turn, 5, loops=4, ignore_eos=True), pool)
    committed = len(system) + 3 + len(out1[0]) - 1          # the last sampled token never ran through the model
    assert cached3 == committed // 64 * 64


def test_loop_counts_and_the_draft_coda_share_what_they_have_in_common(loaded):
    """Core slots are keyed by iteration, codas by the iterations before them: a prefix computed
    at 8 loops serves 4 only once the coda after 4 iterations is cached, which a speculative
    request drafting at 4 provides; it then serves plain requests at 4 and at 8."""
    model = loaded.model
    prompt = [int(t) for t in np.random.default_rng(12).integers(3, 500, 140)]
    pool = cached_pool(model)

    def cached(request):
        got, rows = run_cached(model, request, pool)
        assert got == outcome(generate(model, request, prefill_chunk=64))
        return rows
    assert cached(GenerationRequest(prompt + [1], 3, loops=8, ignore_eos=True)) == 0
    assert cached(GenerationRequest(prompt + [2], 3, loops=4, ignore_eos=True)) == 0        # no coda after 4 yet
    spec = GenerationRequest(prompt + [3], 6, ignore_eos=True, mode="speculative",
                             speculative=SpeculativeParams(4, 8, 3))
    assert cached(spec) == 128                                                              # 8's blocks + 4's coda
    assert cached(GenerationRequest(prompt + [4], 3, loops=4, ignore_eos=True)) == 128
    assert cached(GenerationRequest(prompt + [5], 3, loops=2, ignore_eos=True)) == 0        # no coda after 2


def test_a_prompt_cached_whole_still_computes_its_last_row(loaded):
    """The same 128-token prompt twice: the second adopts one block, not two, since its last
    row's logits give its first token; its answer is the cold one."""
    model = loaded.model
    prompt = [int(t) for t in np.random.default_rng(17).integers(3, 500, 128)]
    pool = cached_pool(model)
    request = GenerationRequest(prompt, 5, loops=4, ignore_eos=True)
    assert run_cached(model, request, pool)[1] == 0
    got, rows = run_cached(model, request, pool)
    assert rows == 64 and got == outcome(generate(model, request, prefill_chunk=64))


def test_adaptive_depth_publishes_its_prompt_only(loaded):
    model = loaded.model
    prompt = [int(t) for t in np.random.default_rng(13).integers(3, 500, 70)]
    pool = cached_pool(model)
    auto = GenerationRequest(prompt, 80, loops="auto", exit_threshold=1.0, ignore_eos=True)
    out, _ = run_cached(model, auto, pool)
    follow = GenerationRequest(prompt + list(out[0]) + [9], 3, loops=4, ignore_eos=True)
    assert run_cached(model, follow, pool)[1] == 64         # the prompt's one full block, none of the output


def test_a_window_keys_its_blocks_and_a_ring_shares_nothing(loaded):
    model = loaded.model
    prompt = [int(t) for t in np.random.default_rng(14).integers(3, 500, 200)]
    pool = cached_pool(model)
    run_cached(model, GenerationRequest(prompt, 3, loops=4, ignore_eos=True), pool)
    windowed = GenerationRequest(prompt + [1], 3, loops=4, ignore_eos=True, cache_window=150)      # not a ring
    got, rows = run_cached(model, windowed, pool)
    assert rows == 0 and got == outcome(generate(model, windowed, prefill_chunk=64))   # another window: another key
    again = GenerationRequest(prompt + [2], 3, loops=4, ignore_eos=True, cache_window=150)
    got, rows = run_cached(model, again, pool)
    assert rows == 192 and got == outcome(generate(model, again, prefill_chunk=64))    # the same window: served
    ring = GenerationRequest(prompt + [2], 300, loops=4, ignore_eos=True, cache_window=64)
    got, rows = run_cached(model, ring, pool)
    assert rows == 0 and got == outcome(generate(model, ring, prefill_chunk=64))


def test_a_full_pool_evicts_idle_blocks_instead_of_refusing(loaded):
    """A pool that holds about three caches: ten distinct prompts run one after another, each
    finds room (the least recently used idle blocks go), and every block comes back."""
    model = loaded.model
    request = GenerationRequest([5] * 130, 10, loops=4, ignore_eos=True)
    need = Sequence.cache_blocks(model, request, 4)
    pool = cached_pool(model, (3 * need + 1) * KVPool.for_model(model, 1 << 20).block_bytes)
    rng = np.random.default_rng(15)
    for i in range(10):
        prompt = [int(t) for t in rng.integers(3, 500, 130)]
        r = GenerationRequest(prompt, 10, loops=4, ignore_eos=True)
        assert run_cached(model, r, pool)[0] == outcome(generate(model, r, prefill_chunk=64))
        assert pool.used_blocks <= pool.usable_blocks
    assert pool.prefix.evictions > 0 and pool.prefix.cached_blocks <= pool.usable_blocks
    assert pool.free_blocks == pool.usable_blocks


def test_the_engine_serves_cached_prefixes_to_concurrent_requests(loaded):
    model = loaded.model
    rng = np.random.default_rng(16)
    prompts = shared_prompts(rng, model.config.vocab_size, 6, 200)
    requests = [GenerationRequest(p, 8, loops=4, ignore_eos=True) for p in prompts]
    solo = [outcome(generate(model, r, prefill_chunk=64)) for r in requests]
    engine = Engine(loaded, max_waiting=8, max_running=3, prefill_chunk=64)
    try:
        first = engine_results(engine, requests[:1])
        rest = engine_results(engine, requests[1:])
        assert first + rest == solo
        assert engine.prefix.hit_tokens >= 5 * 192
    finally:
        engine.stop()
    off = Engine(loaded, max_waiting=8, max_running=3, prefill_chunk=64, prefix_cache=False)
    try:
        assert engine_results(off, requests) == solo and off.prefix is None
    finally:
        off.stop()


def test_the_pool_hands_out_its_lowest_free_blocks_first(loaded):
    """The pool's pages are touched as blocks are first used, so the resident set is the
    highest block ever handed out: freed blocks must be handed out again before untouched
    ones (kv/pool.py), or a long-running server walks, and keeps resident, its whole budget."""
    model = loaded.model
    pool = KVPool.for_model(model, 8 * KVPool.for_model(model, 1 << 20).block_bytes)
    pool.reserve(5)
    first = pool.allocate(5)
    assert sorted(first) == [1, 2, 3, 4, 5]
    pool.release(first[[3, 1]])                      # blocks 4 and 2 come back
    pool.reserve(3)
    again = pool.allocate(3)
    assert sorted(again) == [2, 4, 6]


def test_a_recurrence_with_a_random_initial_state_reuses_exactly(tmp_path):
    """A model whose core starts from seeded noise (config.initial_state "random"): the noise
    is a function of (state_seed, position), so cached rows are a cold prefill's rows too; the
    engine's key names the seed (engine/engine.py)."""
    path = tmp_path / "recurrent.tinyloop"
    make_test_model(path, "tiny-looped", seed=8, eos_token_ids=(), initial_state="random", state_std=0.5,
                    state_seed=17, input_injection="concat")
    model = load_model(path).model
    rng = np.random.default_rng(21)
    pool = cached_pool(model)
    for i, (prompt, loops) in enumerate(zip(shared_prompts(rng, model.config.vocab_size, 3, 140), (6, 6, 6))):
        request = GenerationRequest(prompt, 10, loops=loops, ignore_eos=True)
        got, cached = run_cached(model, request, pool)
        assert got == outcome(generate(model, request, prefill_chunk=64)), i
        assert cached == (0 if i == 0 else 128)         # the two full blocks of the shared 140 tokens
