"""Causal attention of new queries over a request's KV cache slot.

Cache layout per slot: keys and values (n_kv, S, hd), S a multiple of ATTENTION_BLOCK.
A query at position p attends to cache rows 0..p.
"""
import numpy as np

ATTENTION_BLOCK = 64
_NEG_INF = np.float32(-np.inf)


def attention_exact(q: np.ndarray, keys: np.ndarray, values: np.ndarray,
                    positions: np.ndarray, scale: float) -> np.ndarray:
    """Row-invariant attention: a query's output does not depend on the other queries.

    q: (T, H, hd); keys/values: (n_kv, S, hd); positions: (T,) int -> (T, H, hd).

    Keys are reduced in fixed blocks of ATTENTION_BLOCK absolute positions. Within a
    block every product is a matrix-vector product of fixed size (one per query and
    head); masked keys get probability exactly 0; per-block sums are then added in
    block order (cumsum is strictly sequential). Blocks past a query's own position
    add exact zeros, so one query computed alone, with fewer blocks, gets the very
    same bits as in a batch that needs more.
    """
    n_queries, n_heads, head_dim = q.shape
    n_kv = keys.shape[0]
    group = n_heads // n_kv
    n_blocks = int(positions.max()) // ATTENTION_BLOCK + 1
    span = n_blocks * ATTENTION_BLOCK
    key_blocks = keys[:, :span].reshape(n_kv, 1, 1, n_blocks, ATTENTION_BLOCK, head_dim)
    value_blocks = values[:, :span].reshape(n_kv, 1, 1, n_blocks, ATTENTION_BLOCK, head_dim)

    # (n_kv, group, T, 1, 1, hd): one row vector per (kv head, group member, query)
    q_rows = np.ascontiguousarray(
        q.reshape(n_queries, n_kv, group, head_dim).transpose(1, 2, 0, 3)
    ).reshape(n_kv, group, n_queries, 1, 1, head_dim)
    scores = q_rows @ key_blocks.swapaxes(-1, -2)        # (n_kv, group, T, n_blocks, 1, BLOCK)
    scores *= np.float32(scale)

    key_pos = np.arange(span).reshape(n_blocks, 1, ATTENTION_BLOCK)
    visible = key_pos[None] <= positions[:, None, None, None]          # (T, n_blocks, 1, BLOCK)
    scores = np.where(visible, scores, _NEG_INF)
    row_max = scores.max(axis=(3, 4, 5), keepdims=True)                 # (n_kv, group, T, 1, 1, 1)
    probs = np.exp(scores - row_max)                                    # masked -> exactly 0
    block_sums = probs.sum(axis=5)                                      # (n_kv, group, T, n_blocks, 1)
    block_out = probs @ value_blocks                                    # (n_kv, group, T, n_blocks, 1, hd)
    total = np.cumsum(block_sums, axis=3)[:, :, :, -1]                  # (n_kv, group, T, 1)
    out = np.cumsum(block_out, axis=3)[:, :, :, -1] / total[..., None]  # (n_kv, group, T, 1, hd)
    return np.ascontiguousarray(
        out.reshape(n_kv, group, n_queries, head_dim).transpose(2, 0, 1, 3)
    ).reshape(n_queries, n_heads, head_dim)


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
