"""KV storage on the CPU: the NumPy twin of the CUDA KV kernels (quantize-and-store,
read blocks for attention, row copies).

The pool's arrays per side (keys, values), for n_kv heads and `rows` pool rows (kv/pool.py:
a whole number of ATTENTION_BLOCK blocks, so 64 consecutive rows are one contiguous
(64, hd) block of a kv head):
- float modes: data (n_kv, rows, hd) float32. The fp16 mode stores values rounded to half
  precision in float32: the values a float16 array would hold (f16 -> f32 is exact), so
  results are bit for bit those of a float16 cache, without turning the whole visible cache
  into float32 at every step (that conversion alone cost about 1 ms per layer at 4k context
  on the development machine). It takes twice the memory of float16, which `bytes_per_row`
  reports; a GPU backend stores float16.
- int modes: codes (n_kv, rows, hd * bits / 8) uint8, scale and min (n_kv, rows, groups)
  float16; value = code * scale + min (kv/modes.py).

Values are read with a column of ones after their hd columns (stored so for the float
modes, appended when dequantizing), so attention's probability . value product also
yields each block's probability sum, in the same fixed-shape BLAS call.

A cache sees the pool through its block table (KVStorage: `pool_rows`, `pool_blocks`); the
stores below take pool rows and pool blocks. Every operation is per row and elementwise, so
what a row reads back never depends on which other rows were written with it, nor on which
pool block holds it.
"""
from __future__ import annotations

import numpy as np

from tinyloop.kv.modes import CODE_BITS, check_mode, group_size, hadamard
from tinyloop.limits import ATTENTION_BLOCK
from tinyloop.model.quant import pack_codes, unpack_codes


class FloatStore:
    def __init__(self, round_to=None, ones: bool = False):
        self.round_to = round_to                # np.float16 for the fp16 mode
        self.ones = ones                        # the values side: a column of ones after hd

    def bytes_per_row(self, n_kv: int, head_dim: int) -> int:
        return n_kv * (head_dim + self.ones) * 4

    def allocate(self, n_kv, rows, head_dim) -> dict:
        data = np.zeros((n_kv, rows, head_dim + self.ones), np.float32)      # calloc: touched as used
        # the same memory seen as 64-row blocks, for attention (not a separate array)
        blocks = data.reshape(n_kv, rows // ATTENTION_BLOCK, ATTENTION_BLOCK, head_dim + self.ones)
        return {"data": data, "blocks": blocks}

    def init_blocks(self, arrays: dict, blocks: np.ndarray) -> None:
        """Blocks handed to a new holder: zeros (a masked key's row takes part in a block's
        product with probability 0, and 0 * NaN would not be 0), the values' ones column."""
        arrays["blocks"][:, blocks] = 0.0
        if self.ones:
            arrays["blocks"][:, blocks, :, -1] = 1.0

    def store(self, arrays: dict, rows: np.ndarray, x: np.ndarray) -> None:
        """x: (T, n_kv, hd) float32 written at pool rows (T,)."""
        if self.round_to is not None:
            x = x.astype(self.round_to)
        head_dim = x.shape[-1]
        arrays["data"][:, rows, :head_dim] = x.transpose(1, 0, 2)

    def blocks(self, arrays: dict, blocks: np.ndarray) -> np.ndarray:
        """Pool blocks (an index array) -> (n_kv, n_blocks, BLOCK, hd [+ 1]) float32."""
        return arrays["blocks"][:, blocks]

    def rows(self, arrays: dict, rows: np.ndarray) -> np.ndarray:
        """Pool rows (an int array of any shape) -> (n_kv, *rows.shape, hd [+ 1]) float32."""
        return arrays["data"][:, rows]


class IntStore:
    def __init__(self, bits: int, ones: bool = False):
        self.bits = bits
        self.levels = (1 << bits) - 1
        self.ones = ones                        # the values side: reads append a column of ones

    def bytes_per_row(self, n_kv: int, head_dim: int) -> int:
        groups = head_dim // group_size(head_dim)
        return n_kv * (head_dim * self.bits // 8 + groups * 4)       # codes + f16 scale + f16 min

    def allocate(self, n_kv, rows, head_dim) -> dict:
        groups = head_dim // group_size(head_dim)
        return {"codes": np.zeros((n_kv, rows, head_dim * self.bits // 8), np.uint8),
                "scale": np.zeros((n_kv, rows, groups), np.float16),
                "min": np.zeros((n_kv, rows, groups), np.float16)}

    def init_blocks(self, arrays: dict, blocks: np.ndarray) -> None:
        """Zeros: a masked key dequantizes to 0 (code 0 * scale 0 + min 0)."""
        rows = (np.asarray(blocks)[:, None] * ATTENTION_BLOCK + np.arange(ATTENTION_BLOCK)).ravel()
        for array in arrays.values():
            array[:, rows] = 0

    def quantize(self, x: np.ndarray):
        """x: (..., hd) float32 -> codes (..., hd) uint8, scale, min (..., groups) float16."""
        head_dim = x.shape[-1]
        g = group_size(head_dim)
        grouped = x.reshape(*x.shape[:-1], head_dim // g, g)                     # (..., groups, g)
        low = grouped.min(axis=-1)
        scale = ((grouped.max(axis=-1) - low) / np.float32(self.levels)).astype(np.float16)
        offset = low.astype(np.float16)
        # codes from the stored (f16) scale and min, so the error bound is half a step
        scale32 = scale.astype(np.float32)[..., None]
        safe = np.where(scale32 == 0, np.float32(1), scale32)
        codes = np.clip(np.rint((grouped - offset.astype(np.float32)[..., None]) / safe), 0, self.levels)
        return codes.astype(np.uint8).reshape(x.shape), scale, offset

    def dequantize(self, codes, scale, offset) -> np.ndarray:
        """codes (..., hd) uint8 with (..., groups) scale/min -> (..., hd) float32."""
        head_dim = codes.shape[-1]
        g = group_size(head_dim)
        grouped = codes.reshape(*codes.shape[:-1], head_dim // g, g).astype(np.float32)
        values = grouped * scale.astype(np.float32)[..., None] + offset.astype(np.float32)[..., None]
        return values.reshape(codes.shape)

    def store(self, arrays: dict, rows: np.ndarray, x: np.ndarray) -> None:
        codes, scale, offset = self.quantize(x.transpose(1, 0, 2))               # (n_kv, T, ...)
        n_kv, count, head_dim = codes.shape
        packed = pack_codes(codes.reshape(n_kv * count, head_dim), self.bits).reshape(n_kv, count, -1)
        arrays["codes"][:, rows] = packed
        arrays["scale"][:, rows] = scale
        arrays["min"][:, rows] = offset

    def rows(self, arrays: dict, rows: np.ndarray) -> np.ndarray:
        """Pool rows (an int array of any shape) -> (n_kv, *rows.shape, hd [+ 1]) float32."""
        packed = arrays["codes"][:, rows]                                        # (n_kv, *lead, bytes)
        lead = packed.shape[:-1]
        head_dim = packed.shape[-1] * 8 // self.bits
        codes = unpack_codes(packed.reshape(-1, packed.shape[-1]), self.bits).reshape(*lead, head_dim)
        values = self.dequantize(codes, arrays["scale"][:, rows], arrays["min"][:, rows])
        if self.ones:
            values = np.concatenate([values, np.ones(lead + (1,), np.float32)], axis=-1)
        return values

    def blocks(self, arrays: dict, blocks: np.ndarray) -> np.ndarray:
        """Pool blocks -> (n_kv, n_blocks, BLOCK, hd [+ 1]) float32."""
        return self.rows(arrays, np.asarray(blocks)[:, None] * ATTENTION_BLOCK + np.arange(ATTENTION_BLOCK))


def store_for(mode: str, ones: bool = False):
    check_mode(mode)
    if mode in CODE_BITS:
        return IntStore(CODE_BITS[mode], ones)
    return FloatStore(np.float16 if mode == "fp16" else None, ones)


def bytes_per_row(mode: str, n_kv: int, head_dim: int) -> int:
    """Bytes of one token's keys and values together."""
    return store_for(mode).bytes_per_row(n_kv, head_dim) + store_for(mode, True).bytes_per_row(n_kv, head_dim)


class PoolStorage:
    """The KV pool's arrays on the CPU: both sides' (n_kv, rows, ...) arrays, and the int4-h rotation."""

    def __init__(self, mode: str, n_kv: int, rows: int, head_dim: int):
        self.mode, self.n_kv, self.rows, self.head_dim = mode, n_kv, rows, head_dim
        self.key_store, self.value_store = store_for(mode), store_for(mode, ones=True)
        self.keys = self.key_store.allocate(n_kv, rows, head_dim)
        self.values = self.value_store.allocate(n_kv, rows, head_dim)
        self.rotation = hadamard(head_dim) if mode == "int4-h" else None      # (hd, hd)

    def init_blocks(self, blocks: np.ndarray) -> None:
        self.key_store.init_blocks(self.keys, blocks)
        self.value_store.init_blocks(self.values, blocks)

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.arrays()))

    def arrays(self):
        """Every stored array once (a float store's block view is the same memory as its data)."""
        return [a for side in (self.keys, self.values) for name, a in side.items() if name != "blocks"]


class KVStorage:
    """One cache's keys and values: the pool through the cache's block table (n_slots, blocks),
    which the cache fills as it grows."""

    def __init__(self, pool: PoolStorage, table: np.ndarray):
        self.pool, self.table = pool, table
        self.mode, self.n_kv, self.head_dim = pool.mode, pool.n_kv, pool.head_dim
        self.key_store, self.value_store = pool.key_store, pool.value_store
        self.keys, self.values, self.rotation = pool.keys, pool.values, pool.rotation

    @property
    def n_slots(self) -> int:
        return self.table.shape[0]

    @property
    def rows(self) -> int:
        """Physical rows per slot."""
        return self.table.shape[1] * ATTENTION_BLOCK

    def pool_rows(self, slot: int, rows) -> np.ndarray:
        """Physical rows of `slot` (a slice or an int array of any shape) -> pool rows, same shape."""
        if isinstance(rows, slice):
            rows = np.arange(rows.start, rows.stop)
        rows = np.asarray(rows, np.int64)
        return self.table[slot, rows // ATTENTION_BLOCK].astype(np.int64) * ATTENTION_BLOCK + rows % ATTENTION_BLOCK

    def pool_blocks(self, slot: int, blocks) -> np.ndarray:
        """Physical blocks of `slot` (a slice or an index array) -> pool blocks."""
        return self.table[slot, blocks].astype(np.int64)
