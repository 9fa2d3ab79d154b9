"""One plan per forward: everything about where a forward's T tokens sit, worked out once
on the host and handed to every layer.

Positions, RoPE rotations, the physical rows the new keys and values go to (ring
buffer applied), the window, exact or bulk, and for attention the key blocks each
query reads (shared blocks, a draft tree's per-query path rows, the visibility mask).
No layer builds an index, a mask or a gather of its own.

Rows: a token's *virtual row* is its logical position, except for draft-tree nodes,
which take rows after the last position (node i of a round at row base + i). A
*physical row* is where a virtual row is stored: the same row, or the row modulo the
ring's size for a sliding-window cache. The ring is a whole number of 64-row blocks,
so virtual block b is stored, contiguous, at physical block b mod (ring blocks).

The per-step values a captured GPU step must be able to change (tokens, positions,
write rows, the tree path table) are written into StepBuffers, allocated once per
engine, never into fresh arrays; the plan's arrays are views of them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tinyloop.limits import ATTENTION_BLOCK, MAX_DRAFT_AHEAD, MAX_FORWARD_ROWS


@dataclass
class TreeRows:
    """Where each query's path lives: logical base + j -> virtual row path_rows[t, j]."""
    base: int
    path_rows: np.ndarray          # (T, max_depth + 1) int; entries past a query's depth unused


@dataclass
class Geometry:
    """The shape of a cache that plans depend on."""
    rows: int                      # physical rows (a multiple of ATTENTION_BLOCK)
    ring: int | None               # ring size in rows, or None: physical row = virtual row
    window: int                    # 0: attend to every earlier position

    def physical(self, rows) -> np.ndarray:
        """Virtual rows (an int array of any shape) -> where they are stored."""
        rows = np.asarray(rows)
        return rows % self.ring if self.ring else rows


@dataclass
class BlockMask:
    """The keys queries must not see, for the blocks that hold any: blocks (a slice when
    consecutive, else an index array) and hidden, (1, T, n, 1, BLOCK) bool, True where a
    key of those blocks is masked for a query (shaped to broadcast over kv heads and the
    query heads of a group)."""
    blocks: object
    hidden: np.ndarray


@dataclass
class AttentionPlan:
    """Which 64-key blocks each query reads (exact path)."""
    n_shared: int                  # blocks every query reads from the same rows
    n_tail: int                    # blocks each query gathers along its own tree path
    shared_end: int                # logical block where the per-query path blocks start
    shared_blocks: object          # physical blocks of the shared part: a slice, or (n_shared,) int array
    tail_rows: np.ndarray | None   # (T, n_tail * BLOCK) physical rows, or None
    first_block: int = 0           # the first logical block any query reads
    positions: np.ndarray | None = None   # (T,) the queries' positions, and their lowest visible one
    lowest: np.ndarray | None = None
    _mask: BlockMask | None = None

    @property
    def mask(self) -> BlockMask:
        """The keys each query must not see, for the blocks that hold any: worked out when first
        asked for (the NumPy reference's attention; the compiled kernels test each key's
        position themselves), since it costs O(queries x context) on the host."""
        if self._mask is None:
            end_block = self.first_block + self.n_shared + self.n_tail
            key_pos = np.arange(self.first_block * ATTENTION_BLOCK, end_block * ATTENTION_BLOCK).reshape(
                self.n_shared + self.n_tail, ATTENTION_BLOCK)
            visible = ((key_pos[None] <= self.positions[:, None, None])
                       & (key_pos[None] >= self.lowest[:, None, None]))            # (T, n_blocks, BLOCK)
            self._mask = block_mask(visible)
        return self._mask


@dataclass
class BulkChunk:
    """A piece of a bulk (prefill) forward: queries [start, stop) over key rows `rows`."""
    start: int
    stop: int
    rows: object                   # physical rows: a slice, or an int array
    visible: np.ndarray            # (stop - start, n_keys) bool


@dataclass
class ForwardPlan:
    positions: np.ndarray          # (T,) logical positions
    write_rows: object             # physical rows of the T new tokens: a slice, or (T,) int array
    exact: bool
    geometry: Geometry | None = None   # the cache's rows, ring and window
    rotation: object = None        # (T, hd / 2) RoPE rotations on the backend, or None
    attention: AttentionPlan | None = None
    bulk: list | None = None       # [BulkChunk] for exact=False
    prepared: dict = field(default_factory=dict)   # a backend's per-forward work, shared by the layers

    @property
    def n_tokens(self) -> int:
        return self.positions.shape[0]

    def write_row_ids(self) -> np.ndarray:
        """The physical rows of the new tokens as a (T,) int array (write_rows may be a slice)."""
        rows = self.write_rows
        return np.arange(rows.start, rows.stop) if isinstance(rows, slice) else np.asarray(rows, np.int64)


class StepBuffers:
    """Preallocated per-step inputs of the exact path (at most MAX_FORWARD_ROWS rows): the
    token ids, positions, write rows and draft-tree path table of the forward being
    planned. A plan's arrays are views of them, valid until the next plan is built."""

    def __init__(self):
        self.tokens = np.zeros(MAX_FORWARD_ROWS, np.int64)
        self.positions = np.zeros(MAX_FORWARD_ROWS, np.int64)
        self.write_rows = np.zeros(MAX_FORWARD_ROWS, np.int64)
        self.path_rows = np.zeros((MAX_FORWARD_ROWS, MAX_DRAFT_AHEAD + 1), np.int64)

    def hold(self, name: str, values) -> np.ndarray:
        """values (n,) or (n, width) written into the buffer `name`; returns the view (or
        values themselves when they do not fit: an exact forward over a long stretch, not a step)."""
        values = np.asarray(values)
        buffer = getattr(self, name)
        if any(n > size for n, size in zip(values.shape, buffer.shape)):
            return values
        target = buffer[tuple(slice(0, n) for n in values.shape)]
        target[...] = values
        return target


def _range(start: int, stop: int, period: int | None):
    """[start, stop) of a sequence stored modulo `period` (None: not wrapped) -> a slice
    when it is stored contiguously, else an int array. Serves rows and 64-row blocks."""
    if not period:
        return slice(start, stop)
    if start // period == (stop - 1) // period:
        offset = start - start % period
        return slice(start - offset, stop - offset)
    return np.arange(start, stop) % period


def build_plan(positions, write_row: int, geometry: Geometry, exact: bool = True, tree: TreeRows | None = None,
               buffers: StepBuffers | None = None) -> ForwardPlan:
    """positions: (T,) logical; the T tokens take consecutive virtual rows from write_row."""
    positions = np.asarray(positions, np.int64)
    n = positions.shape[0]
    if tree is not None and not exact:
        raise ValueError("draft trees need the exact attention path")
    write_rows = _range(write_row, write_row + n, geometry.ring)
    if buffers is not None and exact:
        positions = buffers.hold("positions", positions)
        if not isinstance(write_rows, slice):
            write_rows = buffers.hold("write_rows", write_rows)
        if tree is not None:
            tree = TreeRows(tree.base, buffers.hold("path_rows", tree.path_rows))
    plan = ForwardPlan(positions, write_rows, exact, geometry)
    if exact:
        plan.attention = _attention_plan(positions, geometry, tree)
    else:
        plan.bulk = _bulk_chunks(positions, geometry)
    return plan


def _lowest(positions: np.ndarray, window: int) -> np.ndarray:
    return np.maximum(positions - window + 1, 0) if window else np.zeros_like(positions)


def _attention_plan(positions: np.ndarray, geometry: Geometry, tree: TreeRows | None) -> AttentionPlan:
    lowest = _lowest(positions, geometry.window)
    first_block = int(lowest.min()) // ATTENTION_BLOCK
    end_block = int(positions.max()) // ATTENTION_BLOCK + 1
    shared_end = end_block if tree is None else min(max(tree.base // ATTENTION_BLOCK, first_block), end_block)
    n_shared, n_tail = shared_end - first_block, end_block - shared_end
    tail_rows = None
    if n_tail:
        tail_rows = geometry.physical(
            _tail_rows(tree, positions, shared_end * ATTENTION_BLOCK, end_block * ATTENTION_BLOCK))
    ring_blocks = geometry.ring // ATTENTION_BLOCK if geometry.ring else None
    return AttentionPlan(n_shared, n_tail, shared_end, _range(first_block, shared_end, ring_blocks), tail_rows,
                         first_block, positions, lowest)


def block_mask(visible: np.ndarray) -> BlockMask:
    """The blocks where some key is invisible to some query (a slice when they are
    consecutive: a decode step's last block, a window's first), and their mask."""
    blocks = np.flatnonzero(~visible.all(axis=(0, 2)))
    if blocks.size and blocks[-1] - blocks[0] + 1 == blocks.size:
        blocks = slice(int(blocks[0]), int(blocks[-1]) + 1)
    return BlockMask(blocks, ~visible[None, :, blocks, None, :])


def _tail_rows(tree: TreeRows, positions: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Virtual rows of logical positions [start, stop) for each query: (T, stop - start).

    Below tree.base a position is its own row; from base to the query's position, the
    query's path; past it, row 0 (masked, never contributes).
    """
    logical = np.arange(start, stop)[None, :]                           # (1, tail)
    rows = np.broadcast_to(logical, (positions.shape[0], stop - start)).copy()
    offset = logical - tree.base                                        # (1, tail)
    on_path = (offset >= 0) & (logical <= positions[:, None])
    depth_index = np.clip(offset, 0, tree.path_rows.shape[1] - 1)
    path = np.take_along_axis(tree.path_rows, np.broadcast_to(depth_index, rows.shape), axis=1)
    rows[on_path] = path[on_path]
    rows[logical > positions[:, None]] = 0
    return rows


BULK_CHUNK = 256          # prefill queries per attention chunk, so the score matrix stays small


def _bulk_chunks(positions: np.ndarray, geometry: Geometry) -> list:
    chunks = []
    for start in range(0, positions.shape[0], BULK_CHUNK):
        stop = min(start + BULK_CHUNK, positions.shape[0])
        pos = positions[start:stop]
        lowest = _lowest(pos, geometry.window)
        first, span_end = int(lowest.min()), int(pos.max()) + 1
        key_pos = np.arange(first, span_end)[None, :]
        visible = (key_pos <= pos[:, None]) & (key_pos >= lowest[:, None])   # (t, span)
        chunks.append(BulkChunk(start, stop, _range(first, span_end, geometry.ring), visible))
    return chunks


@dataclass
class LayerPart:
    """One cache's rows in a layer call: its plan, its cache, and where the core layers' keys
    and values go for adaptive depth (a list, or None)."""
    plan: ForwardPlan
    cache: object
    kept: list | None = None


class Rows:
    """The rows of one layer call, stacked: parts[i] = (start, stop, part), part having .plan,
    .cache and .kept (a LayerPart, or a Pass of model/batch.py), rows [start, stop) its own,
    in order. backend.rope reads `rotation`: every part's RoPE rotations, stacked."""

    def __init__(self, parts: list, prepared: dict | None = None):
        self.parts = parts
        self._rotation = None
        self._groups = {}
        # what a backend works out once for these parts' attention and KV writes (shared by
        # every Rows of one batched forward: model/batch.py)
        self.prepared = {} if prepared is None else prepared

    @property
    def rotation(self):
        if self._rotation is None and self.parts[0][2].plan.rotation is not None:
            rotations = [part.plan.rotation for _, _, part in self.parts]
            if len(rotations) == 1:
                self._rotation = rotations[0]
            else:
                xp = np if isinstance(rotations[0], np.ndarray) else __import__("cupy")
                self._rotation = xp.concatenate(rotations)
        return self._rotation

    def linear_groups(self, bulk_is_exact: bool) -> list:
        """[(exact, part indexes)]: the linear calls the rows need. One call for every row
        where the backend gives a bulk row its exact bits in any company, or where every part
        is exact; otherwise the exact parts together and each bulk (prefill) part alone."""
        groups = self._groups.get(bulk_is_exact)
        if groups is None:
            exact = [part.plan.exact for _, _, part in self.parts]
            if bulk_is_exact or all(exact):
                groups = [(all(exact), list(range(len(self.parts))))]
            else:
                together = [i for i, e in enumerate(exact) if e]
                groups = ([(True, together)] if together else []) + [(False, [i]) for i, e in enumerate(exact) if not e]
            self._groups[bulk_is_exact] = groups
        return groups
