"""The KV cache of one request: one slot per executed layer instance.

A request at `loops` runs P + C*loops + Q layer instances per token, each with its
own keys and values, so the cache has that many slots. Memory for the request's
whole length is allocated up front; appending writes rows, truncating only moves
the length back (rows past it are never read: attention masks them).
"""
from __future__ import annotations

import numpy as np

from .ops import ATTENTION_BLOCK


class KVCache:
    """keys/values: (n_slots, n_kv, capacity_padded, head_dim) float32."""

    def __init__(self, n_slots: int, n_kv_heads: int, head_dim: int, capacity: int,
                 xp=np, dtype=np.float32):
        if capacity < 1:
            raise ValueError(f"cache capacity must be >= 1, got {capacity}")
        self.n_slots = n_slots
        self.capacity = capacity
        # Padded to whole attention blocks so block-wise reads never run off the end.
        padded = -(-capacity // ATTENTION_BLOCK) * ATTENTION_BLOCK
        self.keys = xp.zeros((n_slots, n_kv_heads, padded, head_dim), dtype)
        self.values = xp.zeros((n_slots, n_kv_heads, padded, head_dim), dtype)
        self.length = 0          # positions [0, length) hold committed tokens

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.values.nbytes)

    def write(self, slot: int, start: int, keys, values) -> None:
        """Store keys/values (T, n_kv, hd) at rows [start, start + T) of `slot`."""
        count = keys.shape[0]
        if start < 0 or start + count > self.capacity:
            raise IndexError(f"cache rows [{start}, {start + count}) outside capacity {self.capacity}")
        self.keys[slot, :, start:start + count] = keys.transpose(1, 0, 2)
        self.values[slot, :, start:start + count] = values.transpose(1, 0, 2)

    def slot(self, slot: int):
        """(keys, values) of one slot, each (n_kv, capacity_padded, hd), as views."""
        return self.keys[slot], self.values[slot]

    def copy_row(self, source: int, target: int) -> None:
        """Copy one row of every slot (moving an accepted tree node to its position)."""
        self.keys[:, :, target] = self.keys[:, :, source]
        self.values[:, :, target] = self.values[:, :, source]

    def truncate(self, length: int) -> None:
        """Forget positions >= length (speculative rollback)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate cache of length {self.length} to {length}")
        self.length = length
