"""The CPU backend's compiled row kernels (backends/cpu/kernels: norms, activations, rope,
topk, fmath, rows_f64) against their NumPy oracles, bit for bit; a row alone against the
same row inside a batch (serial and threaded drivers); accuracy against float64 NumPy;
the same bits under other numba compile targets (NUMBA_CPU_NAME)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from numba import njit

from tinyloop.backends.cpu import CpuBackend
from tinyloop.backends.cpu.targets import compile_env
from tinyloop.backends.cpu import activations, norms, positions, topk
from tinyloop.backends.cpu.kernels import activations as act_kernels
from tinyloop.backends.cpu.kernels import activations_oracle, fmath, fmath_oracle, norms_oracle
from tinyloop.backends.cpu.kernels import norms as norm_kernels
from tinyloop.backends.cpu.kernels import rope as rope_kernels
from tinyloop.backends.cpu.kernels import rope_oracle, rows, rows_f64, rows_f64_oracle, topk_oracle
from tinyloop.backends.cpu.kernels import topk as topk_kernels
from tinyloop.backends.reference.twins import sampling as sampling_twin

pytestmark = pytest.mark.slow      # the experimental numba backend (TINYLOOP_CPU_KERNELS=numba): -m slow

F = np.float32


def bits_equal(a, b) -> bool:
    a, b = np.atleast_1d(np.asarray(a)), np.atleast_1d(np.asarray(b))
    return a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8))


def edge_rows(rng, rows: int, width: int, scale=3.0) -> np.ndarray:
    """(rows, width) normal floats times scale; with 5 rows or more, rows 0-4 all zeros, huge
    (squares overflow), large, tiny (squares underflow) and subnormal."""
    x = (rng.standard_normal((rows, width)) * scale).astype(F)
    if rows >= 5:
        x[:5] *= np.array([0, 3e19, 1e15, 1e-22, 1e-39], F)[:, None]
    return x


# ------------------------------------------------------------------------ fmath (float32)
@njit(error_model="numpy")  # no cache: numba would not see a change in fmath.py or rows_f64.py
def _exp_array(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = fmath.exp_f32(x[i])
    return out


@njit(error_model="numpy")  # no cache: numba would not see a change in fmath.py or rows_f64.py
def _tanh_array(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = fmath.tanh_f32(x[i])
    return out


@njit(error_model="numpy")  # no cache: numba would not see a change in fmath.py or rows_f64.py
def _silu_array(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = fmath.silu_f32(x[i])
    return out


SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1e-38, -1e-38, 3.4e38,
                     -3.4e38, 88.72283, 88.72284, 88.7, -87.33654, -87.33655, -87.3, -103.9, -104.1,
                     10.0, -10.0, 10.000001, -10.000001, 5.0, -5.0, 20.0, -20.0, 1e-7, -1e-7], F)


def float32_sweep() -> np.ndarray:
    """Every 1021st float32 bit pattern (all signs and exponents: subnormals, inf, NaNs with
    payloads), a dense grid over [-120, 120], and the specials."""
    bits = np.arange(0, 2 ** 32, 1021, dtype=np.uint64).astype(np.uint32)
    grid = np.linspace(-120, 120, 1_000_001, dtype=np.float64).astype(F)
    return np.concatenate([bits.view(F), grid, SPECIALS])


@pytest.mark.parametrize("name", ["exp", "tanh", "silu"])
def test_fmath_kernels_equal_their_oracle_bit_for_bit(name):
    kernel = {"exp": _exp_array, "tanh": _tanh_array, "silu": _silu_array}[name]
    oracle = {"exp": fmath_oracle.exp_f32, "tanh": fmath_oracle.tanh_f32, "silu": fmath_oracle.silu_f32}[name]
    x = float32_sweep()
    got, expected = kernel(x), oracle(x)
    mismatch = np.flatnonzero(got.view(np.uint32) != expected.view(np.uint32))
    assert mismatch.size == 0, (name, x[mismatch[:5]], got[mismatch[:5]], expected[mismatch[:5]])


def test_fmath_is_accurate():
    x = np.linspace(-87, 88, 200_001, dtype=F)
    exact = np.exp(x.astype(np.float64))
    assert np.max(np.abs(_exp_array(x) / exact - 1)) < 2.5 * 2.0 ** -24
    t = np.linspace(-12, 12, 200_001, dtype=F)
    assert np.max(np.abs(_tanh_array(t) - np.tanh(t.astype(np.float64)))) < 4 * 2.0 ** -24
    with np.errstate(over="ignore"):
        silu = t.astype(np.float64) / (1 + np.exp(-t.astype(np.float64)))
    assert np.all(np.abs(_silu_array(t) - silu) <= 4 * 2.0 ** -24 * np.maximum(np.abs(silu), 1e-30))


# ------------------------------------------------------------------ rows_f64 (float64)
@njit(error_model="numpy")  # no cache: numba would not see a change in fmath.py or rows_f64.py
def _exp64_array(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = rows_f64.exp_f64(x[i])
    return out


@njit(error_model="numpy")  # no cache: numba would not see a change in fmath.py or rows_f64.py
def _log64_array(x):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = rows_f64.log_f64(x[i])
    return out


@njit(error_model="numpy")  # no cache: numba would not see a change in fmath.py or rows_f64.py
def _sincos64_array(x):
    s, c = np.empty_like(x), np.empty_like(x)
    for i in range(x.shape[0]):
        s[i], c[i] = rows_f64.sincos_f64(x[i])
    return s, c


def float64_sweep(rng) -> np.ndarray:
    bits = rng.integers(0, 2 ** 63, 300_000, dtype=np.int64)
    bits[: 150_000] |= np.int64(-2 ** 63)                                  # negatives
    return np.concatenate([bits.view(np.float64), np.linspace(-760, 720, 300_001),
                           np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 5e-324, -5e-324, 2.2e-308,
                                     709.782712893384, 709.79, -745.1332191019411, -745.14, -708.4, 1e-17])])


def test_float64_exp_and_log_equal_their_oracle_and_are_accurate():
    rng = np.random.default_rng(5)
    x = float64_sweep(rng)
    got = _exp64_array(x)
    assert bits_equal(got, rows_f64_oracle.exp_f64(x))
    y = np.abs(x)
    assert bits_equal(_log64_array(y), rows_f64_oracle.log_f64(y))
    assert np.isnan(_log64_array(np.array([-1.0, np.nan]))).all()
    with np.errstate(over="ignore", under="ignore"):
        exact = np.exp(x)
    normal = (exact > 2.3e-308) & (exact < np.inf)
    assert np.max(np.abs(got[normal] / exact[normal] - 1)) <= 2.0 ** -52       # under 1 ulp (fdlibm)
    assert np.array_equal(np.isinf(got), np.isinf(exact)) and np.array_equal(np.isnan(got), np.isnan(exact))
    finite = (y > 0) & (y < np.inf) & (np.abs(np.log(np.where(y > 0, y, 1))) > 1e-3)
    with np.errstate(divide="ignore"):
        assert np.max(np.abs(_log64_array(y[finite]) / np.log(y[finite]) - 1)) <= 2.0 ** -52


def test_float64_sincos_equal_their_oracle_and_are_accurate():
    rng = np.random.default_rng(6)
    x = np.concatenate([rng.random(200_000) * 1.6e6, rng.random(200_000) * 10, np.arange(0, 5000) * (np.pi / 4),
                        [0.0, np.pi / 2, np.pi, 1e-300, 1.599e6]])
    s, c = _sincos64_array(x)
    s_oracle, c_oracle = rows_f64_oracle.sincos_f64(x)
    assert bits_equal(s, s_oracle) and bits_equal(c, c_oracle)
    assert np.max(np.abs(s - np.sin(x))) <= 2.0 ** -53 and np.max(np.abs(c - np.cos(x))) <= 2.0 ** -53


# ------------------------------------------------------------------------------- norms
NORM_SHAPES = [(1, 576), (3, 16), (2, 1), (5, 15), (9, 17), (65, 960), (4, 2048), (7, 1537), (300, 576)]


@pytest.mark.parametrize("rows_, width", NORM_SHAPES)
@pytest.mark.parametrize("norm", ["rms", "layer", "layer_no_bias"])
def test_norm_kernels_equal_the_oracle(norm, rows_, width):
    rng = np.random.default_rng(rows_ * 1000 + width)
    x = edge_rows(rng, rows_, width)
    weight = rng.standard_normal(width).astype(F)
    bias = None if norm == "layer_no_bias" else rng.standard_normal(width).astype(F)
    eps = float(rng.choice([1e-5, 1e-6, 0.0]))
    with np.errstate(over="ignore", invalid="ignore"):
        if norm == "rms":
            expected = norms_oracle.rms_norm(x, weight, eps)
            drivers = [lambda out: norm_kernels.rms_norm_serial(x, weight, F(eps), out),
                       lambda out: norm_kernels.rms_norm_parallel(x, weight, F(eps), out)]
            public = norms.rms_norm(x, weight, eps)
        else:
            expected = norms_oracle.layer_norm(x, weight, bias, eps)
            b = weight if bias is None else bias
            drivers = [lambda out: norm_kernels.layer_norm_serial(x, weight, b, bias is not None, F(eps), out),
                       lambda out: norm_kernels.layer_norm_parallel(x, weight, b, bias is not None, F(eps), out)]
            public = norms.layer_norm(x, weight, bias, eps)
    for run in drivers:
        out = np.empty_like(x)
        run(out)
        assert bits_equal(out, expected)
    assert bits_equal(public, expected)


@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_norm_rows_alone_equal_rows_in_any_batch(norm):
    """Row r normalised alone (serial driver) has the bits it has among 3700 rows (the threaded
    driver) and among other random rows, from a strided or Fortran-ordered input too."""
    rng = np.random.default_rng(8)
    x = edge_rows(rng, 3700, 576)
    weight, bias = rng.standard_normal((2, 576)).astype(F)
    run = (lambda a: norms.rms_norm(a, weight, 1e-5)) if norm == "rms" else (lambda a: norms.layer_norm(a, weight, bias, 1e-5))
    with np.errstate(over="ignore", invalid="ignore"):
        together = run(x)
        assert x.size >= rows.PARALLEL_ELEMENTS                              # the threaded driver ran
        for r in (0, 1, 3, 4, 5, 64, 3699):
            assert bits_equal(run(x[r:r + 1])[0], together[r]), r
            others = rng.standard_normal((16, 576)).astype(F) * F(100)
            others[7] = x[r]
            assert bits_equal(run(others)[7], together[r]), r
        assert bits_equal(run(np.asfortranarray(x[:40])), together[:40])
        assert bits_equal(run(np.repeat(x[:300], 2, 0)[::2]), together[:300])


@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_norms_are_accurate(norm):
    rng = np.random.default_rng(9)
    x = (rng.standard_normal((33, 2048)) * 5 + 2).astype(F)
    weight, bias = rng.standard_normal((2, 2048)).astype(F)
    x64 = x.astype(np.float64)
    if norm == "rms":
        got = norms.rms_norm(x, weight, 1e-5)
        exact = x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + 1e-5) * weight
    else:
        got = norms.layer_norm(x, weight, bias, 1e-5)
        c = x64 - x64.mean(axis=1, keepdims=True)
        exact = c / np.sqrt((c * c).mean(axis=1, keepdims=True) + 1e-5) * weight + bias
    scale = np.abs(exact).max(axis=1, keepdims=True)
    assert np.all(np.abs(got - exact) <= 2e-6 * scale)


# ------------------------------------------------------------------------- activations
ACT_SHAPES = [(1, 1536), (1, 1), (3, 7), (16, 1536), (65, 300), (129, 1536)]


@pytest.mark.parametrize("rows_, ffn", ACT_SHAPES)
def test_swiglu_kernel_equals_the_oracle(rows_, ffn):
    rng = np.random.default_rng(rows_ + ffn)
    up = (rng.standard_normal((rows_, 2 * ffn)) * rng.choice([1, 4, 30, 1e4], (rows_, 2 * ffn))).astype(F)
    up.reshape(-1)[:SPECIALS.size] = SPECIALS[:up.size]
    expected = activations_oracle.swiglu(up, ffn)
    for run in (act_kernels.swiglu_serial, act_kernels.swiglu_parallel):
        out = np.empty((rows_, ffn), F)
        run(up, ffn, out)
        assert bits_equal(out, expected)
    assert bits_equal(activations.swiglu(up, ffn), expected)
    assert bits_equal(activations.swiglu(np.asfortranarray(up), ffn), expected)


@pytest.mark.parametrize("shape", [(1,), (5, 3), (1, 1536), (16, 1536), (130, 3072)])
def test_gelu_kernel_equals_the_oracle(shape):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * rng.choice([1, 4, 30, 1e4, 1e-20], shape)).astype(F)
    x.reshape(-1)[:SPECIALS.size] = SPECIALS[:x.size]
    expected = activations_oracle.gelu(x)
    flat = x.reshape(-1)
    for run in (act_kernels.gelu_serial, act_kernels.gelu_parallel):
        out = np.empty_like(flat)
        run(flat, out)
        assert bits_equal(out.reshape(shape), expected)
    assert bits_equal(activations.gelu_tanh(x), expected)


def test_activation_rows_alone_equal_rows_in_any_batch():
    rng = np.random.default_rng(12)
    up = (rng.standard_normal((1400, 2 * 1536)) * 4).astype(F)
    together, gelu_together = activations.swiglu(up, 1536), activations.gelu_tanh(up)
    assert together.size >= rows.PARALLEL_ELEMENTS
    for r in (0, 7, 1399):
        assert bits_equal(activations.swiglu(up[r:r + 1], 1536)[0], together[r])
        assert bits_equal(activations.gelu_tanh(up[r:r + 1])[0], gelu_together[r])
        assert bits_equal(activations.gelu_tanh(up[r, 5:1000]), gelu_together[r, 5:1000])   # any offset


def test_activations_are_accurate():
    rng = np.random.default_rng(13)
    up = (rng.standard_normal((16, 2 * 1536)) * 6).astype(F)
    g, u = up[:, :1536].astype(np.float64), up[:, 1536:].astype(np.float64)
    exact = g / (1 + np.exp(-g)) * u
    assert np.all(np.abs(activations.swiglu(up, 1536) - exact) <= 1e-6 * np.abs(exact) + 1e-37)
    x = up.astype(np.float64)
    exact = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    # 1 + tanh(u) cancels for negative x: the error is absolute, ~|x| 2^-23.
    assert np.all(np.abs(activations.gelu_tanh(up) - exact) <= 2e-6 * np.abs(exact) + 3e-7 * np.abs(x))


# -------------------------------------------------------------------------------- RoPE
def smol_frequencies(head_dim=64):
    return positions.inv_frequencies(head_dim, 100000.0)


@pytest.mark.parametrize("head_dim, theta, scaling", [(64, 100000.0, "none"), (128, 500000.0, "llama3"),
                                                      (8, 10000.0, "none"), (2, 10000.0, "none")])
def test_rope_table_equals_the_oracle_and_numpy(head_dim, theta, scaling):
    freq = positions.inv_frequencies(head_dim, theta, scaling, 8.0, 1.0, 4.0, 8192)
    table = positions.rope_table(8192, freq)
    assert table.dtype == np.complex64 and table.shape == (8192, head_dim // 2)
    assert bits_equal(table, rope_oracle.rope_table(8192, freq))
    angles = np.arange(8192.0)[:, None] * freq[None, :]
    numpy_table = (np.cos(angles) + 1j * np.sin(angles)).astype(np.complex64)
    # float64 values within 2^-53 of NumPy's before rounding to float32: the roundings agree
    # unless NumPy's value sits within that of a float32 halfway point; measured: always equal.
    assert np.mean(table == numpy_table) > 0.9999
    ulp = np.spacing(np.abs(numpy_table.view(F)))
    assert np.all(np.abs(table.view(F) - numpy_table.view(F)) <= ulp)


def test_rope_table_refuses_angles_out_of_its_range():
    assert positions.rope_table(1_500_000, np.array([1.0])).shape == (1_500_000, 1)
    with pytest.raises(ValueError, match="range"):
        positions.rope_table(2_000_000, np.array([1.0]))


@pytest.mark.parametrize("rows_, heads, head_dim", [(1, 9, 64), (16, 9, 64), (3, 1, 2), (65, 3, 128), (512, 9, 64)])
def test_rope_kernel_equals_the_oracle(rows_, heads, head_dim):
    rng = np.random.default_rng(rows_ * heads)
    table = positions.rope_table(4096, positions.inv_frequencies(head_dim, 10000.0))
    rotation = table[rng.integers(0, 4096, rows_)]
    x = (rng.standard_normal((rows_, heads, head_dim)) * rng.choice([1, 10, 1e30], (rows_, heads, head_dim))).astype(F)
    x.reshape(-1)[:6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 3e38][:x.size]
    expected = rope_oracle.apply_rope(x, rotation)
    rot = np.ascontiguousarray(rotation)
    for run in (rope_kernels.rope_serial, rope_kernels.rope_parallel):
        out = np.empty_like(x)
        run(x.view(np.complex64), rot, out.view(np.complex64))
        assert bits_equal(out, expected)
    assert bits_equal(positions.apply_rope(x, rotation), expected)
    wide = np.zeros((rows_, heads * head_dim + 10), F)                  # a column range of a fused qkv row
    wide[:, 3:3 + heads * head_dim] = x.reshape(rows_, -1)
    view = wide[:, 3:3 + heads * head_dim].reshape(rows_, heads, head_dim)
    assert bits_equal(positions.apply_rope(view, rotation), expected)


def test_rope_rows_alone_equal_rows_in_any_batch_and_are_accurate():
    rng = np.random.default_rng(14)
    table = positions.rope_table(4096, smol_frequencies())
    where = rng.integers(0, 4096, 512)
    x = rng.standard_normal((4096, 9, 64)).astype(F)
    where = rng.integers(0, 4096, 4096)
    together = positions.apply_rope(x, table[where])
    assert x.size >= rows.PARALLEL_ELEMENTS
    for r in (0, 100, 4095):
        assert bits_equal(positions.apply_rope(x[r:r + 1], table[where[r:r + 1]])[0], together[r])
    exact = (x[..., 0::2] + 1j * x[..., 1::2]).astype(np.complex128) * table[where][:, None, :].astype(np.complex128)
    assert np.allclose(together[..., 0::2], exact.real, rtol=0, atol=1e-6)
    assert np.allclose(together[..., 1::2], exact.imag, rtol=0, atol=1e-6)


# --------------------------------------------------------------------- argmax and top-k
def tied_logits(rng, rows_: int, vocab: int) -> np.ndarray:
    """Integer values (ties everywhere), a normal row, a row of +-0 and -1, a constant row,
    NaNs, infinities."""
    logits = rng.integers(-8, 8, (rows_, vocab)).astype(F)
    if rows_ >= 7:
        logits[1] = rng.standard_normal(vocab).astype(F)
        logits[2] = np.where(rng.random(vocab) < 0.5, F(-0.0), F(0.0)) - (rng.random(vocab) < 0.9)
        logits[3] = F(-2.5)
        logits[4, [vocab // 3, vocab // 2]] = np.array([0xFFC00000, 0x7FC00001], np.uint32).view(F)
        logits[5] = -np.inf
        logits[6, vocab - 1] = np.inf
    if rows_ >= 9:
        logits[7] = rng.random(vocab).astype(F) * F(0.01)                  # dense: neighbours 1e-7 apart
        logits[8] = np.arange(vocab, dtype=F) * F(1e-3)                      # ascending: every id enters the k best
    return logits


@pytest.mark.parametrize("rows_, vocab", [(1, 49152), (7, 1000), (8, 17), (65, 4096), (9, 49152)])
def test_argmax_is_numpys_and_the_oracles(rows_, vocab):
    logits = tied_logits(np.random.default_rng(rows_), rows_, vocab)
    got = rows.argmax(logits)
    assert got.dtype == np.int64
    assert np.array_equal(got, np.argmax(logits, axis=1))
    assert np.array_equal(got, topk_oracle.argmax(logits))
    assert np.array_equal(got, sampling_twin.argmax_rows(logits))
    for run in (topk_kernels.argmax_serial, topk_kernels.argmax_parallel):
        out = np.empty(rows_, np.int64)
        run(logits, out)
        assert np.array_equal(out, got)
    assert all(rows.argmax(logits[r:r + 1])[0] == got[r] for r in range(rows_))
    assert rows.argmax(logits[0]) == got[0]


@pytest.mark.parametrize("k", [0, 1, 2, 5, 40, 64, 65, 300, 5000])
@pytest.mark.parametrize("rows_, vocab", [(7, 1000), (9, 49152), (2, 64), (10, 3000)])
def test_top_k_equals_the_oracle_and_top_k_ids(rows_, vocab, k):
    logits = tied_logits(np.random.default_rng(k + vocab), rows_, vocab)
    ids, values, normalizers = rows.top_k(logits, k)
    n = min(k, vocab) if k else 0
    assert ids.shape == values.shape == (rows_, n) and ids.dtype == np.int64 and values.dtype == np.float64
    o_ids, o_values, o_norm = topk_oracle.top_k(logits, k)
    assert np.array_equal(ids, o_ids) and bits_equal(values, o_values) and bits_equal(normalizers, o_norm)
    for r in range(rows_):
        scores = logits[r].astype(np.float64)
        if not np.isnan(scores).any():
            assert np.array_equal(ids[r], top_k_ids_or_empty(scores, k)), r
            assert bits_equal(np.float64(normalizers[r]), np.float64(topk.log_normalizer(scores)))
    if 0 < k <= sampling_twin.TOPK_MAX and k <= vocab:
        twin_ids, _ = sampling_twin.top_k_rows(logits, k)
        assert np.array_equal(ids, twin_ids)
    for run in (topk_kernels.top_k_serial, topk_kernels.top_k_parallel):
        out = (np.empty((rows_, n), np.int64), np.empty((rows_, n)), np.empty(rows_))
        run(logits, n, *out)
        assert np.array_equal(out[0], ids) and bits_equal(out[1], values) and bits_equal(out[2], normalizers)
    single = rows.top_k(logits[rows_ - 1:], k)
    assert np.array_equal(single[0][0], ids[-1]) and bits_equal(single[2][0], normalizers[-1])


def top_k_ids_or_empty(scores, k):
    return topk.top_k_ids(scores, k)[:k] if k else np.zeros(0, np.int64)


def test_the_insertion_and_sort_paths_agree():
    logits = tied_logits(np.random.default_rng(3), 9, 3000)
    for k in (1, 17, 64):
        ids, values, _ = (np.empty((9, k), np.int64), np.empty((9, k)), None)
        sort_ids, sort_values = np.empty((9, k), np.int64), np.empty((9, k))
        for t in range(9):
            topk_kernels._top_k_insert_row(logits, t, k, ids, values)
            topk_kernels._top_k_sort_row(logits, t, k, sort_ids, sort_values)
        assert np.array_equal(ids, sort_ids) and bits_equal(values, sort_values)


def test_log_normalizer_is_accurate_and_keeps_the_edge_cases():
    rng = np.random.default_rng(15)
    for scale in (1, 10, 100, 1000):
        row = rng.standard_normal(49152) * scale
        exact = np.logaddexp.reduce(row)
        assert topk.log_normalizer(row) == pytest.approx(exact, rel=1e-13)
        assert bits_equal(np.float64(topk.log_normalizer(row)), np.float64(topk_oracle.log_normalizer(row)))
    masked = np.full(100, -np.inf)
    masked[[3, 50]] = [1.0, 2.0]
    assert topk.log_normalizer(masked) == pytest.approx(np.log(np.e + np.e ** 2), rel=1e-15)
    with np.errstate(invalid="ignore"):
        for edge in ([np.nan, 1.0], [np.inf, 1.0], [-np.inf, -np.inf]):        # NaN, as np.log(np.exp(..)) gives
            assert np.isnan(topk.log_normalizer(np.array(edge)))
    assert topk.log_normalizer(np.array([5.0])) == 5.0


# ---------------------------------------------------------------------------- backend
@pytest.mark.parametrize("activations_", ["fp32", "fp16"])
def test_backend_methods_use_the_kernels(activations_):
    rng = np.random.default_rng(16)
    backend = CpuBackend(activations=activations_)
    x = (rng.standard_normal((5, 576)) * 100).astype(F)
    weight = (rng.standard_normal(576) * 3e4).astype(F)
    half = np.float16 if activations_ == "fp16" else F
    with np.errstate(over="ignore"):
        for feeds in (False, True):
            got = backend.rms_norm(x, weight, 1e-5, feeds_linear=feeds)
            expected = norms_oracle.rms_norm(x, weight, 1e-5)
            assert bits_equal(got, expected.astype(half) if feeds else expected)
            got = backend.layer_norm(x, weight, weight, 1e-5, feeds_linear=feeds)
            expected = norms_oracle.layer_norm(x, weight, weight, 1e-5)
            assert bits_equal(got, expected.astype(half) if feeds else expected)
        up = (rng.standard_normal((5, 600)) * 400).astype(F)
        assert bits_equal(backend.swiglu(up, 300), activations_oracle.swiglu(up, 300).astype(half))
        assert bits_equal(backend.gelu(up), activations_oracle.gelu(up).astype(half))
    logits = tied_logits(rng, 7, 1000)
    assert np.array_equal(backend.argmax(logits), np.argmax(logits, axis=1))
    ids, values, normalizers = backend.top_k(logits, 4)
    assert np.array_equal(ids, topk_oracle.top_k(logits, 4)[0])


def test_warm_up_compiles_every_kernel():
    rows.warm_up()
    for kernel in (norm_kernels.rms_norm_serial, norm_kernels.rms_norm_parallel, norm_kernels.layer_norm_serial,
                   norm_kernels.layer_norm_parallel, act_kernels.swiglu_serial, act_kernels.swiglu_parallel,
                   act_kernels.gelu_serial, act_kernels.gelu_parallel, rope_kernels.rope_serial,
                   rope_kernels.rope_parallel, rope_kernels.rope_table_kernel, topk_kernels.argmax_serial,
                   topk_kernels.argmax_parallel, topk_kernels.top_k_serial, topk_kernels.top_k_parallel,
                   topk_kernels.log_normalizer_1d):
        assert kernel.signatures, kernel


# ------------------------------------------------------- the same bits on other compile targets
DIGEST_SCRIPT = r"""
import hashlib, json, sys
import numpy as np
from tinyloop.backends.cpu import activations, norms, positions, topk
from tinyloop.backends.cpu.kernels import rows

rng = np.random.default_rng(0)
F = np.float32
x = (rng.standard_normal((300, 577)) * 3).astype(F)
w, b = rng.standard_normal((2, 577)).astype(F)
up = (rng.standard_normal((90, 3000)) * 6).astype(F)
table = positions.rope_table(8192, positions.inv_frequencies(64, 100000.0))
q = rng.standard_normal((300, 9, 64)).astype(F)
logits = (rng.standard_normal((9, 49152)) * 5).astype(F)
outs = {
    "rms": norms.rms_norm(x, w, 1e-5), "rms1": norms.rms_norm(x[:1], w, 1e-5),
    "layer": norms.layer_norm(x, w, b, 1e-5), "layer1": norms.layer_norm(x[:3], w, None, 1e-5),
    "swiglu": activations.swiglu(up, 1500), "swiglu1": activations.swiglu(up[:1], 1500),
    "gelu": activations.gelu_tanh(up), "gelu1": activations.gelu_tanh(up[:1]),
    "table": table, "rope": positions.apply_rope(q, table[rng.integers(0, 8192, 300)]),
    "argmax": rows.argmax(logits), "topk": rows.top_k(logits, 40),
    "lse": np.array([topk.log_normalizer(row.astype(np.float64)) for row in logits[:3]]),
}
digest = {}
for name, value in outs.items():
    parts = value if isinstance(value, tuple) else (value,)
    digest[name] = hashlib.sha256(b"".join(np.ascontiguousarray(p).tobytes() for p in parts)).hexdigest()
print(json.dumps(digest))
"""


def _digests(env_extra: dict) -> dict:
    env = dict(os.environ, **env_extra)
    done = subprocess.run([sys.executable, "-c", DIGEST_SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_same_bits_under_other_numba_compile_targets(tmp_path):
    """The kernels compiled for this CPU, for a generic x86-64 (SSE2 only) and for Haswell
    (AVX2 + FMA, no AVX-512) give the same bits: nothing in them depends on the instruction
    set. NUMBA_CACHE_DIR keeps the other targets' cached code out of the source tree."""
    host = _digests({"NUMBA_CACHE_DIR": str(tmp_path / "host")})
    for target in ("generic", "haswell"):
        assert _digests({**compile_env(target), "NUMBA_CACHE_DIR": str(tmp_path / target)}) == host, target


def test_no_call_compiles_a_new_signature():
    """After warm_up, the backend's calls (read-only, strided, float64 and 1-D inputs included)
    reuse the warmed signatures: no numba compilation lands in a request."""
    rows.warm_up()
    kernels = (norm_kernels.rms_norm_serial, norm_kernels.rms_norm_parallel, norm_kernels.layer_norm_serial,
               norm_kernels.layer_norm_parallel, act_kernels.swiglu_serial, act_kernels.swiglu_parallel,
               act_kernels.gelu_serial, act_kernels.gelu_parallel, rope_kernels.rope_serial,
               rope_kernels.rope_parallel, rope_kernels.rope_table_kernel, topk_kernels.argmax_serial,
               topk_kernels.argmax_parallel, topk_kernels.top_k_serial, topk_kernels.top_k_parallel,
               topk_kernels.log_normalizer_1d)
    before = {kernel: len(kernel.signatures) for kernel in kernels}
    rng = np.random.default_rng(17)
    x = rng.standard_normal((300, 576)).astype(F)
    weight = rng.standard_normal(576).astype(F)
    weight.flags.writeable = False
    frozen = x.copy()
    frozen.flags.writeable = False
    for a in (x, frozen, x[:, ::1][::2], x[:1]):
        norms.rms_norm(a, weight, 1e-5)
        norms.layer_norm(a, weight, weight, 1e-5)
        norms.layer_norm(a, weight, None, 1e-5)
        activations.swiglu(a, 288)
        activations.gelu_tanh(a)
        rows.argmax(a)
        rows.top_k(a, 3)
        rows.top_k(a[:5], 100)
        topk.log_normalizer(a[0])
        topk.log_normalizer(a[0].astype(np.float64))
    table = positions.rope_table(100, smol_frequencies())
    table.flags.writeable = False
    q = x.reshape(300, 9, 64)
    positions.apply_rope(q, table[np.arange(300) % 100])
    positions.apply_rope(q[:1], table[:1])
    assert {kernel: len(kernel.signatures) for kernel in kernels} == before
