"""The KV cache of one request: one slot per executed layer instance.

A request at `loops` runs P + C*loops + Q layer instances per token, each with its
own keys and values, so the cache has that many slots. Rows are addressed by
*virtual row*: a token's logical position (draft-tree nodes get rows after the last
position). Memory is allocated once per request:
- full cache (window 0): one physical row per virtual row, for the whole request;
- sliding window (window W > 0): a ring of W + RING_SLACK rows (virtual row r lives
  at r mod ring), so memory is bounded by the window; the slack holds the rows one
  forward writes ahead (a verify pass over up to 65 tree nodes) without overwriting
  any row a query of that pass can still see.
Storage goes through a codec (kvcodecs.py): fp16 (default), int8, int4, int4-h, fp32.
int4-h rotates keys and values by an orthonormal Hadamard matrix over the head
dimension before quantizing; queries get the same rotation (scores unchanged) and
attention outputs are rotated back.
"""
from __future__ import annotations

import numpy as np

from tinyloop.kv.codecs import KV_MODES, codec_for, hadamard
from tinyloop.backends.cpu import ATTENTION_BLOCK

RING_SLACK = 66          # rows written ahead in one forward (<= 65 tree nodes) + 1


def _round_up(n: int) -> int:
    return -(-n // ATTENTION_BLOCK) * ATTENTION_BLOCK


def physical_rows_needed(capacity: int, window: int, ring: bool = True) -> int:
    """Rows a cache allocates for `capacity` virtual rows with this window."""
    if ring and window and window + RING_SLACK < capacity:
        return _round_up(window + RING_SLACK)
    return _round_up(capacity)


def cache_bytes(n_slots: int, n_kv_heads: int, head_dim: int, capacity: int, mode: str, window: int = 0) -> int:
    """Bytes of keys + values a cache of this shape allocates."""
    rows = physical_rows_needed(capacity, window)
    return 2 * n_slots * rows * codec_for(mode).bytes_per_row(n_kv_heads, head_dim)


class KVCache:
    def __init__(self, n_slots: int, n_kv_heads: int, head_dim: int, capacity: int, mode: str = "fp16",
                 window: int = 0, xp=np, ring: bool = True):
        """ring=False keeps one row per position even with a window (a reference for tests)."""
        if capacity < 1:
            raise ValueError(f"cache capacity must be >= 1, got {capacity}")
        if mode not in KV_MODES:
            raise ValueError(f"KV cache mode must be one of {', '.join(KV_MODES)}, got {mode!r}")
        self.n_slots, self.capacity, self.mode, self.window = n_slots, capacity, mode, window
        self.rows = physical_rows_needed(capacity, window, ring)
        self.ring = self.rows if self.rows < _round_up(capacity) else None
        self.codec = codec_for(mode)
        self.key_arrays = self.codec.allocate(n_slots, n_kv_heads, self.rows, head_dim, xp)
        self.value_arrays = self.codec.allocate(n_slots, n_kv_heads, self.rows, head_dim, xp)
        self.rotation = hadamard(head_dim) if mode == "int4-h" else None      # (hd, hd)
        self.length = 0          # virtual rows [0, length) hold committed tokens

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.key_arrays.values())
                   + sum(a.nbytes for a in self.value_arrays.values()))

    @property
    def max_rows_per_forward(self) -> int:
        """How many consecutive rows one forward may write without clobbering rows it reads."""
        return self.rows - self.window + 1 if self.ring else self.capacity

    def _physical(self, rows):
        """Virtual rows (a (start, stop) pair or an int array) -> physical index."""
        if isinstance(rows, tuple):
            start, stop = rows
            if self.ring is None:
                return slice(start, stop)
            rows = np.arange(start, stop)
        return rows % self.ring if self.ring else rows

    # -- writes ------------------------------------------------------------------------
    def write(self, slot: int, start: int, keys, values) -> None:
        """Store keys/values (T, n_kv, hd) float32 at virtual rows [start, start + T)."""
        count = keys.shape[0]
        if start < 0 or start + count > self.capacity:
            raise IndexError(f"cache rows [{start}, {start + count}) outside capacity {self.capacity}")
        if self.rotation is not None:
            keys, values = self._rotate(keys, self.rotation), self._rotate(values, self.rotation)
        rows = self._physical((start, start + count))
        self.codec.store(self.key_arrays, slot, rows, keys)
        self.codec.store(self.value_arrays, slot, rows, values)

    def copy_row(self, source: int, target: int) -> None:
        """Copy one virtual row in every slot (moving an accepted tree node to its position)."""
        src, dst = self._physical(np.array([source]))[0], self._physical(np.array([target]))[0]
        for arrays in (self.key_arrays, self.value_arrays):
            for array in arrays.values():
                array[:, :, dst] = array[:, :, src]

    def truncate(self, length: int) -> None:
        """Forget positions >= length (speculative rollback)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate cache of length {self.length} to {length}")
        self.length = length

    # -- reads -------------------------------------------------------------------------
    def read(self, slot: int, rows):
        """Keys and values of virtual rows as float32: (n_kv, *rows shape, hd) each.
        rows: (start, stop) or an int array of any shape."""
        physical = self._physical(rows)
        return (self.codec.load(self.key_arrays, slot, physical),
                self.codec.load(self.value_arrays, slot, physical))

    def reader(self, slot: int):
        return lambda rows: self.read(slot, rows)

    def stored(self, start: int, stop: int) -> dict:
        """Raw stored arrays for virtual rows [start, stop) of every slot (for tests)."""
        rows = self._physical((start, stop))
        out = {}
        for side, arrays in (("keys", self.key_arrays), ("values", self.value_arrays)):
            for name, array in arrays.items():
                out[f"{side}.{name}"] = array[:, :, rows]
        return out

    # -- the int4-h rotation -------------------------------------------------------------
    def rotate_queries(self, q):
        return q if self.rotation is None else self._rotate(q, self.rotation)

    def restore_output(self, out):
        return out if self.rotation is None else self._rotate(out, self.rotation.T)

    @staticmethod
    def _rotate(x, matrix):
        """x: (T, heads, hd) -> x @ matrix per head, one row product at a time (row-invariant)."""
        n, heads, head_dim = x.shape
        rows = np.ascontiguousarray(x).reshape(n * heads, 1, head_dim)
        return (rows @ matrix).reshape(n, heads, head_dim)
