import numpy as np
import pytest

from tinyloop.model.quant import (
    QuantizedTensor,
    dequantize,
    pack_codes,
    quantize_rtn,
    unpack_codes,
)


@pytest.mark.parametrize("bits", [2, 4, 8])
def test_pack_unpack_round_trip(bits):
    rng = np.random.default_rng(bits)
    codes = rng.integers(0, 1 << bits, size=(7, 64)).astype(np.uint8)
    packed = pack_codes(codes, bits)
    assert packed.shape == (7, 64 * bits // 8)
    assert np.array_equal(unpack_codes(packed, bits), codes)


def test_pack_order_is_low_bits_first():
    packed = pack_codes(np.array([[1, 2, 3, 4]], np.uint8), 4)
    assert packed.tolist() == [[0x21, 0x43]]


def test_out_of_range_codes_are_refused():
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        pack_codes(np.array([[4, 0, 0, 0]]), 2)


@pytest.mark.parametrize("bits, group", [(8, 32), (4, 32), (4, 64), (2, 32)])
def test_rtn_error_is_within_half_a_step(bits, group):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((16, 128)).astype(np.float32)
    q = quantize_rtn(weight, bits, group, scale_dtype=np.float32)
    restored = dequantize(q)
    step = np.repeat(q.scale, group, axis=1)
    assert np.all(np.abs(restored - weight) <= step / 2 + 1e-5)


def test_act_order_permutation_restores_column_order():
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((4, 64)).astype(np.float32)
    perm = rng.permutation(64).astype(np.int32)
    q = quantize_rtn(weight[:, perm], 8, 32, scale_dtype=np.float32)
    permuted = QuantizedTensor(q.codes, q.scale, q.min, 8, 32, "rtn", perm)
    assert np.array_equal(dequantize(permuted)[:, perm], dequantize(q))


def test_rows_that_groups_do_not_divide_are_padded_and_round_trip():
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((3, 48)).astype(np.float32)
    q = quantize_rtn(weight, 4, 32, scale_dtype=np.float32)
    assert q.codes.shape == (3, 32) and q.shape == (3, 48)
    step = np.repeat(q.scale, 32, axis=1)[:, :48]
    assert np.all(np.abs(dequantize(q) - weight) <= step / 2 + 1e-5)
    with pytest.raises(ValueError, match="multiple of 2 for 4-bit"):
        quantize_rtn(weight, 4, 3)
