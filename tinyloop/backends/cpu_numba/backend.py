"""The CPU backend: NumPy kernels behind the Backend interface (backends/base.py).

Linear weights stay as the file stores them (packed codes with float32 scales, or float
weights), re-laid once into 16-output tiles and multiplied by our own compiled kernels
(linear.py, kernels/), fused where one product serves several projections (q|k|v,
gate|up). The KV cache keeps its mode's values (kvstore.py) and attention reads it in place.
"""
from __future__ import annotations

import numpy as np

from tinyloop.backends.base import Backend, check_activations
from tinyloop.backends.cpu_numba.activations import gelu_tanh, swiglu
from tinyloop.backends.cpu_numba.attention import attention as attend_plan
from tinyloop.backends.cpu_numba.kvstore import KVStorage, bytes_per_row, kv_write
from tinyloop.backends.cpu_numba.embedding import embed, prepare_embedding
from tinyloop.backends.cpu_numba.linear import PackedLinear, linear, prepare_linear
from tinyloop.backends.cpu_numba.norms import layer_norm, rms_norm
from tinyloop.backends.cpu_numba.positions import apply_rope, rope_table
from tinyloop.backends.cpu_numba.topk import log_normalizer, top_k_ids
from tinyloop.backends.cpu_numba.kernels import rows as row_kernels


_WARM = []


def warm_up_kernels() -> None:
    """Every row and attention kernel the backend calls, once per process (the linear kernels
    are warmed per weight kind as the weights are prepared: linear.py)."""
    if not _WARM:
        from tinyloop.backends.cpu_numba.kernels import attention as attention_kernels
        row_kernels.warm_up()
        attention_kernels.warm_up()
        _WARM.append(True)


class CpuBackend(Backend):
    name = "cpu"
    xp = np

    def __init__(self, description: str = "cpu", activations: str = "fp32"):
        self.description = description
        self.activations = check_activations(activations)
        warm_up_kernels()           # compiled (first run) or loaded from numba's cache now, not in a request

    # -- memory ------------------------------------------------------------------------------
    def asarray(self, host, dtype=None):
        return np.asarray(host, dtype=dtype)

    def to_host(self, array) -> np.ndarray:
        return array

    def allocate(self, nbytes: int):
        return np.zeros(nbytes, np.uint8)         # calloc: pages are committed as they are touched

    # -- weights -------------------------------------------------------------------------------
    def prepare_linear(self, parts, bias=None) -> PackedLinear:
        return prepare_linear(parts, bias)

    def prepare_vector(self, host):
        return None if host is None else np.asarray(host, np.float32)

    def prepare_embedding(self, table):
        return prepare_embedding(table)

    def rope_table(self, max_positions, inv_freq):
        return rope_table(max_positions, inv_freq)

    # -- per forward ---------------------------------------------------------------------------
    def rope_rows(self, table, plan):
        return table[plan.positions]

    def embed(self, table, ids):
        return embed(table, ids)

    def linear(self, x, weight: PackedLinear, exact: bool, residual=None):
        # exact or not, one kernel: every row gets the arithmetic of a row computed alone
        if x.dtype == np.float16:                   # fp16 activations: widened exactly
            x = x.astype(np.float32)
        out = linear(x, weight)
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
    def kv_storage(self, mode, n_slots, n_kv, rows, head_dim, alloc=None) -> KVStorage:
        return KVStorage(mode, n_slots, n_kv, rows, head_dim, alloc)

    def kv_bytes_per_row(self, mode, n_kv, head_dim) -> int:
        return bytes_per_row(mode, n_kv, head_dim)

    def kv_write(self, storage: KVStorage, slot, plan, keys, values):
        kv_write(storage, slot, plan.write_rows, keys, values)

    def attention(self, q, storage: KVStorage, slot, plan, scale):
        return attend_plan(q, storage, slot, plan, scale)

    def kv_copy_rows(self, storage: KVStorage, source, target):
        for array in storage.arrays():
            array[:, :, target] = array[:, :, source]

    def kv_stored(self, storage: KVStorage, rows) -> dict:
        out = {}
        for side, arrays in (("keys", storage.keys), ("values", storage.values)):
            for name, array in arrays.items():
                if name != "blocks":
                    out[f"{side}.{name}"] = array[:, :, rows]
        return out

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
