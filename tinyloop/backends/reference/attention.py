"""Causal attention of new queries over a request's keys and values (NumPy twin of the
CUDA attention kernels).

The backend gathers what each query reads, as the forward's plan says (model/plan.py),
and hands the kernels float32 key and value blocks; the kernels never build an index
or a mask of their own. A query at logical position p attends to logical positions
0..p (or the last `window` of them).
"""
import math

import numpy as np

from tinyloop.backends.reference.layout import canonical, canonical_blocks
from tinyloop.limits import ATTENTION_BLOCK
from tinyloop.model.plan import Geometry, TreeRows, build_plan

_NEG_INF = np.float32(-np.inf)


def attention_exact(q: np.ndarray, shared_keys, shared_values, tail_keys, tail_values, mask,
                    scale: float) -> np.ndarray:
    """Row-invariant attention: a query's output does not depend on the other queries.

    q: (T, H, hd); shared_keys: (n_kv, n_shared, BLOCK, hd) and shared_values:
    (n_kv, n_shared, BLOCK, hd + 1), the blocks every query reads, values with a column
    of ones after hd (so the product also sums each block's probabilities);
    tail_keys/values: (n_kv, T, n_tail, BLOCK, hd [+ 1]) or None, each query's own
    blocks (a draft tree's path); mask: the plan's BlockMask (which keys each query
    must not see, for the blocks that hold any). -> (T, H, hd) float32.

    Keys are reduced in fixed blocks of ATTENTION_BLOCK logical positions. Within a
    block every product is one fixed-shape matrix product per (KV head, query, block):
    the group of query heads sharing the KV head, (group, hd) @ (hd, BLOCK) for the
    scores and (group, BLOCK) @ (BLOCK, hd) for probability . value, on blocks in the
    canonical layout (layout.py). Masked keys get probability exactly 0. Per-block
    results (value sums with the probability sums beside them) are then added in block
    order, a sequential sum, so blocks outside a query's own range, which hold exact
    zeros, change nothing: one query computed alone gets the very same bits as in a
    batch that needs more blocks. A tree node's blocks hold exactly the keys a
    sequential decode of its path reads, in the same layout, so it gets the same bits.
    """
    n_queries, n_heads, head_dim = q.shape
    n_kv, n_shared = shared_keys.shape[:2]
    group = n_heads // n_kv
    # (n_kv, 1, n_shared, BLOCK, hd): blocks every query reads from the same rows
    key_blocks = [canonical_blocks(shared_keys)[:, None]]
    value_blocks = [canonical_blocks(shared_values)[:, None]]
    n_tail = 0 if tail_keys is None else tail_keys.shape[2]
    if n_tail:
        # (n_kv, T, n_tail, BLOCK, hd): each query's own gathered blocks
        key_blocks.append(canonical_blocks(tail_keys))
        value_blocks.append(canonical_blocks(tail_values))

    # (n_kv, T, 1, group, hd): one (group, hd) matrix per (kv head, query), scaled once
    q_groups = canonical(np.multiply(q.reshape(n_queries, n_kv, group, head_dim).transpose(1, 0, 2, 3),
                                     np.float32(scale)))[:, :, None]
    scores = [q_groups @ kb.swapaxes(-1, -2) for kb in key_blocks]     # (n_kv, T, blocks, group, BLOCK)
    scores = scores[0] if len(scores) == 1 else np.concatenate(scores, axis=2)
    if isinstance(mask.blocks, slice):              # fully visible blocks need no mask
        np.copyto(scores[:, :, mask.blocks], _NEG_INF, where=mask.hidden)
    elif mask.blocks.size:
        scores[:, :, mask.blocks] = np.where(mask.hidden, _NEG_INF, scores[:, :, mask.blocks])
    # (n_kv, T, 1, group, 1); max is exact, so how it is taken only changes the speed
    row_max = scores.max(axis=4, keepdims=True)
    if scores.shape[2] > 1:
        row_max = row_max.max(axis=2, keepdims=True)
    scores -= row_max
    probs = np.exp(scores, scores)                                      # masked -> exactly 0
    # (n_kv, T, n_blocks, group, hd + 1): each block's probability . value, and its probability sum
    if n_tail:
        per_block = np.empty(probs.shape[:4] + (head_dim + 1,), np.float32)
        np.matmul(probs[:, :, :n_shared], value_blocks[0], out=per_block[:, :, :n_shared])
        np.matmul(probs[:, :, n_shared:], value_blocks[1], out=per_block[:, :, n_shared:])
    else:
        per_block = probs @ value_blocks[0]
    # (n_kv, T, group, hd + 1); a sum of one block is that block
    totals = per_block[:, :, 0] if per_block.shape[2] == 1 else sequential_sum(per_block, axis=2)
    out = totals[..., :head_dim] / totals[..., head_dim:]               # (n_kv, T, group, hd)
    return out.transpose(1, 0, 2, 3).reshape(n_queries, n_heads, head_dim)     # a copy unless T = 1


def sequential_sum(x: np.ndarray, axis: int) -> np.ndarray:
    """Sum over `axis` strictly in index order: ((x0 + x1) + x2) + ...

    NumPy reduces an axis that is not the innermost one by adding whole inner rows in
    index order; only an innermost reduction is summed pairwise. So x is made C-contiguous
    and must have more than one element after `axis`, which then cannot become the
    innermost (tests/test_layout_invariance.py pins this)."""
    if math.prod(x.shape[axis + 1:]) < 2:
        raise ValueError("sequential_sum needs more than one element after the summed axis")
    return np.add.reduce(np.ascontiguousarray(x), axis=axis)


def attention_bulk(q: np.ndarray, chunks, read, scale: float) -> np.ndarray:
    """Fast causal attention with GEMMs, for the prompt's prefill (not row-invariant).

    q: (T, H, hd); chunks: the plan's BulkChunks; read(rows) -> (keys, values), each
    (n_kv, n_rows, hd) float32 (values may carry more columns; the first hd are used).
    -> (T, H, hd).
    """
    n_queries, n_heads, head_dim = q.shape
    out = np.empty_like(q)
    for chunk in chunks:
        keys, values = read(chunk.rows)                               # (n_kv, span, hd)
        n_kv = keys.shape[0]
        group = n_heads // n_kv
        t = chunk.stop - chunk.start
        q_chunk = q[chunk.start:chunk.stop].reshape(t, n_kv, group, head_dim).transpose(1, 2, 0, 3)
        scores = q_chunk @ keys[:, None].swapaxes(-1, -2)             # (n_kv, group, t, span)
        scores *= np.float32(scale)
        scores = np.where(chunk.visible, scores, _NEG_INF)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        chunk_out = probs @ values[:, None, :, :head_dim]             # (n_kv, group, t, hd)
        out[chunk.start:chunk.stop] = chunk_out.transpose(2, 0, 1, 3).reshape(t, n_heads, head_dim)
    return out


def attention_over(q: np.ndarray, keys: np.ndarray, values: np.ndarray, positions, scale: float,
                   tree: TreeRows | None = None, window: int = 0, exact: bool = True) -> np.ndarray:
    """Attention over plain (n_kv, rows, hd) key and value arrays in any memory layout,
    physical row = virtual row: the kernels' reference form, for tests and tools."""
    rows = keys.shape[1]
    padded = -(-rows // ATTENTION_BLOCK) * ATTENTION_BLOCK
    if padded != rows:
        grow = ((0, 0), (0, padded - rows), (0, 0))
        keys, values = np.pad(keys, grow), np.pad(values, grow)
    values = np.concatenate([values, np.ones(values.shape[:2] + (1,), np.float32)], axis=-1)   # (n_kv, rows, hd + 1)
    plan = build_plan(positions, int(np.min(positions)), Geometry(padded, None, window), exact, tree)
    if not exact:
        return attention_bulk(q, plan.bulk, lambda r: (keys[:, r], values[:, r]), scale)
    a = plan.attention

    def blocks(side, which):
        n_kv, _, head_dim = side.shape
        return side.reshape(n_kv, padded // ATTENTION_BLOCK, ATTENTION_BLOCK, head_dim)[:, which]

    tail = [None, None]
    if a.n_tail:
        tail = [side[:, a.tail_rows].reshape(keys.shape[0], len(plan.positions), a.n_tail, ATTENTION_BLOCK, -1)
                for side in (keys, values)]
    return attention_exact(q, blocks(keys, a.shared_blocks), blocks(values, a.shared_blocks), *tail,
                           a.mask, scale)
