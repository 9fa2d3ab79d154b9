"""Causal attention of new queries over a request's keys and values (NumPy twin of the
CUDA attention kernels).

The backend gathers what each query reads, as the forward's plan says (model/plan.py),
and hands the kernels float32 key and value blocks; the kernels never build an index
or a mask of their own. A query at logical position p attends to logical positions
0..p (or the last `window` of them).
"""
import numpy as np

from tinyloop.backends.cpu.layout import canonical, canonical_blocks
from tinyloop.limits import ATTENTION_BLOCK
from tinyloop.model.plan import Geometry, TreeRows, build_plan

_NEG_INF = np.float32(-np.inf)


def attention_exact(q: np.ndarray, shared_keys, shared_values, tail_keys, tail_values, visible: np.ndarray,
                    scale: float) -> np.ndarray:
    """Row-invariant attention: a query's output does not depend on the other queries.

    q: (T, H, hd); shared_keys/values: (n_kv, n_shared, BLOCK, hd), the blocks every
    query reads; tail_keys/values: (n_kv, T, n_tail, BLOCK, hd) or None, each query's
    own blocks (a draft tree's path); visible: (T, n_shared + n_tail, BLOCK) bool.
    -> (T, H, hd) float32.

    Keys are reduced in fixed blocks of ATTENTION_BLOCK logical positions. Within a
    block every product is a matrix-vector product of fixed size (one per query and
    head) on blocks in the canonical layout (layout.py); masked keys get probability
    exactly 0; per-block sums are then added in block order (cumsum is strictly
    sequential). Blocks outside a query's own range add exact zeros, so one query
    computed alone gets the very same bits as in a batch that needs more blocks. A
    tree node's blocks hold exactly the keys a sequential decode of its path reads, in
    the same layout, so it gets the same bits too.
    """
    n_queries, n_heads, head_dim = q.shape
    n_kv, n_shared = shared_keys.shape[:2]
    group = n_heads // n_kv
    # (n_kv, 1, 1, n_shared, BLOCK, hd): blocks every query reads from the same rows
    key_blocks = [canonical_blocks(shared_keys)[:, None, None]]
    value_blocks = [canonical_blocks(shared_values)[:, None, None]]
    n_tail = 0 if tail_keys is None else tail_keys.shape[2]
    if n_tail:
        # (n_kv, 1, T, n_tail, BLOCK, hd): each query's own gathered blocks
        key_blocks.append(canonical_blocks(tail_keys)[:, None])
        value_blocks.append(canonical_blocks(tail_values)[:, None])

    # (n_kv, group, T, 1, 1, hd): one row vector per (kv head, group member, query)
    q_rows = canonical(q.reshape(n_queries, n_kv, group, head_dim).transpose(1, 2, 0, 3)
                       ).reshape(n_kv, group, n_queries, 1, 1, head_dim)
    scores = np.concatenate([q_rows @ kb.swapaxes(-1, -2) for kb in key_blocks], axis=3)
    scores *= np.float32(scale)                                       # (n_kv, group, T, n_blocks, 1, BLOCK)
    scores = np.where(visible[:, :, None, :], scores, _NEG_INF)
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


def attention_bulk(q: np.ndarray, chunks, read, scale: float) -> np.ndarray:
    """Fast causal attention with GEMMs, for the prompt's prefill (not row-invariant).

    q: (T, H, hd); chunks: the plan's BulkChunks; read(rows) -> (keys, values), each
    (n_kv, n_rows, hd) float32. -> (T, H, hd).
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
        chunk_out = probs @ values[:, None]                           # (n_kv, group, t, hd)
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
    plan = build_plan(positions, int(np.min(positions)), Geometry(padded, None, window), exact, tree)
    if not exact:
        return attention_bulk(q, plan.bulk, lambda r: (keys[:, r], values[:, r]), scale)
    a = plan.attention

    def blocks(side, which):
        n_kv, _, head_dim = side.shape
        return side.reshape(n_kv, padded // ATTENTION_BLOCK, ATTENTION_BLOCK, head_dim)[:, which]

    tail = [None, None]
    if a.n_tail:
        n_kv, head_dim = keys.shape[0], keys.shape[2]
        tail = [side[:, a.tail_rows].reshape(n_kv, len(plan.positions), a.n_tail, ATTENTION_BLOCK, head_dim)
                for side in (keys, values)]
    return attention_exact(q, blocks(keys, a.shared_blocks), blocks(values, a.shared_blocks), *tail,
                           a.visible, scale)
