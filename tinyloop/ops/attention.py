"""Causal attention of new queries over a request's KV cache slot.

Cache layout per slot: keys and values (n_kv, S, hd), S a multiple of ATTENTION_BLOCK.
A query at logical position p attends to logical positions 0..p. Without a tree,
logical position = cache row. With a draft tree (TreeRows), positions below
`tree.base` are still rows of the same number, and a node's positions from `base`
on are the rows of its own path (root, ..., itself), wherever the tree put them.
"""
from dataclasses import dataclass

import numpy as np

ATTENTION_BLOCK = 64
_NEG_INF = np.float32(-np.inf)


@dataclass
class TreeRows:
    """Where each query's path lives: logical base + j -> physical path_rows[t, j]."""
    base: int
    path_rows: np.ndarray          # (T, max_depth + 1) int; entries past a query's depth unused


def attention_exact(q: np.ndarray, keys: np.ndarray, values: np.ndarray,
                    positions: np.ndarray, scale: float, tree: TreeRows | None = None) -> np.ndarray:
    """Row-invariant attention: a query's output does not depend on the other queries.

    q: (T, H, hd); keys/values: (n_kv, S, hd); positions: (T,) logical -> (T, H, hd).

    Keys are reduced in fixed blocks of ATTENTION_BLOCK logical positions. Within a
    block every product is a matrix-vector product of fixed size (one per query and
    head); masked keys get probability exactly 0; per-block sums are then added in
    block order (cumsum is strictly sequential). Blocks past a query's own position
    add exact zeros, so one query computed alone, with fewer blocks, gets the very
    same bits as in a batch that needs more. A tree node's blocks are gathered into
    the same (BLOCK, hd) layout a sequential decode reads, so it gets the same bits too.
    """
    n_queries, n_heads, head_dim = q.shape
    n_kv = keys.shape[0]
    group = n_heads // n_kv
    n_blocks = int(positions.max()) // ATTENTION_BLOCK + 1
    n_shared = n_blocks if tree is None else min(tree.base // ATTENTION_BLOCK, n_blocks)
    shared = n_shared * ATTENTION_BLOCK
    # (n_kv, 1, 1, n_shared, BLOCK, hd): blocks every query reads from the same rows
    key_blocks = [keys[:, :shared].reshape(n_kv, 1, 1, n_shared, ATTENTION_BLOCK, head_dim)]
    value_blocks = [values[:, :shared].reshape(n_kv, 1, 1, n_shared, ATTENTION_BLOCK, head_dim)]
    if n_shared < n_blocks:
        rows = _tail_rows(tree, positions, shared, n_blocks * ATTENTION_BLOCK)   # (T, tail)
        n_tail = n_blocks - n_shared
        # (n_kv, 1, T, n_tail, BLOCK, hd): each query's own gathered blocks
        key_blocks.append(keys[:, rows].reshape(n_kv, 1, n_queries, n_tail, ATTENTION_BLOCK, head_dim))
        value_blocks.append(values[:, rows].reshape(n_kv, 1, n_queries, n_tail, ATTENTION_BLOCK, head_dim))

    # (n_kv, group, T, 1, 1, hd): one row vector per (kv head, group member, query)
    q_rows = np.ascontiguousarray(
        q.reshape(n_queries, n_kv, group, head_dim).transpose(1, 2, 0, 3)
    ).reshape(n_kv, group, n_queries, 1, 1, head_dim)
    scores = np.concatenate([q_rows @ kb.swapaxes(-1, -2) for kb in key_blocks], axis=3)
    scores *= np.float32(scale)                                       # (n_kv, group, T, n_blocks, 1, BLOCK)

    key_pos = np.arange(n_blocks * ATTENTION_BLOCK).reshape(n_blocks, 1, ATTENTION_BLOCK)
    visible = key_pos[None] <= positions[:, None, None, None]          # (T, n_blocks, 1, BLOCK)
    scores = np.where(visible, scores, _NEG_INF)
    row_max = scores.max(axis=(3, 4, 5), keepdims=True)                 # (n_kv, group, T, 1, 1, 1)
    probs = np.exp(scores - row_max)                                    # masked -> exactly 0
    block_sums = probs.sum(axis=5)                                      # (n_kv, group, T, n_blocks, 1)
    block_out = np.concatenate(                                         # (n_kv, group, T, n_blocks, 1, hd)
        [probs[:, :, :, :n_shared] @ value_blocks[0]]
        + ([probs[:, :, :, n_shared:] @ value_blocks[1]] if len(value_blocks) > 1 else []), axis=3)
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


def attention_bulk(q: np.ndarray, keys: np.ndarray, values: np.ndarray,
                   positions: np.ndarray, scale: float, chunk: int = 256) -> np.ndarray:
    """Fast causal attention with GEMMs, for the prompt's prefill. Same shapes as above.

    Queries are processed `chunk` at a time so the score matrix stays small.
    """
    n_queries, n_heads, head_dim = q.shape
    n_kv = keys.shape[0]
    group = n_heads // n_kv
    out = np.empty_like(q)
    for start in range(0, n_queries, chunk):
        stop = min(start + chunk, n_queries)
        pos = positions[start:stop]
        span = int(pos.max()) + 1
        q_chunk = q[start:stop].reshape(stop - start, n_kv, group, head_dim).transpose(1, 2, 0, 3)
        scores = q_chunk @ keys[:, None, :span].swapaxes(-1, -2)      # (n_kv, group, t, span)
        scores *= np.float32(scale)
        visible = np.arange(span)[None, :] <= pos[:, None]            # (t, span)
        scores = np.where(visible, scores, _NEG_INF)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        chunk_out = probs @ values[:, None, :span]                    # (n_kv, group, t, hd)
        out[start:stop] = chunk_out.transpose(2, 0, 1, 3).reshape(stop - start, n_heads, head_dim)
    return out
