"""Several caches' rows in one KV write and one attention launch: a batched step (model/batch.py)
on the CUDA backend.

A batched step stacks every running request's rows for the linear calls; the KV write and
attention of a layer are the per-cache operations. Launched per part they cost two launches
per request per layer (8 decoding requests, 34 layer instances: 544 launches a step). Here
they are one launch each for all parts: every part's block table is copied into one stacked
table on the device,

    table (S, P, W) int32: table[s, p] = part p's row of slot s (its cache's table[s], widened
    to W blocks with the null block; a part with fewer slots leaves the rest null),

and the kernels read token t's row at offset (s_p P + p) W, s_p its part's slot in this layer
call (cuda/kv.cu, attention.cu: per_token_tables). Nothing else changes: a row is written and
a query reads exactly the rows its own cache's table names, with the same arithmetic, so every
row's bits are those of its part launched alone (tests/test_cuda_batch.py).

Taken when the parts share one pool and one geometry (window, ring) and none is a draft tree
(whose tail rows and shared_end are one per launch); otherwise each part is launched on its own.
A layout is worked out once per forward for each set of parts (the forward's shared holder),
and each slot assignment's offsets once: uploads a step, not a layer.

A batch of plain decode steps replayed as one CUDA graph (graphs.py BatchDecodeGraph) reads
all of this from its fixed inputs instead (`static`), so the graph is reused from step to step
and across requests.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tinyloop.backends.cuda.launch.kv import TokenTables
from tinyloop.limits import ATTENTION_BLOCK


@dataclass
class BatchLayout:
    """The stacked rows of one set of parts on the device."""
    n_parts: int
    n_slots: int                     # S: the most slots of any part's cache
    width: int                       # W: the widest table, in blocks
    window: int
    ring_blocks: int
    positions: object                # (T,) int32 device: logical positions
    rows: object                     # (T,) int32 device: physical write rows
    table: object                    # (S * P * W,) int32 device
    token_parts: np.ndarray          # (T,) host: each token's part
    upload: object = None            # (host ints) -> device int32 array; None: offsets are all given
    offsets: dict = field(default_factory=dict)    # slots per part (tuple) -> (T,) int32 device offsets
    rotation: object = None          # (T, hd / 2) complex64, stacked on first use

    @property
    def rows_per_slot(self) -> int:
        """Physical rows of the widest table: what bounds attention's chunks."""
        return self.width * ATTENTION_BLOCK

    def tables(self, slots) -> TokenTables:
        """The token tables of a layer call whose part p is at slot slots[p]."""
        key = tuple(int(s) for s in slots)
        offsets = self.offsets.get(key)
        if offsets is None:
            if self.upload is None:
                raise ValueError(f"a captured batch has no offsets for slots {key}")
            if any(not 0 <= s < self.n_slots for s in key):
                raise ValueError(f"slots {key} outside the stacked table's {self.n_slots}")
            per_part = (np.asarray(key, np.int64) * self.n_parts + np.arange(self.n_parts)) * self.width
            offsets = self.offsets[key] = self.upload(per_part[self.token_parts])
        return TokenTables(self.table, offsets)


def geometry_of(plan) -> tuple[int, int]:
    """(window, ring blocks) of a plan's cache."""
    g = plan.geometry
    return (g.window, g.ring // ATTENTION_BLOCK if g.ring else 0) if g else (0, 0)


def batchable(parts: list, alone: bool = False) -> bool:
    """Whether parts [(start, stop, storage, slot, plan)] can share one launch: more than one
    (alone: one is enough, for a captured batch of one), one pool, one geometry, no draft tree,
    stacked in order."""
    if len(parts) < (1 if alone else 2):
        return False
    pool, geometry = parts[0][2].pool, geometry_of(parts[0][4])
    start = 0
    for first, stop, storage, _slot, plan in parts:
        if storage.pool is not pool or geometry_of(plan) != geometry or first != start:
            return False
        if plan.attention is not None and plan.attention.n_tail:
            return False
        start = stop
    return True


def stacked_tables(tables: list, n_slots: int, width: int) -> np.ndarray:
    """tables: each part's (slots, blocks) host table -> (S, P, W) int32, null-padded."""
    out = np.zeros((n_slots, len(tables), width), np.int32)
    for p, table in enumerate(tables):
        out[:table.shape[0], p, :table.shape[1]] = table
    return out


def build_layout(parts: list, upload) -> BatchLayout:
    """A layout for parts [(start, stop, storage, slot, plan)] (batchable), its values uploaded
    in one copy. upload(host ints) -> a new int32 device array."""
    storages, plans = [p[2] for p in parts], [p[4] for p in parts]
    n_slots = max(s.table.shape[0] for s in storages)
    width = max(s.table.shape[1] for s in storages)
    positions = np.concatenate([np.asarray(plan.positions, np.int64) for plan in plans])
    rows = np.concatenate([plan.write_row_ids() for plan in plans])
    table = stacked_tables([s.table for s in storages], n_slots, width)
    n = positions.shape[0]
    values = upload(np.concatenate([positions, rows, table.reshape(-1)]))
    window, ring_blocks = geometry_of(plans[0])
    token_parts = np.repeat(np.arange(len(parts)), [stop - start for start, stop, *_ in parts])
    return BatchLayout(len(parts), n_slots, width, window, ring_blocks, values[:n], values[n:2 * n], values[2 * n:],
                       token_parts, upload)
