import numpy as np
import pytest

from tinyloop.model.quant import dequantize, pack_codes, quantize_rtn, unpack_codes
from tinyloop.quantize.gptq import gptq_quantize, hessian_of


def correlated_inputs(rng, n, dim):
    """Calibration activations with correlated channels and a few outliers, like real ones."""
    mixing = rng.standard_normal((dim, dim)) / np.sqrt(dim)
    x = rng.standard_normal((n, dim)) @ mixing
    x[:, :3] *= 8
    return x.astype(np.float32)


@pytest.mark.parametrize("bits, group", [(4, 32), (4, 128), (2, 32), (2, 64), (8, 64)])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_beats_rtn_on_layer_output_error(bits, group, act_order):
    rng = np.random.default_rng(bits * 100 + group + act_order)
    weight = rng.standard_normal((96, 256)).astype(np.float32)
    x = correlated_inputs(rng, 2048, 256)
    reference = x @ weight.T
    rtn = dequantize(quantize_rtn(weight, bits, group))
    gptq = dequantize(gptq_quantize(weight, hessian_of(x), bits, group, act_order))
    rtn_error = np.mean((x @ rtn.T - reference) ** 2)
    gptq_error = np.mean((x @ gptq.T - reference) ** 2)
    assert gptq_error < rtn_error, (rtn_error, gptq_error)


def test_act_order_permutation_gives_the_unpermuted_layer_output():
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((16, 64)).astype(np.float32)
    x = correlated_inputs(rng, 512, 64)
    q = gptq_quantize(weight, hessian_of(x), 4, 32, act_order=True)
    assert q.perm is not None and sorted(q.perm.tolist()) == list(range(64))
    assert not np.array_equal(q.perm, np.arange(64))
    # Stored columns are in act order; dequantize puts them back in place.
    codes = unpack_codes(q.codes, 4)
    stored = (codes.reshape(16, 2, 32) * q.scale.astype(np.float32)[:, :, None]
              + q.min.astype(np.float32)[:, :, None]).reshape(16, 64)
    restored = dequantize(q)
    assert np.array_equal(restored[:, q.perm], stored)
    assert np.allclose(x[:, q.perm] @ stored.T, x @ restored.T, rtol=1e-4, atol=1e-3)


def test_dead_inputs_are_zeroed():
    rng = np.random.default_rng(1)
    weight = rng.standard_normal((8, 32)).astype(np.float32)
    x = rng.standard_normal((100, 32)).astype(np.float32)
    x[:, 5] = 0
    q = dequantize(gptq_quantize(weight, hessian_of(x), 8, 32))
    assert abs(q[:, 5]).max() <= np.abs(q).max() / 100 + 1e-2


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("shape", [(3, 32), (5, 96), (1, 128), (7, 200)])
def test_pack_unpack_round_trip_for_every_width(bits, shape):
    rng = np.random.default_rng(bits)
    per_byte = 8 // bits
    if shape[1] % per_byte:
        with pytest.raises(ValueError, match="not a multiple"):
            pack_codes(np.zeros(shape, np.uint8), bits)
        return
    codes = rng.integers(0, 1 << bits, shape).astype(np.uint8)
    assert np.array_equal(unpack_codes(pack_codes(codes, bits), bits), codes)


@pytest.mark.parametrize("bits, group, in_dim", [(4, 128, 200), (2, 64, 96), (4, 32, 48), (4, 128, 576)])
@pytest.mark.parametrize("method", ["rtn", "gptq"])
def test_widths_that_groups_do_not_divide_are_padded(bits, group, in_dim, method):
    rng = np.random.default_rng(in_dim)
    weight = rng.standard_normal((6, in_dim)).astype(np.float32)
    x = correlated_inputs(rng, 400, in_dim)
    if method == "rtn":
        q = quantize_rtn(weight, bits, group)
    else:
        q = gptq_quantize(weight, hessian_of(x), bits, group, act_order=True)
    padded = -(-in_dim // group) * group
    assert q.shape == (6, in_dim) and q.padded_in == padded
    assert q.spec()["shape"] == [6, in_dim] and q.spec()["padded_in"] == padded
    restored = dequantize(q)
    assert restored.shape == (6, in_dim)
    rtn = quantize_rtn(weight, bits, group)
    if method == "rtn":
        step = np.repeat(rtn.scale.astype(np.float32), group, axis=1)[:, :in_dim]
        assert np.all(np.abs(restored - weight) <= step / 2 * (1 + 1e-3) + 1e-6)
    else:
        error = np.mean((x @ restored.T - x @ weight.T) ** 2)
        assert error < np.mean((x @ dequantize(rtn).T - x @ weight.T) ** 2)
