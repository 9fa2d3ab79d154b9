"""Twin of cuda/attention.cu: exact attention over the stored KV cache, float32 op for op.

Vectorised over queries, kv heads and query heads. The kernel splits each query's blocks
into fixed chunks: chunk c is the absolute logical blocks [c S, (c + 1) S), S =
CHUNK_BLOCKS, clipped to the query's own range first = lowest // 64 .. last = pos // 64.
The twin loops over absolute chunks and, inside each, over absolute blocks; a query whose
own range does not hold a block keeps its chunk state unchanged (the kernel never visits
that block for it), and a chunk outside its range first // S .. last // S is never merged.

Per query head, as the kernel's header comment says:
    q' = (int4-h: fwht(q) * norm) * scale
    per chunk (pass 1), from m = -inf, acc = 0, and per block of it in increasing order:
        s_j = dot(q', k_j): four running sums over d = r, r + 4, ... from +0, then
              (c0 + c1) + (c2 + c3); masked keys -inf
        bm = max_j s_j; bm = -inf leaves the state unchanged
        m' = max(m, bm); corr = exp(m - m'); p_j = exp(s_j - m')
        acc[d] = acc[d] * corr + tree_j(p_j v_j[d]), and l the same with v = 1;
              masked terms exactly +0; tree = adjacent pairwise sum over 64 keys
    merge (pass 2), from M = -inf, A = 0, per chunk in increasing order, skipping m = -inf:
        M' = max(M, m); a = exp(M - M'); b = exp(m - M')
        A[d] = A[d] * a + acc[d] * b, and L the same with l; M = M'
    out = A / L, then (int4-h) fwht(out) * norm
"""
from __future__ import annotations

import numpy as np

from tinyloop.backends.reference.kvstore import IntStore
from tinyloop.backends.reference.twins.arith import exp_f32
from tinyloop.backends.reference.twins.kv import fwht
from tinyloop.kv.modes import CODE_BITS
from tinyloop.limits import ATTENTION_BLOCK as BLOCK
from tinyloop.model.quant import unpack_codes

F = np.float32
NO_TREE = 1 << 30                 # shared_end without a draft tree
CHUNK_BLOCKS = 1                  # S: 64-key blocks per chunk (cuda/attention.cu ATT_CHUNK_BLOCKS)


def dequantize(mode: str, side: dict, rows: np.ndarray) -> np.ndarray:
    """Stored pool rows (an int array of any shape) of one side ((n_kv, rows, ...) arrays) ->
    (n_kv, *rows.shape, hd) float32."""
    if mode in ("fp16", "fp32"):
        return side["data"][:, rows].astype(F)
    bits = CODE_BITS[mode]
    packed = side["codes"][:, rows]                                         # (n_kv, *rows.shape, bytes)
    lead = packed.shape[:-1]
    codes = unpack_codes(packed.reshape(-1, packed.shape[-1]), bits).reshape(*lead, -1)
    # code * scale + min: float32 multiply, then add (IntStore.dequantize)
    return IntStore(bits).dequantize(codes, side["scale"][:, rows], side["min"][:, rows])


def dot4(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """q, k broadcastable (..., hd) -> (...): the kernel's att_dot."""
    products = q * k
    head_dim = products.shape[-1]
    pad = -head_dim % 4
    if pad:                        # missing lanes add +0: a sum that starts at +0 is never -0
        products = np.concatenate([products, np.zeros(products.shape[:-1] + (pad,), F)], axis=-1)
    c = np.zeros(products.shape[:-1] + (4,), F)
    for i in range(0, head_dim + pad, 4):
        c = c + products[..., i:i + 4]
    return (c[..., 0] + c[..., 1]) + (c[..., 2] + c[..., 3])


def tree_sum(x: np.ndarray, axis: int) -> np.ndarray:
    """Adjacent pairwise sum over `axis` (a power-of-two length): ((x0 + x1) + (x2 + x3)) + ..."""
    x = np.moveaxis(x, axis, 0)
    while x.shape[0] > 1:
        x = x[0::2] + x[1::2]
    return x[0]


def attention(mode: str, q: np.ndarray, keys: dict, values: dict, blocks, positions, window: int = 0,
              ring_blocks: int = 0, shared_end: int = NO_TREE, tail_rows=None, scale: float = 1.0) -> np.ndarray:
    """Host twin of attention_<mode>. q: (T, H, hd) float32; keys, values: the side dicts of the
    pool's stored arrays (n_kv, rows, ...); blocks: the slot's block table row (physical row r
    is pool row blocks[r // 64] * 64 + r % 64), or (T, W) each query's own (several caches in
    one launch: per_token_tables); positions (T,); tail_rows (T, tail_len)
    physical rows or None. -> (T, H, hd) float32."""
    n_queries, n_heads, head_dim = q.shape
    n_kv = next(iter(keys.values())).shape[0]
    blocks = np.asarray(blocks, np.int64)
    group = n_heads // n_kv
    pos = np.asarray(positions, np.int64)
    lowest = np.maximum(pos - window + 1, 0) if window else np.zeros_like(pos)
    first, last = lowest // BLOCK, pos // BLOCK

    qg = np.asarray(q, F).reshape(n_queries, n_kv, group, head_dim)
    if mode == "int4-h":
        qg = fwht(qg)
    qg = qg * F(scale)
    chunk_first, chunk_last = first // CHUNK_BLOCKS, last // CHUNK_BLOCKS
    merged = np.zeros((n_queries, n_kv, group, head_dim + 1), F)           # A, then L
    merged_max = np.full((n_queries, n_kv, group), -np.inf, F)
    j = np.arange(BLOCK)
    with np.errstate(invalid="ignore", over="ignore"):
        for c in range(int(chunk_first.min()), int(chunk_last.max()) + 1):
            # pass 1: this chunk's partial (acc, l, m) for every query
            acc = np.zeros((n_queries, n_kv, group, head_dim + 1), F)      # value sums, then l
            m = np.full((n_queries, n_kv, group), -np.inf, F)
            for b in range(max(c * CHUNK_BLOCKS, int(first.min())), min((c + 1) * CHUNK_BLOCKS, int(last.max()) + 1)):
                k = b * BLOCK + j
                visible = (k >= lowest[:, None]) & (k <= pos[:, None]) & ((first <= b) & (b <= last))[:, None]
                if tail_rows is not None and b >= shared_end:
                    index = (b - shared_end) * BLOCK + j
                    tail = np.asarray(tail_rows)
                    rows = np.where(index < tail.shape[1], tail[:, np.minimum(index, tail.shape[1] - 1)], 0)
                else:
                    rows = np.broadcast_to((b % ring_blocks if ring_blocks else b) * BLOCK + j, (n_queries, BLOCK))
                rows = np.where(visible, rows, 0)                           # (T, 64); masked: never used
                table = (np.take_along_axis(blocks, rows // BLOCK, axis=1) if blocks.ndim == 2
                         else blocks[rows // BLOCK])
                rows = table * BLOCK + rows % BLOCK                         # pool rows
                key_block = dequantize(mode, keys, rows).transpose(1, 0, 2, 3)              # (T, n_kv, 64, hd)
                value_block = dequantize(mode, values, rows).transpose(1, 0, 2, 3)
                mask = visible[:, None, None, :]                            # (T, 1, 1, 64)
                scores = np.where(mask, dot4(qg[:, :, :, None, :], key_block[:, :, None]), F(-np.inf))
                block_max = np.fmax.reduce(scores, axis=-1)                 # (T, n_kv, G)
                empty = block_max == -np.inf
                m_new = np.fmax(m, block_max)
                corr = exp_f32(m - m_new)
                p = exp_f32(scores - m_new[..., None])                      # (T, n_kv, G, 64)
                terms = np.concatenate([p[..., None] * value_block[:, :, None], p[..., None]], axis=-1)
                terms = np.where(mask[..., None], terms, F(0))              # (T, n_kv, G, 64, hd + 1)
                updated = acc * corr[..., None] + tree_sum(terms, axis=-2)
                acc = np.where(empty[..., None], acc, updated)
                m = np.where(empty, m, m_new)
            # pass 2: merge the chunk into the queries that have it, unless it is empty
            has = ((chunk_first <= c) & (c <= chunk_last))[:, None, None]  # (T, 1, 1)
            skip = ~has | (m == -np.inf)
            m_new = np.fmax(merged_max, m)
            corr_old = exp_f32(merged_max - m_new)[..., None]
            corr_new = exp_f32(m - m_new)[..., None]
            merged = np.where(skip[..., None], merged, merged * corr_old + acc * corr_new)
            merged_max = np.where(skip, merged_max, m_new)
    with np.errstate(invalid="ignore", divide="ignore"):     # a query that sees no finite score: 0 / 0
        out = merged[..., :head_dim] / merged[..., head_dim:]
    if mode == "int4-h":
        out = fwht(out)
    return out.reshape(n_queries, n_heads, head_dim).astype(F)
