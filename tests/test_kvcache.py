"""KV cache modes and sliding windows: error bounds, rotation, ring semantics,
bitwise batch invariance and speculative exactness per mode, settings."""
import numpy as np
import pytest
from test_model import random_config

from tinyloop.backends.reference import NumpyBackend
from tinyloop.backends.reference.kvstore import FloatStore, IntStore
from tinyloop.engine.generate import GenerationRequest, generate, speculative_generate
from tinyloop.engine.speculative import SpeculativeParams
from tinyloop.errors import RequestError, TinyLoopError
from tinyloop.kv.cache import KVCache
from tinyloop.kv.config import kv_budget_from_env, kv_mode_from_env
from tinyloop.kv.modes import group_size, hadamard
from tinyloop.kv.pool import KVPool
from tinyloop.model.loader import load_model
from tinyloop.model.modelfile import write_model_file
from tinyloop.model.plan import build_plan
from tinyloop.model.testmodels import random_weights, train_tokenizer

MODES = ["fp16", "int8", "int4", "int4-h", "fp32"]


# ----------------------------------------------------------------------------- codecs
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_int_codec_error_is_at_most_half_a_step(bits, head_dim):
    rng = np.random.default_rng(bits + head_dim)
    codec = IntStore(bits)
    x = (rng.standard_normal((50, 3, head_dim)) * rng.uniform(0.1, 10, (50, 3, 1))).astype(np.float32)
    codes, scale, offset = codec.quantize(x)
    restored = codec.dequantize(codes, scale, offset)
    step = np.repeat(scale.astype(np.float32), group_size(head_dim), axis=-1)
    assert np.all(np.abs(restored - x) <= step / 2 * (1 + 1e-3) + 1e-6)
    # through the storage arrays too (packing included)
    arrays = codec.allocate(3, 64, head_dim)
    codec.store(arrays, np.arange(50), x)
    assert np.array_equal(codec.rows(arrays, np.arange(50)), restored.transpose(1, 0, 2))


def test_fp16_codec_rounds_to_half_precision():
    x = np.random.default_rng(0).standard_normal((10, 2, 16)).astype(np.float32)
    codec = FloatStore(np.float16)
    arrays = codec.allocate(2, 64, 16)
    codec.store(arrays, np.arange(3, 13), x)
    assert np.array_equal(codec.rows(arrays, np.arange(3, 13)), x.astype(np.float16).astype(np.float32)
                          .transpose(1, 0, 2))


def test_hadamard_is_orthonormal_and_keeps_scores():
    for head_dim in (16, 64, 128):
        h = hadamard(head_dim).astype(np.float64)
        assert np.allclose(h @ h.T, np.eye(head_dim), atol=1e-6)
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((5, 64)), rng.standard_normal((7, 64))
    h = hadamard(64).astype(np.float64)
    assert np.allclose((q @ h) @ (k @ h).T, q @ k.T, atol=1e-9)
    with pytest.raises(ValueError, match="power-of-two"):
        hadamard(48)


def test_hadamard_spreads_outliers_before_int4():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((200, 1, 64)).astype(np.float32)
    x[:, :, 5] *= 40                                   # an outlier channel, as in real keys
    codec = IntStore(4)
    plain = codec.dequantize(*codec.quantize(x))
    h = hadamard(64)
    rotated = codec.dequantize(*codec.quantize(x @ h)) @ h.T
    assert np.mean((rotated - x) ** 2) < 0.5 * np.mean((plain - x) ** 2)


# ----------------------------------------------------------------------------- models
@pytest.fixture(scope="module")
def tokenizer_json():
    return train_tokenizer().to_str()


def model_with(tmp_path, config, tokenizer_json, seed, mode):
    path = tmp_path / f"m{seed}.tinyloop"
    if not path.exists():
        write_model_file(path, config, random_weights(config, seed), tokenizer_json)
    return load_model(path, kv_mode=mode).model


def power_of_two_config(rng):
    while True:
        config = random_config(rng, 512)
        if config.head_dim in (8, 16):
            return config


@pytest.mark.exactness(sample=2)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("window", [0, 40])
def test_batch_invariance_per_mode(tmp_path, tokenizer_json, mode, window):
    rng = np.random.default_rng(MODES.index(mode) * 10 + window)
    for trial in range(3):
        model = model_with(tmp_path, power_of_two_config(rng), tokenizer_json, trial, mode)
        loops = int(rng.integers(1, model.config.max_loops + 1))
        n_prefix, n_new = int(rng.integers(0, 150)), int(rng.integers(1, 66))
        tokens = rng.integers(0, 512, n_prefix + n_new)
        capacity = n_prefix + n_new
        runs = []
        for together in (True, False):
            cache = model.new_cache(capacity, loops, window=window)
            if n_prefix:
                model.forward(tokens[:n_prefix], np.arange(n_prefix), cache, loops)
            if together:
                out = model.forward(tokens[n_prefix:], np.arange(n_prefix, capacity), cache, loops)
            else:
                out = np.concatenate([model.forward(tokens[p:p + 1], [p], cache, loops)
                                      for p in range(n_prefix, capacity)])
            runs.append((out, cache.stored(max(0, capacity - 64), capacity)))
        assert np.array_equal(runs[0][0], runs[1][0]), (mode, window, trial)
        for name in runs[0][1]:
            assert np.array_equal(runs[0][1][name], runs[1][1][name]), name


@pytest.mark.exactness
@pytest.mark.parametrize("mode", ["fp16", "int4-h"])
def test_ring_buffer_equals_a_full_cache_with_the_same_window(tiny, mode):
    """Positions past the ring's size wrap around; results stay bitwise those of an
    unbounded cache masked to the same window."""
    model = load_model(tiny.file.path, kv_mode=mode).model
    window, total = 70, 400
    tokens = np.random.default_rng(3).integers(0, 512, total)
    ring = model.new_cache(total, 4, window=window)
    full = KVCache(model.backend, ring.n_slots, model.config.n_kv_heads, model.config.head_dim, total, mode, window,
                   ring=False)
    assert ring.ring is not None and ring.rows < total and full.ring is None
    out = [np.concatenate([model.forward(tokens[p:p + 1], [p], cache, 4) for p in range(total)])
           for cache in (ring, full)]
    assert np.array_equal(out[0], out[1])
    assert ring.nbytes < full.nbytes / 2


def test_window_attention_matches_a_brute_force_softmax():
    rng = np.random.default_rng(4)
    window, total, hd = 50, 300, 16
    keys = rng.standard_normal((total, 2, hd)).astype(np.float32)
    values = rng.standard_normal((total, 2, hd)).astype(np.float32)
    backend = NumpyBackend()
    cache = KVCache(backend, 1, 2, hd, total, "fp32", window)
    assert cache.ring is not None
    for start in range(0, total, 40):                       # written in pieces, wrapping the ring
        stop = min(start + 40, total)
        positions = np.arange(start, stop)
        plan = build_plan(positions, start, cache.geometry)
        backend.kv_write(cache.storage, 0, plan, keys[start:stop], values[start:stop])
        q = rng.standard_normal((stop - start, 4, hd)).astype(np.float32)
        got = backend.attention(q, cache.storage, 0, plan, 0.3)
        for t, p in enumerate(positions):
            lo = max(0, p - window + 1)
            for head in range(4):
                kv = head // 2
                scores = keys[lo:p + 1, kv] @ q[t, head] * 0.3
                weights = np.exp(scores - scores.max())
                expected = (weights / weights.sum()) @ values[lo:p + 1, kv]
                assert np.allclose(got[t, head], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.exactness
@pytest.mark.parametrize("mode", ["fp16", "int8", "int4", "int4-h"])
def test_speculation_stays_exact_with_every_mode_and_window(tiny, mode):
    model = load_model(tiny.file.path, kv_mode=mode).model
    rng = np.random.default_rng(MODES.index(mode))
    for case in range(6):
        window = int(rng.choice([0, 30, 100]))
        prompt = [int(t) for t in rng.integers(0, 512, int(rng.integers(1, 150)))]
        max_tokens = int(rng.integers(20, 60))
        plain = generate(model, GenerationRequest(prompt, max_tokens, loops=8, cache_window=window)).tokens
        for branches in (1, 3):
            params = SpeculativeParams(int(rng.integers(1, 8)), 8, int(rng.integers(1, 9)), branches)
            out = speculative_generate(model, GenerationRequest(prompt, max_tokens, cache_window=window), params)
            assert out.tokens == plain, (mode, window, params)


@pytest.mark.exactness(sample=2)
@pytest.mark.parametrize("block", range(8))
def test_speculation_over_random_configs_with_every_mode_and_window(tmp_path, tokenizer_json, block):
    """Random configs (1, 2 or 4 KV heads, head dims 8 and 16) x cache modes x windows:
    greedy chains and trees equal plain generation, token for token."""
    rng = np.random.default_rng(500 + block)
    for case in range(8):
        mode = MODES[int(rng.integers(len(MODES)))]
        config = power_of_two_config(rng)
        if config.max_loops < 2:
            continue
        model = model_with(tmp_path, config, tokenizer_json, 100 * block + case, mode)
        window = int(rng.choice([0, 24, 70]))
        prompt = [int(t) for t in rng.integers(0, 512, int(rng.integers(1, 160)))]
        max_tokens = int(rng.integers(10, 50))
        verify = int(rng.integers(2, config.max_loops + 1))
        plain = generate(model, GenerationRequest(prompt, max_tokens, loops=verify, cache_window=window)).tokens
        for branches in (1, int(rng.integers(2, 7))):
            params = SpeculativeParams(int(rng.integers(1, verify)), verify, int(rng.integers(1, 9)), branches)
            out = speculative_generate(model, GenerationRequest(prompt, max_tokens, cache_window=window), params)
            assert out.tokens == plain, (mode, window, params)


def test_window_bounds_memory(tiny):
    model = tiny.model
    small = model.new_cache(200, 4, window=64)
    large = model.new_cache(5000, 4, window=64)
    assert small.nbytes == large.nbytes
    assert model.new_cache(5000, 4).nbytes > 20 * large.nbytes


def test_cache_budget_refuses_with_the_numbers(tiny):
    model = load_model(tiny.file.path).model
    pool = KVPool.for_model(model, int(0.9 * 2**20), from_setting=True)
    with pytest.raises(RequestError, match=r"needs \d+\.\d MiB of KV cache .* the budget is 0.9 MiB "
                                           r"\(TINYLOOP_KV_BUDGET_MB\)"):
        generate(model, GenerationRequest([1, 2, 3], 400, loops=8), pool=pool)
    windowed = generate(model, GenerationRequest([1, 2, 3], 400, loops=8, cache_window=64, ignore_eos=True), pool=pool)
    assert len(windowed.tokens) == 400 and windowed.finish_reason == "length"     # a window fits the budget
    with pytest.raises(RequestError, match="KV cache"):
        speculative_generate(model, GenerationRequest([1, 2, 3], 400), SpeculativeParams(2, 8), pool=pool)


# ----------------------------------------------------------------------------- settings
@pytest.mark.parametrize("env, mode", [
    ({}, "fp16"),
    ({"TINYLOOP_KV_INT8": "1"}, "int8"),
    ({"TINYLOOP_KV_INT4": "1"}, "int4"),
    ({"TINYLOOP_KV_INT4": "1", "TINYLOOP_KV_H_MODE": "1"}, "int4-h"),
    ({"TINYLOOP_KV_CACHE": "int4-h"}, "int4-h"),
    ({"TINYLOOP_KV_CACHE": "int8", "TINYLOOP_KV_INT8": "1"}, "int8"),
    ({"TINYLOOP_KV_INT8": "0", "TINYLOOP_KV_CACHE": "fp32"}, "fp32"),
])
def test_environment_mapping(env, mode):
    assert kv_mode_from_env(env) == mode


@pytest.mark.parametrize("env, message", [
    ({"TINYLOOP_KV_INT8": "1", "TINYLOOP_KV_INT4": "1"}, "TINYLOOP_KV_INT8=1 and TINYLOOP_KV_INT4=1 conflict"),
    ({"TINYLOOP_KV_H_MODE": "1"}, "TINYLOOP_KV_H_MODE=1 needs TINYLOOP_KV_INT4=1"),
    ({"TINYLOOP_KV_H_MODE": "1", "TINYLOOP_KV_INT8": "1"}, "not TINYLOOP_KV_INT8=1"),
    ({"TINYLOOP_KV_CACHE": "int8", "TINYLOOP_KV_INT4": "1"},
     "TINYLOOP_KV_CACHE=int8 conflicts with TINYLOOP_KV_INT4=1 \\(which means int4\\)"),
    ({"TINYLOOP_KV_CACHE": "int3"}, "TINYLOOP_KV_CACHE must be one of"),
    ({"TINYLOOP_KV_INT4": "yes please"}, "TINYLOOP_KV_INT4 must be 1 or 0"),
])
def test_conflicting_settings_are_named(env, message):
    with pytest.raises(TinyLoopError, match=message):
        kv_mode_from_env(env)


def test_budget_setting():
    assert kv_budget_from_env({}) is None
    assert kv_budget_from_env({"TINYLOOP_KV_BUDGET_MB": "1.5"}) == 3 * 2**19
    for bad in ("-2", "0", "inf", "nan"):          # inf once reached int(): an OverflowError, not a message
        with pytest.raises(TinyLoopError, match="TINYLOOP_KV_BUDGET_MB must be positive"):
            kv_budget_from_env({"TINYLOOP_KV_BUDGET_MB": bad})
    with pytest.raises(TinyLoopError, match="TINYLOOP_KV_BUDGET_MB must be a number of MiB, got 'lots'"):
        kv_budget_from_env({"TINYLOOP_KV_BUDGET_MB": "lots"})
