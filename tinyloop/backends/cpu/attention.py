"""Causal attention of new queries over a request's KV cache slot.

Keys and values come from a `read(rows)` callable (the cache's reader), which
returns arrays for virtual rows whatever the storage (fp16, int8, int4, a ring), in
whatever memory layout that storage gives; the exact path copies them into the
canonical layout (layout.py) before any product. A query at logical position p
attends to logical positions 0..p (or the last `window` of them). Without a tree,
logical position = virtual row. With a draft tree (TreeRows), positions below
`tree.base` are still rows of the same number, and a node's positions from `base` on
are the rows of its own path (root, ..., itself), wherever the tree put them.
"""
from dataclasses import dataclass

import numpy as np

from tinyloop.backends.cpu.layout import canonical

ATTENTION_BLOCK = 64
_NEG_INF = np.float32(-np.inf)


@dataclass
class TreeRows:
    """Where each query's path lives: logical base + j -> physical path_rows[t, j]."""
    base: int
    path_rows: np.ndarray          # (T, max_depth + 1) int; entries past a query's depth unused


def attention_exact(q: np.ndarray, read, positions: np.ndarray, scale: float, tree: TreeRows | None = None,
                    window: int = 0) -> np.ndarray:
    """Row-invariant attention: a query's output does not depend on the other queries.

    q: (T, H, hd); read(rows) -> (keys, values), each (n_kv, *rows shape, hd), for
    virtual rows given as (start, stop) or an int array, in any memory layout;
    positions: (T,) logical. A query at p sees positions [p - window + 1, p] (all of
    [0, p] with window 0). -> (T, H, hd).

    Keys are reduced in fixed blocks of ATTENTION_BLOCK logical positions. Within a
    block every product is a matrix-vector product of fixed size (one per query and
    head) on operands in the canonical layout (layout.py); masked keys get
    probability exactly 0; per-block sums are then added in block order (cumsum is
    strictly sequential). Blocks outside a query's own range add exact zeros, so one
    query computed alone gets the very same bits as in a batch that needs more
    blocks. A tree node's blocks are gathered into the same (BLOCK, hd) layout a
    sequential decode reads, so it gets the same bits too.
    """
    n_queries, n_heads, head_dim = q.shape
    lowest = np.maximum(positions - window + 1, 0) if window else np.zeros_like(positions)
    first_block = int(lowest.min()) // ATTENTION_BLOCK
    end_block = int(positions.max()) // ATTENTION_BLOCK + 1
    shared_end = end_block if tree is None else min(max(tree.base // ATTENTION_BLOCK, first_block), end_block)
    n_shared, n_tail = shared_end - first_block, end_block - shared_end
    first = first_block * ATTENTION_BLOCK

    keys, values = read((first, shared_end * ATTENTION_BLOCK))                # (n_kv, n_shared*BLOCK, hd)
    n_kv = keys.shape[0]
    group = n_heads // n_kv
    # (n_kv, 1, 1, n_shared, BLOCK, hd): blocks every query reads from the same rows
    key_blocks = [canonical(keys).reshape(n_kv, 1, 1, n_shared, ATTENTION_BLOCK, head_dim)]
    value_blocks = [canonical(values).reshape(n_kv, 1, 1, n_shared, ATTENTION_BLOCK, head_dim)]
    if n_tail:
        rows = _tail_rows(tree, positions, shared_end * ATTENTION_BLOCK, end_block * ATTENTION_BLOCK)
        tail_keys, tail_values = read(rows)                                     # (n_kv, T, tail, hd)
        # (n_kv, 1, T, n_tail, BLOCK, hd): each query's own gathered blocks
        key_blocks.append(canonical(tail_keys).reshape(n_kv, 1, n_queries, n_tail, ATTENTION_BLOCK, head_dim))
        value_blocks.append(canonical(tail_values).reshape(n_kv, 1, n_queries, n_tail, ATTENTION_BLOCK, head_dim))

    # (n_kv, group, T, 1, 1, hd): one row vector per (kv head, group member, query)
    q_rows = canonical(q.reshape(n_queries, n_kv, group, head_dim).transpose(1, 2, 0, 3)
                       ).reshape(n_kv, group, n_queries, 1, 1, head_dim)
    scores = np.concatenate([q_rows @ kb.swapaxes(-1, -2) for kb in key_blocks], axis=3)
    scores *= np.float32(scale)                                       # (n_kv, group, T, n_blocks, 1, BLOCK)

    key_pos = np.arange(first, end_block * ATTENTION_BLOCK).reshape(n_shared + n_tail, 1, ATTENTION_BLOCK)
    visible = ((key_pos[None] <= positions[:, None, None, None])
               & (key_pos[None] >= lowest[:, None, None, None]))                 # (T, n_blocks, 1, BLOCK)
    scores = np.where(visible, scores, _NEG_INF)
    row_max = scores.max(axis=(3, 4, 5), keepdims=True)                 # (n_kv, group, T, 1, 1, 1)
    probs = np.exp(scores - row_max)                                    # masked -> exactly 0
    block_sums = probs.sum(axis=5)                                      # (n_kv, group, T, n_blocks, 1)
    block_out = np.concatenate(                                         # (n_kv, group, T, n_blocks, 1, hd)
        [probs[:, :, :, :n_shared] @ value_blocks[0]]                  # rows of probs: unit stride
        + ([probs[:, :, :, n_shared:] @ value_blocks[1]] if n_tail else []), axis=3)
    total = np.cumsum(block_sums, axis=3)[:, :, :, -1]                  # (n_kv, group, T, 1)
    out = np.cumsum(block_out, axis=3)[:, :, :, -1] / total[..., None]  # (n_kv, group, T, 1, hd)
    return np.ascontiguousarray(
        out.reshape(n_kv, group, n_queries, head_dim).transpose(2, 0, 1, 3)
    ).reshape(n_queries, n_heads, head_dim)


def _tail_rows(tree: TreeRows, positions: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Physical rows of logical positions [start, stop) for each query: (T, stop - start).

    Below tree.base a position is its own row; from base to the query's position,
    the query's path; past it, row 0 (masked, never contributes).
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


def attention_bulk(q: np.ndarray, read, positions: np.ndarray, scale: float, window: int = 0,
                   chunk: int = 256) -> np.ndarray:
    """Fast causal attention with GEMMs, for the prompt's prefill. Same arguments as above;
    positions are consecutive. Queries are processed `chunk` at a time so the score
    matrix stays small.
    """
    n_queries, n_heads, head_dim = q.shape
    out = np.empty_like(q)
    for start in range(0, n_queries, chunk):
        stop = min(start + chunk, n_queries)
        pos = positions[start:stop]
        lowest = np.maximum(pos - window + 1, 0) if window else np.zeros_like(pos)
        first, span_end = int(lowest.min()), int(pos.max()) + 1
        keys, values = read((first, span_end))                        # (n_kv, span, hd)
        n_kv = keys.shape[0]
        group = n_heads // n_kv
        q_chunk = q[start:stop].reshape(stop - start, n_kv, group, head_dim).transpose(1, 2, 0, 3)
        scores = q_chunk @ keys[:, None].swapaxes(-1, -2)             # (n_kv, group, t, span)
        scores *= np.float32(scale)
        key_pos = np.arange(first, span_end)[None, :]
        visible = (key_pos <= pos[:, None]) & (key_pos >= lowest[:, None])   # (t, span)
        scores = np.where(visible, scores, _NEG_INF)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        chunk_out = probs @ values[:, None]                           # (n_kv, group, t, hd)
        out[start:stop] = chunk_out.transpose(2, 0, 1, 3).reshape(stop - start, n_heads, head_dim)
    return out
