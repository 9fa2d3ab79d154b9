"""The KV cache of one request: one slot per executed layer instance, paged.

A request at `loops` runs P + C*loops + Q layer instances per token, each with its own keys
and values, so the cache has that many slots (a speculative request adds the draft's coda
slots). Rows are addressed by *virtual row* (model/plan.py): a token's logical position, or
for draft-tree nodes a row after the last position; a *physical row* is where the cache keeps
a virtual row:
- full cache (window 0): one physical row per virtual row, for the whole request;
- sliding window (window W > 0): a ring of W + RING_SLACK rows, rounded up to whole
  64-row blocks (virtual row r lives at r mod ring), so memory is bounded by the window;
  the slack holds the rows one forward writes ahead (a verify pass over a whole draft
  tree) without overwriting any row a query of that pass can still see.

Physical rows come in 64-row blocks, and each (slot, physical block) is one block of the
engine's KV pool (kv/pool.py) through the block table, `table[slot, block]` -> pool block
(0, the null block, until allocated). The cache reserves every block it may need when it is
made and allocates them as rows are written (`ensure_rows`, called by each forward's plan),
a whole block row (every slot) at a time; a ring takes all its blocks at once. The backends'
kernels read and write through the table (backends/*/kvstore.py), so where a block lives
changes no bit of what is computed.
"""
from __future__ import annotations

import numpy as np

from tinyloop.kv.modes import check_mode
from tinyloop.kv.pool import NULL_BLOCK, KVPool
from tinyloop.limits import ATTENTION_BLOCK, MAX_FORWARD_ROWS
from tinyloop.model.plan import Geometry

RING_SLACK = MAX_FORWARD_ROWS + 1      # rows one forward writes ahead, + 1


def round_up(n: int) -> int:
    return -(-n // ATTENTION_BLOCK) * ATTENTION_BLOCK


def physical_rows_needed(capacity: int, window: int, ring: bool = True) -> int:
    """Rows a cache keeps per slot for `capacity` virtual rows with this window."""
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
                 window: int = 0, ring: bool = True, pool: KVPool | None = None):
        """ring=False keeps one row per position even with a window (a reference for tests);
        pool: the engine's KV pool, whose blocks this cache reserves (PoolFull if they are not
        free now); None: a pool of its own, exactly its size."""
        if capacity < 1:
            raise ValueError(f"cache capacity must be >= 1, got {capacity}")
        check_mode(mode)
        self.backend = backend
        self.n_slots, self.capacity, self.mode, self.window = n_slots, capacity, mode, window
        self.rows = physical_rows_needed(capacity, window, ring)
        self.ring = self.rows if self.rows < round_up(capacity) else None
        n_blocks = self.rows // ATTENTION_BLOCK
        if pool is None:
            pool = KVPool(backend, mode, n_kv_heads, head_dim, n_blocks=n_slots * n_blocks + 1, private=True)
        elif (pool.mode, pool.n_kv, pool.head_dim) != (mode, n_kv_heads, head_dim):
            raise ValueError(f"a {mode} cache of {n_kv_heads} x {head_dim} from a {pool.mode} pool of "
                             f"{pool.n_kv} x {pool.head_dim}")
        pool.reserve(n_slots * n_blocks)
        self.pool = pool
        self._reserved = n_slots * n_blocks              # blocks still promised to this cache
        self.table = np.full((n_slots, n_blocks), NULL_BLOCK, np.int32)     # (slots, blocks) -> pool block
        self.storage = backend.kv_view(pool.storage, self.table)
        self.geometry = Geometry(self.rows, self.ring, window)
        self.length = 0          # virtual rows [0, length) hold committed tokens
        if self.ring:
            self._allocate(np.arange(n_blocks))

    @property
    def nbytes(self) -> int:
        """Bytes of the pool blocks this cache may hold (what it reserved)."""
        return self.table.size * self.pool.block_bytes

    @property
    def blocks_held(self) -> int:
        return int(np.count_nonzero(self.table != NULL_BLOCK))

    @property
    def max_rows_per_forward(self) -> int:
        """How many consecutive rows one forward may write without clobbering rows it reads."""
        return self.rows - self.window + 1 if self.ring else self.capacity

    def check_rows(self, start: int, count: int) -> None:
        if start < 0 or start + count > self.capacity:
            raise IndexError(f"cache rows [{start}, {start + count}) outside capacity {self.capacity}")

    def ensure_rows(self, start: int, count: int) -> None:
        """Pool blocks for virtual rows [start, start + count) in every slot, allocated if missing."""
        if count <= 0 or self.ring:
            return
        first, last = start // ATTENTION_BLOCK, (start + count - 1) // ATTENTION_BLOCK
        missing = np.flatnonzero(self.table[0, first:last + 1] == NULL_BLOCK) + first
        if missing.size:
            self._allocate(missing)

    def _allocate(self, blocks: np.ndarray) -> None:
        ids = self.pool.allocate(self.n_slots * len(blocks))
        self._reserved -= ids.size
        self.table[:, blocks] = ids.reshape(self.n_slots, len(blocks))
        self.backend.kv_table_changed(self.storage)

    def adopt(self, block: int, ids: np.ndarray) -> None:
        """Take pool blocks someone else computed for physical block `block` (one per slot,
        (n_slots,) ids, read-only: a cached prompt prefix, kv/prefix.py) instead of allocating."""
        if self.table[0, block] != NULL_BLOCK:
            raise ValueError(f"block {block} is already held")
        self.pool.hold(ids)
        self.pool.unreserve(self.n_slots)
        self._reserved -= self.n_slots
        self.table[:, block] = ids
        self.backend.kv_table_changed(self.storage)

    def release(self) -> None:
        """Give every held block and the rest of the reservation back to the pool (idempotent)."""
        held = self.table[self.table != NULL_BLOCK]
        self.table[...] = NULL_BLOCK
        self.pool.release(held)
        self.pool.unreserve(self._reserved)
        self._reserved = 0

    def copy_rows(self, source, target) -> None:
        """Copy virtual rows source[i] -> target[i] in every slot (one gather/scatter)."""
        self.backend.kv_copy_rows(self.storage, self.geometry.physical(source), self.geometry.physical(target))

    def truncate(self, length: int) -> None:
        """Forget positions >= length (speculative rollback)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate cache of length {self.length} to {length}")
        self.length = length

    def stored(self, start: int, stop: int) -> dict:
        """Raw stored arrays for virtual rows [start, stop) of every slot, on the host (for tests):
        name -> (n_slots, n_kv, stop - start, ...)."""
        return self.backend.kv_stored(self.storage, self.geometry.physical(np.arange(start, stop)))
