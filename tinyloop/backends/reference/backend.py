"""The CPU backend: NumPy kernels behind the Backend interface (backends/base.py).

Weights are dequantized once at load into float32 (in, out) matrices, fused where one
product serves several projections (q|k|v, gate|up): a row-vector product against an
(in, out) matrix is what OpenBLAS does fastest. The KV cache keeps its mode's values
(kvstore.py) and attention reads 64-row blocks of it in place.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinyloop.backends.base import Backend, check_activations
from tinyloop.backends.reference.activations import gelu_tanh, swiglu
from tinyloop.backends.reference.attention import attention_bulk, attention_exact
from tinyloop.backends.reference.kvstore import KVStorage, PoolStorage, bytes_per_row
from tinyloop.backends.reference.linear import linear
from tinyloop.backends.reference.norms import layer_norm, rms_norm
from tinyloop.backends.reference.positions import apply_rope, rope_table
from tinyloop.backends.reference.topk import log_normalizer, top_k_ids
from tinyloop.limits import ATTENTION_BLOCK
from tinyloop.model.quant import QuantizedTensor, dequantize


@dataclass
class DenseLinear:
    weight: np.ndarray              # (in, out) float32, C-contiguous
    bias: np.ndarray | None         # (out,) float32


def as_float32(value) -> np.ndarray:
    if isinstance(value, QuantizedTensor):
        return dequantize(value, np.float32)
    return np.asarray(value, dtype=np.float32)


class NumpyBackend(Backend):
    name = "cpu"
    xp = np
    # one generation at a time by default: the exact path is one BLAS gemv per row, so
    # rows that share a step share no reading of the weights (nothing to gain from batching)
    default_max_running = 1

    def __init__(self, description: str = "cpu", activations: str = "fp32"):
        self.description = description
        self.activations = check_activations(activations)

    # -- memory ------------------------------------------------------------------------------
    def asarray(self, host, dtype=None):
        return np.asarray(host, dtype=dtype)

    def to_host(self, array) -> np.ndarray:
        return array

    # -- weights -------------------------------------------------------------------------------
    def prepare_linear(self, parts, bias=None) -> DenseLinear:
        fused = np.concatenate([as_float32(p) for p in parts], axis=0)          # (out, in)
        return DenseLinear(np.ascontiguousarray(fused.T),
                           None if bias is None else np.asarray(bias, np.float32))

    def prepare_vector(self, host):
        return None if host is None else np.asarray(host, np.float32)

    def prepare_embedding(self, table):
        return np.ascontiguousarray(as_float32(table))

    def rope_table(self, max_positions, inv_freq):
        return rope_table(max_positions, inv_freq)

    # -- per forward ---------------------------------------------------------------------------
    def rope_rows(self, table, plan):
        return table[plan.positions]

    def embed(self, table, ids):
        return table[np.asarray(ids)]

    def linear(self, x, weight: DenseLinear, exact: bool, residual=None):
        if x.dtype == np.float16:                   # fp16 activations: widened exactly
            x = x.astype(np.float32)
        out = linear(x, weight.weight, weight.bias, exact)
        return out if residual is None else residual + out

    def _linear_input(self, x, feeds_linear: bool = True):
        """x rounded to half (to nearest, ties to even) when it feeds a linear under fp16 activations."""
        return x.astype(np.float16) if feeds_linear and self.activations == "fp16" else x

    def rms_norm(self, x, weight, eps, feeds_linear=False):
        return self._linear_input(rms_norm(x, weight, eps), feeds_linear)

    def layer_norm(self, x, weight, bias, eps, feeds_linear=False):
        return self._linear_input(layer_norm(x, weight, bias, eps), feeds_linear)

    def rope(self, x, plan):
        return apply_rope(x, plan.rotation)

    def swiglu(self, up, ffn_dim):
        return self._linear_input(swiglu(up, ffn_dim))

    def gelu(self, x):
        return self._linear_input(gelu_tanh(x))

    # -- the KV cache --------------------------------------------------------------------------
    def kv_pool(self, mode, n_kv, rows, head_dim) -> PoolStorage:
        return PoolStorage(mode, n_kv, rows, head_dim)

    def kv_init_blocks(self, pool_storage: PoolStorage, blocks) -> None:
        pool_storage.init_blocks(blocks)

    def kv_view(self, pool_storage: PoolStorage, table) -> KVStorage:
        return KVStorage(pool_storage, table)

    def kv_bytes_per_row(self, mode, n_kv, head_dim) -> int:
        return bytes_per_row(mode, n_kv, head_dim)

    def kv_write(self, storage: KVStorage, slot, plan, keys, values, rope=False):
        self._refuse_fused_rope(rope)
        if storage.rotation is not None:
            keys, values = _rotate(keys, storage.rotation), _rotate(values, storage.rotation)
        rows = storage.pool_rows(slot, plan.write_rows)
        storage.key_store.store(storage.keys, rows, keys)
        storage.value_store.store(storage.values, rows, values)

    def attention(self, q, storage: KVStorage, slot, plan, scale, rope=False):
        self._refuse_fused_rope(rope)
        sides = ((storage.key_store, storage.keys), (storage.value_store, storage.values))
        if storage.rotation is not None:
            q = _rotate(q, storage.rotation)
        if plan.exact:
            a = plan.attention
            tails = [None, None]
            if a.n_tail:
                rows = storage.pool_rows(slot, a.tail_rows)
                tails = [store.rows(arrays, rows).reshape(
                    storage.n_kv, plan.n_tokens, a.n_tail, ATTENTION_BLOCK, -1) for store, arrays in sides]
            blocks = storage.pool_blocks(slot, a.shared_blocks)
            shared = [store.blocks(arrays, blocks) for store, arrays in sides]
            out = attention_exact(q, *shared, *tails, a.mask, scale)
        else:
            out = attention_bulk(q, plan.bulk, lambda rows: [store.rows(arrays, storage.pool_rows(slot, rows))
                                                             for store, arrays in sides], scale)
        return out if storage.rotation is None else _rotate(out, storage.rotation.T)

    def kv_copy_rows(self, storage: KVStorage, source, target):
        slots = np.arange(storage.n_slots)[:, None]
        source, target = storage.pool_rows(slots, source), storage.pool_rows(slots, target)   # (n_slots, n)
        for array in storage.pool.arrays():
            array[:, target] = array[:, source]

    def kv_stored(self, storage: KVStorage, rows) -> dict:
        rows = storage.pool_rows(np.arange(storage.n_slots)[:, None], rows)                  # (n_slots, n)
        out = {}
        for side, arrays in (("keys", storage.keys), ("values", storage.values)):
            for name, array in arrays.items():
                if name != "blocks":
                    out[f"{side}.{name}"] = array[:, rows].transpose(1, 0, 2, 3)           # (n_slots, n_kv, n, ..)
        return out

    # -- sampling support ----------------------------------------------------------------------
    def argmax(self, logits) -> np.ndarray:
        return np.argmax(logits, axis=-1)

    def top_k(self, logits, k):
        rows = [np.asarray(row, np.float64) for row in logits]
        ids = np.stack([top_k_ids(row, k)[:k] for row in rows])
        values = np.stack([row[i] for row, i in zip(rows, ids)])
        return ids, values, np.array([log_normalizer(row) for row in rows])


def _rotate(x, matrix):
    """x: (T, heads, hd) -> x @ matrix per head, one row product at a time (row-invariant)."""
    n, heads, head_dim = x.shape
    rows = np.ascontiguousarray(x).reshape(n * heads, 1, head_dim)
    return (rows @ matrix).reshape(n, heads, head_dim)
