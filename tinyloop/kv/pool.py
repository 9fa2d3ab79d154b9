"""The KV pool: one buffer allocated when the engine starts, from which each request's
cache is carved, so no generation allocates device memory and every cache lives at the
same addresses (what a captured GPU step needs).

One generation runs at a time, so a cache takes the pool from its start; the next
request's cache replaces it. Carved arrays are zeroed, so nothing of an earlier request
(not even a non-finite value in a masked row) can reach a later one.
"""
from __future__ import annotations

import os

import numpy as np

from tinyloop.errors import RequestError
from tinyloop.kv.cache import cache_bytes

ALIGN = 64                                 # bytes: every carved array starts on a cache line
DEFAULT_CAP = 4 << 30                      # the default pool is at most 4 GiB ...
DEFAULT_MEMORY_SHARE = 4                   # ... and at most a quarter of the machine's memory


def physical_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def default_pool_bytes(model) -> int:
    """Enough for the model's largest request (full context at max loops, speculative
    slots included), capped at DEFAULT_CAP and a quarter of physical memory."""
    worst = model.worst_case_cache_bytes()
    memory = physical_memory_bytes()
    cap = min(DEFAULT_CAP, memory // DEFAULT_MEMORY_SHARE) if memory else DEFAULT_CAP
    return min(worst, cap)


class KVPool:
    def __init__(self, backend, nbytes: int, from_setting: bool = False):
        self.backend = backend
        self.nbytes = int(nbytes)
        self.from_setting = from_setting          # the size came from TINYLOOP_KV_BUDGET_MB
        self.buffer = backend.allocate(self.nbytes + 16 * ALIGN)      # room for alignment padding
        self._offset = 0

    def check(self, need: int, describe: str) -> None:
        if need > self.nbytes:
            source = "TINYLOOP_KV_BUDGET_MB" if self.from_setting else "the default KV pool; set TINYLOOP_KV_BUDGET_MB"
            raise RequestError(
                f"this request needs {need / 2**20:.1f} MiB of KV cache ({describe}); the budget is "
                f"{self.nbytes / 2**20:.1f} MiB ({source}). Lower max_tokens or loops, set cache_window, "
                f"or use a quantized cache mode", "max_tokens")

    def allocator(self):
        """A fresh carving from the start of the pool: alloc(shape, dtype) -> zeroed array."""
        self._offset = 0

        def alloc(shape, dtype):
            dtype = np.dtype(dtype)
            size = int(np.prod(shape)) * dtype.itemsize
            start = -(-self._offset // ALIGN) * ALIGN
            if start + size > self.buffer.nbytes:
                raise RequestError(f"the KV pool ({self.nbytes / 2**20:.1f} MiB) is too small for this request",
                                   "max_tokens")
            self._offset = start + size
            view = self.buffer[start:start + size].view(dtype).reshape(shape)
            view[...] = 0
            return view
        return alloc


def describe_cache(model, capacity: int, slots: int, window: int) -> str:
    return (f"{slots} layer instances, {'window ' + str(window) if window else str(capacity) + ' positions'}, "
            f"{model.kv_mode}")


def request_cache_bytes(model, capacity: int, loops: int, window: int, extra_slots: int = 0) -> int:
    c = model.config
    return cache_bytes(model.backend, c.n_layer_instances(loops) + extra_slots, c.n_kv_heads, c.head_dim,
                       capacity, model.kv_mode, window)
