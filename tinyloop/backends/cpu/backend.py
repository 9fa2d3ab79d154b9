"""The CPU backend (the default; TINYLOOP_CPU_KERNELS=numba): our own compiled kernels behind
the Backend interface (backends/base.py). It is the NumPy reference backend (backends/reference/backend.py)
with every product, reduction and elementwise kernel replaced; memory, the KV storage's
arrays, row copies and reads are the same.

Linear weights stay as the file stores them (packed codes with float32 scales, or float
weights), re-laid once into 16-output tiles and multiplied by our own compiled kernels
(linear.py, kernels/), fused where one product serves several projections (q|k|v,
gate|up). The KV cache keeps its mode's values (kvstore.py) and attention reads it in place.
"""
from __future__ import annotations

import numpy as np

from tinyloop.backends.reference.backend import NumpyBackend
from tinyloop.backends.cpu.activations import gelu_tanh, swiglu
from tinyloop.backends.cpu.attention import attention as attend_plan
from tinyloop.backends.cpu.attention import attention_parts as attend_parts
from tinyloop.backends.cpu.kvstore import KVStorage, PoolStorage, bytes_per_row, kv_write, kv_write_many
from tinyloop.backends.cpu.embedding import embed, prepare_embedding
from tinyloop.backends.cpu.linear import PackedLinear, linear, prepare_linear
from tinyloop.backends.cpu.norms import layer_norm, rms_norm
from tinyloop.backends.cpu.positions import apply_rope, rope_table
from tinyloop.backends.cpu.topk import log_normalizer, top_k_ids
from tinyloop.backends.cpu.kernels import on_a_passing_thread
from tinyloop.backends.cpu.kernels import rows as row_kernels


_WARM = []


def warm_up_kernels() -> None:
    """Every row and attention kernel the backend calls, once per process (the linear kernels
    are warmed per weight kind as the weights are prepared: linear.py)."""
    if not _WARM:
        from tinyloop.backends.cpu.kernels import attention as attention_kernels

        def warm_up():
            row_kernels.warm_up()
            attention_kernels.warm_up()
        on_a_passing_thread(warm_up)
        _WARM.append(True)


def _one_pool(parts) -> bool:
    """Whether every part's cache lives in one KV pool (the engine's): one kernel call serves them."""
    pool = parts[0][2].pool
    return all(storage.pool is pool for _, _, storage, _, _ in parts)


class CpuBackend(NumpyBackend):
    bulk_is_exact = True          # one kernel for every path: linear, attention and every row op (kernels/)
    # Generations stepped together by default (TINYLOOP_MAX_RUNNING): one read of the packed
    # weights serves every running row, so throughput grows with the batch until the linear
    # kernels are compute-bound (README, "Many users at once", has the measured sweep).
    default_max_running = 8
    # Prompt rows per prefill chunk in the engine (TINYLOOP_PREFILL_CHUNK): a lone prompt
    # prefills as fast in 32-row chunks as in 128 (the kernels' rows are independent, and
    # their row blocks are 8), while running streams wait for one chunk per step. Measured
    # with 7 streams running and a 4,000-token prompt joining (2 threads): their median gap
    # 172 ms against 509 at 128 rows, the prompt's first token 19.6 s against 15.6 s.
    default_prefill_chunk = 32

    def __init__(self, description: str = "cpu", activations: str = "fp32"):
        super().__init__(description, activations)
        warm_up_kernels()           # compiled (first run) or loaded from numba's cache now, not in a request

    # -- weights -------------------------------------------------------------------------------
    def prepare_linear(self, parts, bias=None) -> PackedLinear:
        return prepare_linear(parts, bias)

    def prepare_embedding(self, table):
        return prepare_embedding(table)

    def rope_table(self, max_positions, inv_freq):
        return on_a_passing_thread(rope_table, max_positions, inv_freq)     # at load (kernels/__init__.py)

    # -- per forward ---------------------------------------------------------------------------
    def embed(self, table, ids):
        return embed(table, ids)

    def linear(self, x, weight: PackedLinear, exact: bool, residual=None):
        # exact or not, one kernel: every row gets the arithmetic of a row computed alone
        if x.dtype == np.float16:                   # fp16 activations: widened exactly
            x = x.astype(np.float32)
        return linear(x, weight, residual)

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

    def kv_bytes_per_row(self, mode, n_kv, head_dim) -> int:
        return bytes_per_row(mode, n_kv, head_dim)

    def kv_write(self, storage: KVStorage, slot, plan, keys, values, rope=False):
        self._refuse_fused_rope(rope)
        kv_write(storage, slot, plan.write_rows, keys, values, plan.prepared)

    def attention(self, q, storage: KVStorage, slot, plan, scale, rope=False):
        self._refuse_fused_rope(rope)
        return attend_plan(q, storage, slot, plan, scale)

    def kv_write_parts(self, keys, values, parts, holder, rope=False):
        self._refuse_fused_rope(rope)
        if not _one_pool(parts):                        # caches of pools of their own (tests, tools)
            return super().kv_write_parts(keys, values, parts, holder)
        kv_write_many(keys, values, [(start, stop, storage, slot, plan.write_rows)
                                     for start, stop, storage, slot, plan in parts], holder)

    def attention_parts(self, q, parts, scale, holder, rope=False):
        self._refuse_fused_rope(rope)
        if not _one_pool(parts):
            return super().attention_parts(q, parts, scale, holder)
        return attend_parts(q, [(storage, slot, plan) for _, _, storage, slot, plan in parts], scale, holder)

    # -- sampling support ----------------------------------------------------------------------
    def argmax(self, logits) -> np.ndarray:
        return row_kernels.argmax(logits)          # np.argmax's answer (lowest id on ties, first NaN)

    def top_k(self, logits, k):
        if np.asarray(logits).dtype == np.float32:  # the compiled kernel: ids, float64 values, normalizers
            return row_kernels.top_k(logits, k)
        rows = [np.asarray(row, np.float64) for row in logits]
        ids = np.stack([top_k_ids(row, k)[:k] for row in rows])
        values = np.stack([row[i] for row, i in zip(rows, ids)])
        return ids, values, np.array([log_normalizer(row) for row in rows])
