"""The KV pool: the storage of every request's keys and values, allocated once when the engine
starts and cut into fixed blocks of ATTENTION_BLOCK (64) rows. A cache (kv/cache.py) maps
each (layer instance, 64-row block) of its own to a pool block through its block table, and
takes blocks as it grows, so no generation allocates memory and a finished one gives its
blocks back to the next.

Blocks, per side (keys, values), are 64 consecutive rows of the pool's (n_kv, rows, ...)
arrays (backends/*/kvstore.py), for every kv head.

- Block 0 is the null block: never handed out. Every table entry not allocated yet points to
  it, so a kernel reading an unwritten row reads the null block (zeros on the backends that
  read masked rows at all), never another request's data.
- Reservations: a cache reserves, when it is made, every block it can ever need (its slots
  times its blocks per slot), and then allocates them block by block as it grows. So a
  running request never runs out of blocks, and a request that does not fit now waits
  (engine.py) instead of corrupting one that runs: admission checks `can_reserve`.
- Reference counts: a block may be in several tables at once (a shared prompt prefix,
  kv/prefix.py); it returns to the free list when the last holder lets go, and if the
  prefix cache keeps it, it stays readable until evicted (least recently used first) for a
  reservation that needs the room.
"""
from __future__ import annotations

import heapq
import os

import numpy as np

from tinyloop.errors import RequestError
from tinyloop.limits import ATTENTION_BLOCK

NULL_BLOCK = 0
DEFAULT_CAP = 4 << 30                      # the default pool is at most 4 GiB ...
DEFAULT_MEMORY_SHARE = 4                   # ... and at most a quarter of the machine's memory


def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def default_pool_bytes(model) -> int:
    """The backend's share of device memory (a GPU: backends/cuda), else at most DEFAULT_CAP
    and a quarter of the machine's memory. On the CPU pages are touched only as blocks are
    used, so an unused pool costs address space, not memory."""
    device_share = model.backend.kv_pool_bytes()
    if device_share is not None:
        return int(device_share)
    memory = physical_memory_bytes()
    return min(DEFAULT_CAP, memory // DEFAULT_MEMORY_SHARE) if memory else DEFAULT_CAP


class PoolFull(RequestError):
    """Not enough free blocks for a reservation now (it may fit once others finish)."""


class KVPool:
    def __init__(self, backend, mode: str, n_kv: int, head_dim: int, nbytes: int | None = None,
                 n_blocks: int | None = None, from_setting: bool = False, private: bool = False):
        """nbytes: the budget (blocks = nbytes // block bytes), or n_blocks directly (a
        private pool for one cache, tests); from_setting: the size came from TINYLOOP_KV_BUDGET_MB;
        private: the pool of one cache made without the engine's (kv/cache.py)."""
        self.backend, self.mode, self.n_kv, self.head_dim = backend, mode, n_kv, head_dim
        self.block_bytes = ATTENTION_BLOCK * backend.kv_bytes_per_row(mode, n_kv, head_dim)
        if n_blocks is None:
            n_blocks = int(nbytes) // self.block_bytes
        self.budget_bytes = int(nbytes) if nbytes is not None else n_blocks * self.block_bytes
        self.n_blocks = max(2, int(n_blocks))                    # the null block and at least one
        self.from_setting = from_setting
        self.storage = backend.kv_pool(mode, n_kv, self.n_blocks * ATTENTION_BLOCK, head_dim)
        self.refs = np.zeros(self.n_blocks, np.int32)            # holders of each block
        self.refs[NULL_BLOCK] = 1                                # forever
        # A min-heap: the lowest free block first. The pool's arrays are touched page by page
        # as blocks are used (calloc), so handing out low blocks again keeps the resident set
        # at the peak number of blocks in use, instead of walking the whole budget over time.
        self._free = list(range(1, self.n_blocks))
        self.reserved = 0                                        # promised to caches, not yet allocated
        self.prefix = None                                       # a PrefixCache (kv/prefix.py) or None
        self.private = private                                   # one cache's own pool (kv/cache.py), not the engine's

    @classmethod
    def for_model(cls, model, nbytes: int, from_setting: bool = False) -> "KVPool":
        c = model.config
        return cls(model.backend, model.kv_mode, c.n_kv_heads, c.head_dim, nbytes, from_setting=from_setting)

    @property
    def nbytes(self) -> int:
        return self.n_blocks * self.block_bytes

    @property
    def usable_blocks(self) -> int:
        """Every block but the null block."""
        return self.n_blocks - 1

    @property
    def free_blocks(self) -> int:
        """Blocks nobody holds (evictable cached blocks included) and nobody was promised."""
        evictable = self.prefix.evictable if self.prefix is not None else 0
        return len(self._free) + evictable - self.reserved

    @property
    def used_blocks(self) -> int:
        """Blocks held by a cache or kept by the prefix cache."""
        return self.usable_blocks - len(self._free)

    # -- the size of a request ------------------------------------------------------------
    def check(self, model, capacity: int, loops: int, extra_slots: int, window: int) -> None:
        """RequestError (with the numbers) if a cache of this shape can never fit the pool."""
        need = model.cache_blocks(capacity, loops, extra_slots, window)
        if need > self.usable_blocks:
            slots = model.config.n_layer_instances(loops) + extra_slots
            extent = f"window {window}" if window else f"{capacity} positions"
            source = "TINYLOOP_KV_BUDGET_MB" if self.from_setting else "the default KV pool; set TINYLOOP_KV_BUDGET_MB"
            raise RequestError(
                f"this request needs {need * self.block_bytes / 2**20:.1f} MiB of KV cache ({slots} layer instances, "
                f"{extent}, {model.kv_mode}); the budget is {self.budget_bytes / 2**20:.1f} MiB "
                f"({source}). Lower max_tokens or loops, set cache_window, or use a quantized cache mode",
                "max_tokens")

    # -- reservations and blocks -------------------------------------------------------------
    def can_reserve(self, n: int) -> bool:
        return n <= self.free_blocks

    def reserve(self, n: int) -> None:
        if n > self.usable_blocks:
            raise RequestError(f"a cache of {n} blocks cannot fit a KV pool of {self.usable_blocks}", "max_tokens")
        if not self.can_reserve(n):
            raise PoolFull(f"the KV pool has {self.free_blocks} free blocks, {n} needed", "max_tokens")
        self.reserved += n

    def unreserve(self, n: int) -> None:
        if not 0 <= n <= self.reserved:
            raise ValueError(f"unreserve {n} of {self.reserved} reserved blocks")
        self.reserved -= n

    def allocate(self, n: int) -> np.ndarray:
        """n blocks from a reservation: (n,) int32 block ids, each held once, prepared by the
        backend (kv_init_blocks: what it needs of a block that held someone else's rows)."""
        if n > self.reserved:
            raise ValueError(f"allocate {n} blocks with {self.reserved} reserved")
        while len(self._free) < n:
            if self.prefix is None or not self.prefix.evict_one():
                raise RuntimeError("the KV pool's free list and reservations disagree")
        ids = np.array([heapq.heappop(self._free) for _ in range(n)], np.int32)
        self.refs[ids] = 1
        self.reserved -= n
        self.backend.kv_init_blocks(self.storage, ids)
        return ids

    def hold(self, ids) -> None:
        """One more holder for blocks already in use (a cache taking a shared prefix block)."""
        ids = np.asarray(ids, np.int64)
        if np.any(self.refs[ids] < 0):
            raise ValueError("hold of a free block")
        self.refs[ids] += 1

    def release(self, ids) -> None:
        """One holder fewer for each block; a block nobody holds is freed, or kept by the
        prefix cache until evicted."""
        for block in np.asarray(ids, np.int64).reshape(-1):
            if block == NULL_BLOCK:
                continue
            if self.refs[block] <= 0:
                raise ValueError(f"release of free block {block}")
            self.refs[block] -= 1
            if self.refs[block] == 0:
                if self.prefix is not None and self.prefix.keeps(int(block)):
                    continue
                heapq.heappush(self._free, int(block))

    def free_block(self, block: int) -> None:
        """A block the prefix cache lets go of (refs 0) back to the free list."""
        heapq.heappush(self._free, int(block))
