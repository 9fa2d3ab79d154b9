"""The KV cache of one request: one slot per executed layer instance.

A request at `loops` runs P + C*loops + Q layer instances per token, each with its
own keys and values, so the cache has that many slots (a speculative request adds the
draft's coda slots). Rows are addressed by *virtual row* (model/plan.py): a token's
logical position, or for draft-tree nodes a row after the last position. Storage is
the backend's (backends/*/kvstore), allocated once per request, from the engine's
pool or fresh:
- full cache (window 0): one physical row per virtual row, for the whole request;
- sliding window (window W > 0): a ring of W + RING_SLACK rows, rounded up to whole
  64-row blocks (virtual row r lives at r mod ring), so memory is bounded by the
  window; the slack holds the rows one forward writes ahead (a verify pass over a
  whole draft tree) without overwriting any row a query of that pass can still see.
"""
from __future__ import annotations

import numpy as np

from tinyloop.kv.modes import check_mode
from tinyloop.limits import ATTENTION_BLOCK, MAX_FORWARD_ROWS
from tinyloop.model.plan import Geometry

RING_SLACK = MAX_FORWARD_ROWS + 1      # rows one forward writes ahead, + 1


def round_up(n: int) -> int:
    return -(-n // ATTENTION_BLOCK) * ATTENTION_BLOCK


def physical_rows_needed(capacity: int, window: int, ring: bool = True) -> int:
    """Rows a cache allocates for `capacity` virtual rows with this window."""
    if ring and window and window + RING_SLACK < capacity:
        return round_up(window + RING_SLACK)
    return round_up(capacity)


def cache_bytes(backend, n_slots: int, n_kv_heads: int, head_dim: int, capacity: int, mode: str,
                window: int = 0) -> int:
    """Bytes of keys + values a cache of this shape takes on this backend."""
    rows = physical_rows_needed(capacity, window)
    return n_slots * rows * backend.kv_bytes_per_row(mode, n_kv_heads, head_dim)


class KVCache:
    def __init__(self, backend, n_slots: int, n_kv_heads: int, head_dim: int, capacity: int, mode: str = "fp16",
                 window: int = 0, ring: bool = True, alloc=None):
        """ring=False keeps one row per position even with a window (a reference for tests);
        alloc(shape, dtype) -> zeroed array carves storage from a pool (None: fresh arrays)."""
        if capacity < 1:
            raise ValueError(f"cache capacity must be >= 1, got {capacity}")
        check_mode(mode)
        self.backend = backend
        self.n_slots, self.capacity, self.mode, self.window = n_slots, capacity, mode, window
        self.rows = physical_rows_needed(capacity, window, ring)
        self.ring = self.rows if self.rows < round_up(capacity) else None
        self.storage = backend.kv_storage(mode, n_slots, n_kv_heads, self.rows, head_dim, alloc)
        self.geometry = Geometry(self.rows, self.ring, window)
        self.length = 0          # virtual rows [0, length) hold committed tokens

    @property
    def nbytes(self) -> int:
        return self.storage.nbytes

    @property
    def max_rows_per_forward(self) -> int:
        """How many consecutive rows one forward may write without clobbering rows it reads."""
        return self.rows - self.window + 1 if self.ring else self.capacity

    def check_rows(self, start: int, count: int) -> None:
        if start < 0 or start + count > self.capacity:
            raise IndexError(f"cache rows [{start}, {start + count}) outside capacity {self.capacity}")

    def copy_rows(self, source, target) -> None:
        """Copy virtual rows source[i] -> target[i] in every slot (one gather/scatter)."""
        self.backend.kv_copy_rows(self.storage, self.geometry.physical(source), self.geometry.physical(target))

    def truncate(self, length: int) -> None:
        """Forget positions >= length (speculative rollback)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate cache of length {self.length} to {length}")
        self.length = length

    def stored(self, start: int, stop: int) -> dict:
        """Raw stored arrays for virtual rows [start, stop) of every slot, on the host (for tests)."""
        return self.backend.kv_stored(self.storage, self.geometry.physical(np.arange(start, stop)))
