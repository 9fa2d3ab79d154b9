"""KV storage of the numba backend, written by the compiled KV kernel (kernels/kv.py) and read
in place by the attention kernel (kernels/attention.py).

The int modes and fp32 keep the NumPy backend's arrays (backends/reference/kvstore.py: the same
layout and bytes per row; fp32's values keep their column of ones after hd, unread by the
kernels). The fp16 mode stores what it says: IEEE half bits, (n_kv, rows, hd)
uint16 per side (HalfStore), widened exactly by the attention kernel as it reads a block,
so a token costs 2 bytes a value, not the NumPy backend's 4 (its float32 arrays of half
values): at 4k context that halves what a decode step reads from the cache. The values it
gives are the same (a half widens to float32 exactly). The stores' `store` methods are the
write kernel's oracle and serve tests and tools (read rows back).
"""
from __future__ import annotations

import numpy as np

from tinyloop.backends.reference.kvstore import FloatStore, IntStore  # noqa: F401
from tinyloop.backends.reference.kvstore import KVStorage  # noqa: F401  (the view is the NumPy backend's)
from tinyloop.backends.reference.kvstore import PoolStorage as NumpyPoolStorage
from tinyloop.backends.reference.kvstore import store_for as numpy_store_for
from tinyloop.limits import ATTENTION_BLOCK
from tinyloop.backends.cpu.kernels.kv import SideWriter, checked_rows
from tinyloop.kv.modes import CODE_BITS, check_mode, group_size, hadamard

HALF_BITS = 16                   # the kernels' "bits" of the fp16 mode's half store


class HalfStore:
    """One side of the fp16 mode: half bits (n_kv, rows, hd) uint16."""

    def __init__(self, ones: bool = False):
        self.ones = ones                        # the values side: reads append a column of ones

    def bytes_per_row(self, n_kv: int, head_dim: int) -> int:
        return n_kv * head_dim * 2

    def allocate(self, n_kv, rows, head_dim) -> dict:
        return {"data": np.zeros((n_kv, rows, head_dim), np.uint16)}

    def init_blocks(self, arrays: dict, blocks) -> None:
        """Nothing: the kernels never read a row a query may not see (kernels/attention.py)."""

    def store(self, arrays: dict, rows: np.ndarray, x: np.ndarray) -> None:
        """x: (T, n_kv, hd) float32 rounded to half (NumPy's round-to-nearest-even) at pool rows (T,)."""
        arrays["data"][:, rows] = x.astype(np.float16).view(np.uint16).transpose(1, 0, 2)

    def rows(self, arrays: dict, rows: np.ndarray) -> np.ndarray:
        """Pool rows (an int array of any shape) -> (n_kv, *rows.shape, hd [+ 1]) float32."""
        values = arrays["data"][:, rows].view(np.float16).astype(np.float32)
        if self.ones:
            values = np.concatenate([values, np.ones(values.shape[:-1] + (1,), np.float32)], axis=-1)
        return values

    def blocks(self, arrays: dict, blocks) -> np.ndarray:
        return self.rows(arrays, np.asarray(blocks)[:, None] * ATTENTION_BLOCK + np.arange(ATTENTION_BLOCK))


def store_for(mode: str, ones: bool = False):
    check_mode(mode)
    return HalfStore(ones) if mode == "fp16" else numpy_store_for(mode, ones)


def bytes_per_row(mode: str, n_kv: int, head_dim: int) -> int:
    """Bytes of one token's keys and values together."""
    return store_for(mode).bytes_per_row(n_kv, head_dim) + store_for(mode, True).bytes_per_row(n_kv, head_dim)


def kernel_bits(mode: str) -> int:
    """What the kernels call a mode: 0 float32, 16 half bits, else the code width."""
    return HALF_BITS if mode == "fp16" else CODE_BITS.get(mode, 0)


class PoolStorage(NumpyPoolStorage):
    """The KV pool's arrays: the NumPy backend's, fp16 as half bits."""

    def __init__(self, mode: str, n_kv: int, rows: int, head_dim: int):
        self.mode, self.n_kv, self.rows, self.head_dim = mode, n_kv, rows, head_dim
        self.key_store, self.value_store = store_for(mode), store_for(mode, ones=True)
        self.keys = self.key_store.allocate(n_kv, rows, head_dim)
        self.values = self.value_store.allocate(n_kv, rows, head_dim)
        self.rotation = hadamard(head_dim) if mode == "int4-h" else None      # (hd, hd)

    def init_blocks(self, blocks) -> None:
        """Nothing: the attention kernel never reads a key a query may not see, so what a
        block held before cannot reach a new holder's results."""

    def identity_table(self) -> np.ndarray:
        """(pool blocks,) int32, block b -> b: a write kernel's table for rows already given as
        pool rows (kv_write_many)."""
        if getattr(self, "_identity", None) is None:
            self._identity = np.arange(self.rows // ATTENTION_BLOCK, dtype=np.int32)
        return self._identity


def side_writers(pool: PoolStorage, shape: tuple) -> tuple:
    """The write kernel's (keys, values) writers of a pool, for rows of shape (T, n_kv, hd)."""
    bits, group_len, rotate = kernel_bits(pool.mode), group_size(pool.head_dim), pool.rotation is not None
    return tuple(SideWriter(bits, group_len, rotate, side, shape[1], shape[2]) for side in (pool.keys, pool.values))


def kv_write(storage: KVStorage, slot: int, rows, keys: np.ndarray, values: np.ndarray, prepared: dict | None = None
             ) -> None:
    """keys, values (T, n_kv, hd) stored at physical rows (a slice or a (T,) array) of `slot`
    by the compiled kernel (kernels/kv.py; int4-h rotates with rotation.py's FWHT first),
    through the cache's block table. Its oracle is the NumPy stores (store_for(mode).store of
    the rotated rows). prepared (a plan's dict): the checked physical rows and each side's
    writer (kernels/kv.py SideWriter) are kept there for the forward's other layers."""
    key = ("numba kv rows", id(storage), keys.shape[0])
    kept = prepared.get(key) if prepared is not None else None
    if kept is None:
        kept = (storage, checked_rows(rows, keys.shape[0], storage.rows), side_writers(storage.pool, keys.shape))
        if prepared is not None:
            prepared[key] = kept                        # storage held: its id stays its own
    _, checked, (write_keys, write_values) = kept
    table_row = storage.table[slot]
    write_keys(table_row, checked, keys)
    write_values(table_row, checked, values)


def kv_write_many(keys: np.ndarray, values: np.ndarray, parts: list, holder: dict | None = None) -> None:
    """kv_write for several caches' rows in one kernel call per side: parts [(start, stop,
    storage, slot, physical rows)] own rows [start, stop) of keys and values (T, n_kv, hd), all
    in one pool. Each row's pool row is worked out here through its cache's table, and the
    kernel stores the rows through the identity table: what it stores in each row is what
    kv_write of that row alone stores (the write is per row). holder (a forward's dict): the
    checked rows, split into block and offset, are kept there for the forward's other layers,
    so a layer call only looks its parts' blocks up in their slots' table rows."""
    first = parts[0][2]
    pool = first.pool
    key = ("numba kv parts", tuple((start, stop, id(storage)) for start, stop, storage, _, _ in parts))
    kept = holder.get(key) if holder is not None else None
    if kept is None:
        blocks, offsets = [], []
        for start, stop, storage, _, rows in parts:
            if storage.pool is not pool:
                raise ValueError("a KV write over caches of different pools in one call")
            rows = checked_rows(rows, stop - start, storage.rows)
            blocks.append(rows // ATTENTION_BLOCK)
            offsets.append(rows % ATTENTION_BLOCK)
        kept = ([storage for _, _, storage, _, _ in parts], blocks, np.concatenate(offsets),  # storages held: ids stay
                side_writers(pool, keys.shape))
        if holder is not None:
            holder[key] = kept
    _, blocks, offsets, (write_keys, write_values) = kept
    physical = np.concatenate([storage.table[slot, block] for (_, _, storage, slot, _), block in zip(parts, blocks)])
    rows = physical.astype(np.int64) * ATTENTION_BLOCK + offsets
    identity = pool.identity_table()
    write_keys(identity, rows, keys)
    write_values(identity, rows, values)
