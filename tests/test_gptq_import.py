"""GPTQ checkpoint tensors, packed here by hand, import to the exact GPTQ values."""
import numpy as np
import pytest

from tinyloop.errors import TinyLoopError
from tinyloop.model.quant import dequantize
from tinyloop.quantize.gptq_import import import_gptq_linear, unpack_int32


def pack_words(values: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """The reference packer, written out with explicit loops."""
    values = np.moveaxis(values, axis, 0)
    per_word = 32 // bits
    words = np.zeros((values.shape[0] // per_word,) + values.shape[1:], np.uint32)
    for w in range(words.shape[0]):
        for j in range(per_word):
            words[w] |= values[w * per_word + j].astype(np.uint32) << np.uint32(bits * j)
    return np.moveaxis(words.view(np.int32), 0, axis)


def build(rng, in_dim, out_dim, bits, group_size, act_order):
    groups = in_dim // group_size
    q = rng.integers(0, 1 << bits, (in_dim, out_dim))
    zeros = rng.integers(0, 1 << bits, (groups, out_dim))
    scales = (rng.random((groups, out_dim)) * 0.05 + 0.001).astype(np.float16)
    g_idx = np.arange(in_dim) // group_size
    if act_order:
        g_idx = rng.permutation(g_idx)
    expected = (scales.astype(np.float32)[g_idx] * (q - zeros[g_idx]).astype(np.float32)).T   # (out, in)
    return q, zeros, scales, g_idx, expected


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("fmt", ["gptq", "gptq_v2"])
def test_import_gives_the_gptq_formula_exactly(bits, act_order, fmt):
    rng = np.random.default_rng(bits * 10 + act_order)
    in_dim, out_dim, group_size = 128, 64, 32
    q, zeros, scales, g_idx, expected = build(rng, in_dim, out_dim, bits, group_size, act_order)
    stored_zeros = (zeros - 1) & ((1 << bits) - 1) if fmt == "gptq" else zeros
    tensor = import_gptq_linear(pack_words(q, bits, 0), pack_words(stored_zeros, bits, 1), scales,
                                g_idx.astype(np.int32), bits, fmt)
    assert tensor.bits == bits and tensor.group_size == group_size
    assert (tensor.perm is not None) == act_order
    assert np.array_equal(dequantize(tensor), expected)


def test_unpack_is_the_inverse_of_the_reference_packer():
    rng = np.random.default_rng(3)
    for bits in (2, 4, 8):
        values = rng.integers(0, 1 << bits, (64, 5))
        assert np.array_equal(unpack_int32(pack_words(values, bits, 0), bits, 0), values)
        assert np.array_equal(unpack_int32(pack_words(values.T, bits, 1), bits, 1), values.T)


def test_bad_layouts_are_refused():
    rng = np.random.default_rng(4)
    q, zeros, scales, g_idx, _ = build(rng, 64, 32, 4, 32, False)
    uneven = g_idx.copy()
    uneven[0] = 1
    with pytest.raises(TinyLoopError, match="same number of input columns"):
        import_gptq_linear(pack_words(q, 4, 0), pack_words(zeros, 4, 1), scales, uneven, 4, "gptq_v2")
    with pytest.raises(TinyLoopError, match="supports"):
        import_gptq_linear(pack_words(q, 4, 0), pack_words(zeros, 4, 1), scales, g_idx, 3)
    with pytest.raises(TinyLoopError, match="inconsistent"):
        import_gptq_linear(pack_words(q, 4, 0), pack_words(zeros, 4, 1), scales[:1], g_idx, 4)
