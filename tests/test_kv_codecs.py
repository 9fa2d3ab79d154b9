"""Each KV cache mode's precision and size, pinned against the mode table (kv/modes.py,
README "KV cache") with an independent quantizer written here:

    int8    8-bit codes, per (token, head, group of 32 along hd) an f16 scale and f16 min
    int4    4-bit codes, the same groups; int4-h: int4 of the Hadamard-rotated row
    value = code * scale + min, scale = f16((max - min) / (2^bits - 1)), min = f16(group min)"""
from types import SimpleNamespace

import numpy as np
import pytest

from tinyloop.backends.reference import NumpyBackend
from tinyloop.backends.reference.kvstore import PoolStorage, bytes_per_row, store_for
from tinyloop.kv.modes import check_mode, hadamard, packed_bytes_per_row


def reference_int_codec(x: np.ndarray, bits: int, group: int) -> np.ndarray:
    """x (..., hd) float32 -> what the cache must give back, by the definition above."""
    levels = 2 ** bits - 1
    g = x.reshape(*x.shape[:-1], x.shape[-1] // group, group).astype(np.float32)
    low = g.min(axis=-1, keepdims=True)
    scale = ((g.max(axis=-1, keepdims=True) - low) / np.float32(levels)).astype(np.float16).astype(np.float32)
    low = low.astype(np.float16).astype(np.float32)
    codes = np.clip(np.rint((g - low) / np.where(scale == 0, 1, scale)), 0, levels)
    return (codes * scale + low).reshape(x.shape).astype(np.float32)


def sylvester(order: int) -> np.ndarray:
    """H_{2n} = [[H, H], [H, -H]] / sqrt(2) ... written as a Kronecker product."""
    matrix = np.array([[1.0]])
    while matrix.shape[0] < order:
        matrix = np.kron(np.array([[1.0, 1.0], [1.0, -1.0]]), matrix)
    return matrix / np.sqrt(order)


def round_trip(mode, x):
    """Store x (T, n_kv, hd) in a fresh store of `mode` and read the rows back: (n_kv, T, hd)."""
    store = store_for(mode)
    arrays = store.allocate(x.shape[1], 64, x.shape[2])
    store.store(arrays, np.arange(x.shape[0]), x)
    return store.rows(arrays, np.arange(x.shape[0])), arrays


@pytest.mark.parametrize("mode, bits", [("int8", 8), ("int4", 4)])
@pytest.mark.parametrize("head_dim, group", [(64, 32), (128, 32), (48, 48), (16, 16)])
def test_int_modes_store_codes_of_their_width_in_groups_of_32(mode, bits, head_dim, group):
    rng = np.random.default_rng(head_dim + bits)
    x = (rng.standard_normal((20, 2, head_dim)) * rng.uniform(0.5, 5, (20, 2, 1))).astype(np.float32)
    x[3, 0, :] = 0.0                                           # a constant group: scale 0
    restored, arrays = round_trip(mode, x)
    assert np.array_equal(restored, reference_int_codec(x, bits, group).transpose(1, 0, 2))
    assert arrays["codes"].shape[-1] == head_dim * bits // 8 and arrays["codes"].dtype == np.uint8
    assert arrays["scale"].shape[-1] == arrays["min"].shape[-1] == head_dim // group
    assert arrays["scale"].dtype == arrays["min"].dtype == np.float16


def test_int8_and_int4_resolve_their_number_of_levels():
    """A ramp over one group: int8 keeps it within 1/510 of the range, int4 has 16 levels."""
    ramp = np.linspace(0.0, 1.0, 32, dtype=np.float32).reshape(1, 1, 32)
    int8, _ = round_trip("int8", ramp)
    int4, _ = round_trip("int4", ramp)
    assert np.abs(int8 - ramp).max() <= 1 / 510 + 1e-3 / 510
    assert len(np.unique(int4)) == 16 and np.abs(int4 - ramp).max() > 1 / 510 * 4


def test_int4_h_quantizes_the_hadamard_rotated_row_to_4_bits():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 2, 64)).astype(np.float32)
    x[:, :, 5] *= 40.0                                         # an outlier channel
    cpu = NumpyBackend()
    storage = cpu.kv_view(cpu.kv_pool("int4-h", 2, 128, 64), np.array([[1]], np.int32))
    assert storage.keys["codes"].shape[-1] == 32               # 4-bit codes, 2 per byte
    cpu.kv_write(storage, 0, SimpleNamespace(write_rows=slice(0, 6)), x, x)
    restored = storage.key_store.rows(storage.keys, storage.pool_rows(0, np.arange(6))).transpose(1, 0, 2)
    rotated = (x.astype(np.float64) @ sylvester(64)).astype(np.float32)
    expected = reference_int_codec(rotated, 4, 32)
    groups = rotated.reshape(6, 2, 2, 32)
    step = ((groups.max(axis=-1) - groups.min(axis=-1)) / 15).repeat(32, axis=-1)
    assert np.all(np.abs(restored - expected) <= step * 1.01)  # at most one code apart (BLAS rounding)
    # spreading the outlier makes int4 more accurate than without the rotation
    back = restored @ sylvester(64).T
    assert np.abs(back - x).mean() < np.abs(reference_int_codec(x, 4, 32) - x).mean()


def test_fp16_rounds_to_half_and_fp32_keeps_every_bit():
    x = np.random.default_rng(3).standard_normal((5, 2, 32)).astype(np.float32)
    fp16, _ = round_trip("fp16", x)
    fp32, _ = round_trip("fp32", x)
    assert np.array_equal(fp16, x.astype(np.float16).astype(np.float32).transpose(1, 0, 2))
    assert not np.array_equal(fp16, fp32)
    assert np.array_equal(fp32, x.transpose(1, 0, 2))


# n_kv = 2, hd = 64: codes + (2 groups x (f16 scale + f16 min)) per head, keys and values
GPU_BYTES = {"fp32": 2 * 2 * 64 * 4, "fp16": 2 * 2 * 64 * 2, "int8": 2 * 2 * (64 + 2 * 4),
             "int4": 2 * 2 * (32 + 2 * 4), "int4-h": 2 * 2 * (32 + 2 * 4)}
# the CPU stores fp16 values in float32 and a column of ones after the values (README, kvstore.py)
CPU_BYTES = {"fp32": 2 * 64 * 4 + 2 * 65 * 4, "fp16": 2 * 64 * 4 + 2 * 65 * 4, "int8": GPU_BYTES["int8"],
             "int4": GPU_BYTES["int4"], "int4-h": GPU_BYTES["int4-h"]}


@pytest.mark.parametrize("mode", list(GPU_BYTES))
def test_bytes_per_row_per_mode(mode):
    assert packed_bytes_per_row(mode, 2, 64) == GPU_BYTES[mode]
    assert bytes_per_row(mode, 2, 64) == CPU_BYTES[mode]
    pool = PoolStorage(mode, 2, 3 * 128, 64)
    assert pool.nbytes == 3 * 128 * CPU_BYTES[mode]


def test_sizes_are_whole_numbers_of_bytes():
    for mode in GPU_BYTES:
        assert type(packed_bytes_per_row(mode, 3, 48)) is int and type(bytes_per_row(mode, 3, 48)) is int
    # hd 48: one group of 48 per head
    assert packed_bytes_per_row("int4", 3, 48) == 2 * 3 * (24 + 4)


def test_an_unknown_mode_is_refused_with_the_modes_allowed():
    assert check_mode("int4-h") == "int4-h"
    with pytest.raises(ValueError, match="KV cache mode must be one of fp16, int8, int4, int4-h, fp32, got 'int2'"):
        check_mode("int2")
    for make in (lambda: store_for("int2"), lambda: bytes_per_row("int2", 2, 32),
                 lambda: PoolStorage("int2", 2, 64, 32)):            # the CPU store refuses it too, not fp32
        with pytest.raises(ValueError, match="KV cache mode must be one of"):
            make()


def test_hadamard_orders_and_refusals():
    assert np.array_equal(hadamard(1), [[1.0]])
    assert np.allclose(hadamard(8), sylvester(8), atol=1e-7)
    for head_dim in (6, 12, 48, 96):
        with pytest.raises(ValueError, match=f"power-of-two head_dim, got {head_dim}"):
            hadamard(head_dim)
