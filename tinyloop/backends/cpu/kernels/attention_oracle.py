"""The oracle of kernels/attention.py and kernels/rotation.py, written from the definition in
attention.py's docstring with NumPy elementwise float32 operations: vectorised across
queries, kv heads and query heads, with explicit Python loops over every reduced axis in
the defined order (never np.sum, np.dot, matmul or a reduction NumPy may reorder). The
tests compare the kernels with it bit for bit; nothing here runs on the product's path.

It reads the stored arrays as the kernel does (fp32 `data`, fp16 half bits `data`, int modes
packed `codes` with float16 `scale` and `min`), its own way: a query's keys are gathered by
logical position (the shared blocks, a ring's modulo, a draft tree's per-query rows).
"""
from __future__ import annotations

import numpy as np

from tinyloop.backends.cpu.kernels.fmath_oracle import exp_f32

F = np.float32
BLOCK = 64
CHUNK = 4                       # blocks per chunk
LANES = 16
NO_TREE = 1 << 62
NEG_INF = F(-np.inf)


def fwht(x: np.ndarray) -> np.ndarray:
    """(..., hd) float32: stages h = 1, 2, 4, ...: (x[j], x[j + h]) -> (a + b, a - b) for j & h == 0,
    then times float32(1 / sqrt(hd))."""
    y = np.array(x, F)
    head_dim = y.shape[-1]
    h = 1
    while h < head_dim:
        j = np.array([i for i in range(head_dim) if not i & h])
        a, b = y[..., j].copy(), y[..., j + h].copy()
        y[..., j] = a + b
        y[..., j + h] = a - b
        h *= 2
    return (y * F(1.0 / np.sqrt(head_dim))).astype(F)


def _dequantized(mode_bits: int, side: dict, rows: np.ndarray, head_dim: int) -> np.ndarray:
    """Stored pool rows (T, 64) of one side ((n_kv, rows, ...) arrays) -> (T, n_kv, 64, hd) float32."""
    if mode_bits == 0:
        return side["data"][:, rows, :head_dim].transpose(1, 0, 2, 3).astype(F)
    if mode_bits == 16:                                                    # half bits: widened exactly
        return side["data"][:, rows].view(np.float16).transpose(1, 0, 2, 3).astype(F)
    packed = side["codes"][:, rows]                                        # (n_kv, T, 64, bytes)
    if mode_bits == 8:
        codes = packed
    else:                                                                  # low nibble first
        codes = np.stack([packed & 15, packed >> 4], axis=-1).reshape(packed.shape[:-1] + (head_dim,))
    groups = side["scale"].shape[-1]
    g = head_dim // groups
    scale = np.repeat(side["scale"][:, rows].astype(F), g, axis=-1)       # f16 -> f32 is exact
    low = np.repeat(side["min"][:, rows].astype(F), g, axis=-1)
    return (codes.astype(F) * scale + low).transpose(1, 0, 2, 3)


def _tree(lanes: np.ndarray) -> np.ndarray:
    """(..., 16) -> (...): widths 8, 4, 2, 1, lane i taking lane i + width."""
    x = np.array(lanes, F)
    for width in (8, 4, 2, 1):
        x[..., :width] = x[..., :width] + x[..., width:2 * width]
    return x[..., 0]


def _scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """q (T, n_kv, G, hd), k (T, n_kv, 64, hd) -> (T, n_kv, G, 64): 16 lanes from +0, lane i
    adding the products of d = i, i + 16, ... in order, then the tree."""
    head_dim = q.shape[-1]
    acc = np.zeros(q.shape[:3] + (BLOCK, LANES), F)
    for d0 in range(0, head_dim, LANES):
        width = min(LANES, head_dim - d0)
        acc[..., :width] = acc[..., :width] + q[:, :, :, None, d0:d0 + width] * k[:, :, None, :, d0:d0 + width]
    return _tree(acc)


def attention(mode: str, q, keys: dict, values: dict, table_row, positions, window: int = 0, ring_blocks: int = 0,
              shared_end: int = NO_TREE, tail_rows=None, scale: float = 1.0) -> np.ndarray:
    """q (T, H, hd) over the stored sides of one slot -> (T, H, hd) float32, the kernel's definition.
    The slot's physical row r is pool row table_row[r // 64] * 64 + r % 64 (its block table row)."""
    bits = {"fp32": 0, "fp16": 16, "int8": 8, "int4": 4, "int4-h": 4}[mode]
    q = np.asarray(q, F)
    n_queries, n_heads, head_dim = q.shape
    n_kv = next(iter(keys.values())).shape[0]
    group = n_heads // n_kv
    pos = np.asarray(positions, np.int64)
    lowest = np.maximum(pos - window + 1, 0) if window else np.zeros_like(pos)
    qg = q.reshape(n_queries, n_kv, group, head_dim)
    if mode == "int4-h":
        qg = fwht(qg)
    qg = (qg * F(scale)).astype(F)
    first_chunk, last_chunk = lowest // BLOCK // CHUNK, pos // BLOCK // CHUNK
    big_m = np.full((n_queries, n_kv, group), NEG_INF, F)
    big_l = np.zeros((n_queries, n_kv, group), F)
    big_a = np.zeros((n_queries, n_kv, group, head_dim), F)
    j = np.arange(BLOCK)
    with np.errstate(all="ignore"):
        for c in range(int(first_chunk.min()), int(last_chunk.max()) + 1):
            m = np.full((n_queries, n_kv, group), NEG_INF, F)
            l_sum = np.zeros((n_queries, n_kv, group), F)
            acc = np.zeros((n_queries, n_kv, group, head_dim), F)
            for b in range(c * CHUNK, (c + 1) * CHUNK):
                key = b * BLOCK + j                                               # logical positions
                vis = (key[None] >= lowest[:, None]) & (key[None] <= pos[:, None])   # (T, 64)
                if not vis.any():
                    continue
                if b >= shared_end and tail_rows is not None:
                    index = np.clip((b - shared_end) * BLOCK + j, 0, np.asarray(tail_rows).shape[1] - 1)
                    rows = np.asarray(tail_rows)[:, index]
                else:
                    rows = np.broadcast_to((b % ring_blocks if ring_blocks else b) * BLOCK + j, (n_queries, BLOCK))
                rows = np.where(vis, rows, 0)                # a masked key's row is never used
                rows = np.asarray(table_row)[rows // BLOCK].astype(np.int64) * BLOCK + rows % BLOCK
                k = _dequantized(bits, keys, rows, head_dim)
                v = _dequantized(bits, values, rows, head_dim)
                s = np.where(vis[:, None, None, :], _scores(qg, k), NEG_INF)      # (T, n_kv, G, 64)
                lane = s[..., :LANES]
                for j0 in range(LANES, BLOCK, LANES):
                    x = s[..., j0:j0 + LANES]
                    lane = np.where(x > lane, x, lane)
                bm = lane[..., 0]
                for i in range(1, LANES):
                    bm = np.where(lane[..., i] > bm, lane[..., i], bm)
                skip = bm == NEG_INF
                m_new = np.where(bm > m, bm, m)
                alpha = exp_f32(m - m_new)
                p = np.where(skip[..., None], F(0), exp_f32(s - m_new[..., None]))
                lane = p[..., :LANES]
                for j0 in range(LANES, BLOCK, LANES):
                    lane = lane + p[..., j0:j0 + LANES]
                block_l = _tree(lane)
                block_acc = np.zeros(acc.shape, F)
                for jj in range(BLOCK):
                    pj = p[..., jj, None]                                         # (T, n_kv, G, 1)
                    term = np.where(pj != 0, pj * v[:, :, None, jj, :], F(0))
                    block_acc = block_acc + term
                l_sum = np.where(skip, l_sum, l_sum * alpha + block_l)
                acc = np.where(skip[..., None], acc, acc * alpha[..., None] + block_acc)
                m = np.where(skip, m, m_new)
            merge = (m != NEG_INF) & ((first_chunk <= c) & (c <= last_chunk))[:, None, None]
            m_new = np.where(m > big_m, m, big_m)
            a = exp_f32(big_m - m_new)
            b_ = exp_f32(m - m_new)
            big_a = np.where(merge[..., None], big_a * a[..., None] + acc * b_[..., None], big_a)
            big_l = np.where(merge, big_l * a + l_sum * b_, big_l)
            big_m = np.where(merge, m_new, big_m)
        out = big_a / big_l[..., None]
    if mode == "int4-h":
        out = fwht(out)
    return out.reshape(n_queries, n_heads, head_dim).astype(F)
