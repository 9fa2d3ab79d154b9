"""The forward pass: golden output, batch invariance (exactness foundation), loops."""
import numpy as np
import pytest

from tinyloop.engine.generate import GenerationRequest, generate
from tinyloop.errors import RequestError
from tinyloop.model.config import ModelConfig
from tinyloop.model.loader import load_model
from tinyloop.model.modelfile import write_model_file
from tinyloop.model.testmodels import random_weights, train_tokenizer

GOLDEN_PROMPT = [320, 458, 425, 290, 332, 286, 85, 414, 79, 266, 485, 85, 297, 293, 74, 306, 495]
GOLDEN = {
    1: [335, 429, 264, 131, 98, 448, 331, 448, 331, 448, 331, 155, 151, 125, 74, 372],
    4: [180, 290, 342, 115, 478, 414, 509, 310, 296, 397, 216, 21, 27, 317, 412, 323],
}


def test_golden_greedy_tokens(tiny):
    assert tiny.tokenizer.encode("The looped transformer reads each token once") == GOLDEN_PROMPT
    for loops, expected in GOLDEN.items():
        result = generate(tiny.model, GenerationRequest(GOLDEN_PROMPT, max_tokens=16, loops=loops))
        assert result.tokens == expected, f"loops={loops}"


def random_config(rng, vocab_size) -> ModelConfig:
    n_kv = int(rng.choice([1, 2, 4]))
    group = int(rng.choice([1, 2])) if n_kv < 4 else 1
    norm_mlp = [("rmsnorm", "swiglu"), ("layernorm", "gelu")][int(rng.integers(2))]
    max_loops = int(rng.integers(1, 9))
    return ModelConfig(
        vocab_size=vocab_size, dim=int(rng.choice([32, 48])), n_heads=n_kv * group, n_kv_heads=n_kv,
        head_dim=int(rng.choice([8, 16])), ffn_dim=int(rng.choice([40, 64])), max_seq_len=256,
        n_prelude=int(rng.integers(0, 3)), n_core=int(rng.integers(1, 3)), n_coda=int(rng.integers(0, 3)),
        default_loops=max_loops, min_loops=1, max_loops=max_loops,
        norm=norm_mlp[0], mlp=norm_mlp[1], positions=str(rng.choice(["rope", "learned"])),
        bias=bool(rng.integers(2)), tied_head=bool(rng.integers(2)),
        input_injection=str(rng.choice(["none", "add", "concat"])), eos_token_ids=(0,),
        # the options of Ouro / Huginn layouts (hf_layouts.py), in any combination
        post_norm=str(rng.choice(["none", "branch", "sum"])), loop_norm=str(rng.choice(["none", "between", "after"])),
        initial_state=str(rng.choice(["prelude", "random"])), state_std=0.5, state_seed=int(rng.integers(100)),
        qk_bias=bool(rng.integers(2)), embed_scale=float(rng.choice([1.0, 2.0])), exit_gate=bool(rng.integers(2)))


@pytest.fixture(scope="module")
def tokenizer_json():
    return train_tokenizer().to_str()


def build(tmp_path, config, tokenizer_json, seed):
    path = write_model_file(tmp_path / f"m{seed}.tinyloop", config, random_weights(config, seed),
                            tokenizer_json)
    return load_model(path).model


@pytest.mark.exactness(sample=3)
@pytest.mark.parametrize("seed", range(30))
def test_forward_over_many_positions_equals_single_steps(tmp_path, tokenizer_json, seed):
    """Logits and every cache slot bitwise equal, for a random config, loops and T <= 100."""
    rng = np.random.default_rng(seed)
    model = build(tmp_path, random_config(rng, 512), tokenizer_json, seed)
    loops = int(rng.integers(1, model.config.max_loops + 1))
    n_prefix = int(rng.choice([0, 1, 37, 70]))
    n_new = int(rng.integers(1, 101))
    tokens = rng.integers(0, 512, n_prefix + n_new)
    capacity = n_prefix + n_new

    caches, logits = [], []
    for mode in ("together", "one_by_one"):
        cache = model.new_cache(capacity, loops)
        if n_prefix:
            model.forward(tokens[:n_prefix], np.arange(n_prefix), cache, loops)
        if mode == "together":
            out = model.forward(tokens[n_prefix:], np.arange(n_prefix, capacity), cache, loops)
        else:
            out = np.concatenate([model.forward(tokens[p:p + 1], np.array([p]), cache, loops)
                                  for p in range(n_prefix, capacity)])
        caches.append(cache)
        logits.append(out)
    assert logits[0].shape == (n_new, 512)
    assert np.array_equal(logits[0], logits[1])
    assert_same_cache(caches[0], caches[1], capacity)


def assert_same_cache(a, b, rows):
    stored_a, stored_b = a.stored(0, rows), b.stored(0, rows)
    assert stored_a.keys() == stored_b.keys()
    for name in stored_a:
        assert np.array_equal(stored_a[name], stored_b[name]), name


@pytest.mark.exactness
def test_stale_rows_past_the_length_do_not_leak_into_attention(tiny):
    """After a rollback, rows past the position hold old keys; results must not change."""
    model = tiny.model
    tokens = np.arange(3, 83)
    clean = model.new_cache(80, 4)
    expected = model.forward(tokens, np.arange(80), clean, 4)
    dirty = model.new_cache(80, 4)
    model.forward(np.arange(100, 180) % 512, np.arange(80), dirty, 4)   # other tokens first
    got = np.concatenate([model.forward(tokens[p:p + 1], np.array([p]), dirty, 4) for p in range(80)])
    assert np.array_equal(expected, got)


def test_loops_change_the_logits(tiny):
    model = tiny.model
    tokens = np.array(GOLDEN_PROMPT)
    outs = {loops: model.forward(tokens, np.arange(len(tokens)), model.new_cache(32, loops), loops)
            for loops in (1, 2, 4, 8)}
    for a in outs:
        for b in outs:
            if a < b:
                assert not np.array_equal(outs[a], outs[b]), (a, b)


def test_loop_count_outside_the_range_is_rejected(tiny):
    for loops in (0, 9):
        with pytest.raises(RequestError, match=r"loops must be in \[1, 8\]"):
            generate(tiny.model, GenerationRequest([1, 2, 3], max_tokens=2, loops=loops))


def test_cache_has_one_slot_per_executed_layer_instance(tiny):
    config = tiny.config
    cache = tiny.model.new_cache(10, 5)
    slots = config.n_prelude + config.n_core * 5 + config.n_coda
    assert cache.table.shape == (slots, 1) and cache.blocks_held == 0       # one 64-row block per slot, not yet taken
    # the default fp16 mode: half-precision bits, written by the forward into blocks it takes
    tiny.model.forward(np.arange(10), np.arange(10), cache, 5)
    assert cache.blocks_held == slots and len(set(cache.table.ravel().tolist())) == slots
    stored = cache.stored(0, 10)["keys.data"]
    assert stored.shape == (slots, config.n_kv_heads, 10, config.head_dim)
    assert stored.dtype == np.uint16 and np.all(np.any(stored != 0, axis=(1, 2, 3)))


def test_prefill_fast_path_is_close_to_exact_path(tiny):
    """The GEMM prefill is not bitwise equal to steps (BLAS), but must be the same function."""
    model = tiny.model
    tokens = np.arange(5, 205) % 512
    exact = model.forward(tokens, np.arange(200), model.new_cache(200, 4), 4, exact=True)
    fast = model.forward(tokens, np.arange(200), model.new_cache(200, 4), 4, exact=False)
    assert np.max(np.abs(exact - fast)) < 1e-3 * np.max(np.abs(exact))


@pytest.mark.exactness
def test_batch_invariance_holds_over_many_attention_blocks(tmp_path, tokenizer_json):
    """Past 8 key blocks a pairwise sum would regroup; the block merge must stay sequential."""
    rng = np.random.default_rng(99)
    config = random_config(rng, 512)
    config = ModelConfig.from_dict({**config.to_dict(), "max_seq_len": 1100, "max_loops": 2,
                                    "default_loops": 2, "positions": "rope"})
    model = build(tmp_path, config, tokenizer_json, 99)
    tokens = rng.integers(0, 512, 1000)
    n_prefix, capacity = 935, 1000
    results = []
    for together in (True, False):
        cache = model.new_cache(capacity, 2)
        model.forward(tokens[:n_prefix], np.arange(n_prefix), cache, 2, exact=False)
        if together:
            out = model.forward(tokens[n_prefix:], np.arange(n_prefix, capacity), cache, 2)
        else:
            out = np.concatenate([model.forward(tokens[p:p + 1], np.array([p]), cache, 2)
                                  for p in range(n_prefix, capacity)])
        results.append((out, cache))
    assert np.array_equal(results[0][0], results[1][0])
    assert_same_cache(results[0][1], results[1][1], capacity)


@pytest.mark.exactness
def test_truncate_rolls_back_as_if_the_rows_were_never_written(tiny):
    model = tiny.model
    prefix, first, second = np.arange(3, 23), np.arange(100, 106), np.arange(200, 206)

    def decode(cache, tokens):
        out = []
        for token in tokens:
            out.append(model.forward([int(token)], [cache.length], cache, 4)[0])
            cache.length += 1
        return np.stack(out)

    rolled = model.new_cache(40, 4)
    model.forward(prefix, np.arange(20), rolled, 4)
    rolled.length = 20
    decode(rolled, first)
    rolled.truncate(20)
    fresh = model.new_cache(40, 4)
    model.forward(prefix, np.arange(20), fresh, 4)
    fresh.length = 20
    assert np.array_equal(decode(rolled, second), decode(fresh, second))
    with pytest.raises(ValueError, match="cannot truncate cache of length 26 to 30"):
        rolled.truncate(30)


def test_llama3_rope_scaling_keeps_short_slows_long_and_blends_between():
    """head_dim 8 at theta 10000: wavelengths 2 pi x (1, 10, 100, 1000). Bands for original
    length 128, low 1, high 4: kept below 32, slowed by the factor above 128, blended between."""
    from tinyloop.backends.reference.positions import inv_frequencies
    plain = inv_frequencies(8, 10000.0)
    assert np.allclose(plain, [1.0, 0.1, 0.01, 0.001], rtol=1e-12)
    scaled = inv_frequencies(8, 10000.0, "llama3", 32.0, 1.0, 4.0, 128)
    blend = (128 / (2 * np.pi * 10) - 1) / (4 - 1)               # where 63 lies between 128 and 32
    assert 0 < blend < 1
    assert np.allclose(scaled, [1.0, 0.1 * ((1 - blend) / 32 + blend), 0.01 / 32, 0.001 / 32], rtol=1e-12)
    assert np.allclose(inv_frequencies(8, 10000.0, "llama3", 1.0, 1.0, 4.0, 128), plain, rtol=1e-14)  # factor 1
