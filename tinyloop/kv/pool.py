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

    def check(self, model, capacity: int, loops: int, extra_slots: int, window: int) -> None:
        """RequestError (with the numbers) if a cache of this shape does not fit the pool."""
        need = model.cache_bytes(capacity, loops, extra_slots, window)
        if need > self.nbytes:
            slots = model.config.n_layer_instances(loops) + extra_slots
            extent = f"window {window}" if window else f"{capacity} positions"
            source = "TINYLOOP_KV_BUDGET_MB" if self.from_setting else "the default KV pool; set TINYLOOP_KV_BUDGET_MB"
            raise RequestError(
                f"this request needs {need / 2**20:.1f} MiB of KV cache ({slots} layer instances, {extent}, "
                f"{model.kv_mode}); the budget is "
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
