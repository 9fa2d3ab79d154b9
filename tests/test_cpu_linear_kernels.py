"""The CPU linear kernels (backends/cpu/kernels/linear*.py) against their NumPy oracle, bit for bit,
and the row invariance every path of the engine stands on."""
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
import pytest

from tinyloop.backends.cpu.kernels.halves import half_to_float
from tinyloop.backends.cpu.kernels.linear_oracle import linear_oracle
from tinyloop.backends.cpu.linear import linear, prepare_linear
from tinyloop.model.quant import QuantizedTensor, dequantize, quantize_rtn

pytestmark = pytest.mark.slow      # the experimental numba backend (TINYLOOP_CPU_KERNELS=numba): -m slow

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("f32", "f16", "int8", "int4", "int2")


def part(rng, kind, n_out, n_in, group=32, act_order=False, scale_dtype=np.float16):
    weight = (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)
    if kind == "f32":
        return weight
    if kind == "f16":
        return weight.astype(np.float16)
    tensor = quantize_rtn(weight, int(kind[3:]), group, scale_dtype)
    if act_order:
        tensor.perm = rng.permutation(tensor.padded_in).astype(np.int32)
    return tensor


def inputs(rng, rows, n_in):
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    x[0, :3] = [0.0, -0.0, 1e-30]          # zeros and a tiny value: signs and underflow go through too
    return x


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n_in,group", [(64, 16), (100, 32), (75, 64), (576, 128), (96, 48), (40, 8), (60, 12)])
def test_kernel_equals_its_oracle_bit_for_bit(kind, n_in, group):
    rng = np.random.default_rng(hash((kind, n_in, group)) % 2**32)
    parts = [part(rng, kind, 13, n_in, group, act_order=kind.startswith("int")), part(rng, kind, 7, n_in, group),
             part(rng, kind, 20, n_in, group, scale_dtype=np.float32)]
    bias = rng.standard_normal(40).astype(np.float32)
    packed = prepare_linear(parts, bias)
    for rows in (1, 3, 4, 9):
        x = inputs(rng, rows, n_in)
        assert np.array_equal(linear(x, packed), linear_oracle(x, parts, bias), equal_nan=True)


@pytest.mark.parametrize("kind,group", [("int8", 6), ("int8", 3), ("int4", 6), ("int4", 2)])
def test_group_sizes_the_integer_kernel_cannot_take_run_the_float_kernel(kind, group):
    """Groups that are not whole quads of 4 columns take the float-activation kernel, to its oracle
    (2-bit codes always come in groups of 4 or more: the format asks for it)."""
    rng = np.random.default_rng(8)
    tensor = part(rng, kind, 11, 36, group)
    packed = prepare_linear([tensor])
    assert packed.blocks[0].integer is None
    x = inputs(rng, 5, 36)
    assert np.array_equal(linear(x, packed), linear_oracle(x, [tensor]))


def test_mixed_kinds_fuse_into_blocks_in_output_order():
    rng = np.random.default_rng(3)
    parts = [part(rng, "int4", 5, 96), part(rng, "int8", 6, 96), part(rng, "int4", 7, 96), part(rng, "f32", 3, 96)]
    packed = prepare_linear(parts)
    assert [b.kind for b in packed.blocks] == ["q4", "q8", "q4", "f32"]
    x = inputs(rng, 6, 96)
    assert np.array_equal(linear(x, packed), linear_oracle(x, parts))


@pytest.mark.parametrize("kind", KINDS)
def test_a_row_gets_the_same_bits_whatever_shares_the_call(kind):
    """Decode (1 row), verify (16), batches across the 4-row blocks and the 64-row chunks:
    each row equals the row computed alone, and other rows' values never reach it."""
    rng = np.random.default_rng(11)
    parts = [part(rng, kind, 40, 192, 64)]
    packed = prepare_linear(parts)
    x = inputs(rng, 130, 192)
    alone = np.concatenate([linear(x[r:r + 1], packed) for r in range(130)])
    for rows in (1, 2, 5, 16, 65, 130):
        assert np.array_equal(linear(x[:rows], packed), alone[:rows])
    shuffled = rng.permutation(130)
    assert np.array_equal(linear(x[shuffled], packed), alone[shuffled])
    threads = numba.get_num_threads()
    try:
        for count in (1, threads):                          # threads split outputs, never a sum
            numba.set_num_threads(count)
            assert np.array_equal(linear(np.tile(x, (3, 1)), packed), np.tile(alone, (3, 1))), count
    finally:
        numba.set_num_threads(threads)
    noisy = x.copy()
    noisy[1:] = rng.standard_normal(noisy[1:].shape) * 1e6
    assert np.array_equal(linear(noisy, packed)[0], alone[0])


def test_close_to_the_exact_product():
    """Float weights: within float32 rounding of x @ W.T in float64. Quantized weights (int8
    activations): within what rounding each activation to its segment's step dx = amax / 127
    can move the product, sum_k |w_k| dx / 2, plus float32 rounding."""
    rng = np.random.default_rng(5)
    for kind in KINDS:
        p = part(rng, kind, 33, 576, 32)
        dense = dequantize(p).astype(np.float64) if isinstance(p, QuantizedTensor) else np.asarray(p, np.float64)
        x = inputs(rng, 7, 576)
        exact = x.astype(np.float64) @ dense.T
        bound = 1e-5 * (np.abs(x).astype(np.float64) @ np.abs(dense).T) + 1e-30
        if isinstance(p, QuantizedTensor):
            step = np.abs(x.reshape(7, 18, 32)).max(axis=2).astype(np.float64) / 127          # (T, segments)
            half_step = np.repeat(step, 32, axis=1) / 2                                       # (T, K)
            bound = bound + 1.001 * (half_step @ np.abs(dense).T)
        error = np.abs(linear(x, prepare_linear([p])) - exact)
        assert np.all(error <= bound), kind
        if isinstance(p, QuantizedTensor):      # and the bound is not loose beyond use: errors are seen
            assert error.max() > 0.01 * bound.max(), kind


def test_quantized_weights_stay_packed_in_memory():
    rng = np.random.default_rng(2)
    for bits, most in ((4, 0.8), (8, 1.3), (2, 0.55)):
        tensor = part(rng, f"int{bits}", 512, 576, 32)
        packed = prepare_linear([tensor])
        assert packed.nbytes / (512 * 576) <= most, bits           # float32 would be 4 bytes a weight


def test_half_weights_widen_exactly_for_every_pattern():
    """Both lowerings (F16C's fpext where the target has it, the integer steps elsewhere) give
    NumPy's widening for every half, and a NaN quieted (IEEE 754: a conversion delivers a
    quiet NaN; NumPy keeps a signalling NaN's bits as they are, so its quiet bit is set here)."""
    from numba import njit

    from tinyloop.backends.cpu.kernels.halves import half_to_float_arithmetic

    @njit
    def widen(h, out, out_arithmetic):
        for i in range(h.size):
            out[i] = half_to_float(h[i])
            out_arithmetic[i] = half_to_float_arithmetic(h[i])

    patterns = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got, got_arithmetic = np.empty(65536, np.float32), np.empty(65536, np.float32)
    widen(patterns, got, got_arithmetic)
    expected = patterns.view(np.float16).astype(np.float32).view(np.uint32).copy()
    expected[np.isnan(patterns.view(np.float16))] |= np.uint32(0x400000)
    assert np.array_equal(got.view(np.uint32), expected)
    assert np.array_equal(got_arithmetic.view(np.uint32), expected)


def test_the_generated_kernels_are_what_the_generator_writes():
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_linear_kernels.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_bad_parts_are_refused():
    rng = np.random.default_rng(1)
    with pytest.raises(ValueError, match="input width"):
        prepare_linear([part(rng, "f32", 4, 32), part(rng, "f32", 4, 48)])


def test_the_numba_backend_gives_a_row_the_same_bits_in_prefill_decode_and_verify(tmp_path):
    """End to end on the experimental backend (TINYLOOP_CPU_KERNELS=numba): the logits of a
    position are the same bits whether it was in the prompt's prefill, a decode step or a
    5-row verify pass, for a looped model with RoPE and GQA."""
    from tinyloop.backends.cpu import CpuBackend
    from tinyloop.model.loader import load_model
    from tinyloop.model.testmodels import make_test_model
    path = tmp_path / "tiny.tinyloop"
    make_test_model(path, "tiny-looped", seed=3)
    model = load_model(path, device=CpuBackend()).model
    loops = 3
    tokens = np.random.default_rng(4).integers(0, model.config.vocab_size, 24)
    prefill_cache = model.new_cache(64, loops)
    prefill = model.forward(tokens, np.arange(24), prefill_cache, loops, exact=False)
    step_cache = model.new_cache(64, loops)
    model.forward(tokens[:14], np.arange(14), step_cache, loops, exact=False)
    steps = [model.forward(tokens[i:i + 1], [i], step_cache, loops)[0] for i in range(14, 19)]
    verify = model.forward(tokens[19:24], np.arange(19, 24), step_cache, loops)
    assert np.array_equal(np.stack(steps), prefill[14:19])
    assert np.array_equal(verify, prefill[19:24])


def test_the_cpu_kernels_setting_chooses_the_backend(monkeypatch):
    from tinyloop.backends.select import cpu_backend_class
    from tinyloop.errors import TinyLoopError
    monkeypatch.setenv("TINYLOOP_CPU_KERNELS", "numba")
    assert cpu_backend_class().__module__.startswith("tinyloop.backends.cpu")
    monkeypatch.setenv("TINYLOOP_CPU_KERNELS", "NumPy")
    assert cpu_backend_class().__module__.startswith("tinyloop.backends.reference.")
    monkeypatch.setenv("TINYLOOP_CPU_KERNELS", "blas")
    with pytest.raises(TinyLoopError, match="TINYLOOP_CPU_KERNELS must be one of numpy, numba, got 'blas'"):
        cpu_backend_class()
