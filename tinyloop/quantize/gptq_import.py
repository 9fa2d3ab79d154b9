"""GPTQ checkpoint tensors (the common AutoGPTQ safetensors layout) -> TinyLoop weights.

For a linear layer with in_features x out_features:
    qweight  int32 (in * bits / 32, out)   codes packed along the input dimension,
                                            value j of a word at bits [bits*j, bits*j + bits)
    qzeros   int32 (groups, out * bits / 32) zero points packed along the output dimension
    scales   float16 (groups, out)
    g_idx    int32 (in,)                    group of each input row (act-order: unsorted)
    W[i, o] = scales[g, o] * (q[i, o] - zero[g, o]),  g = g_idx[i]
Checkpoint format v1 ("gptq") stores zero - 1; v2 ("gptq_v2") stores the zero itself.

In TinyLoop's layout that is w = q * scale + min with min = -zero * scale. Scale and
min are kept in float32, where -zero * scale is exact, so dequantized values equal the
GPTQ formula exactly. With act-order, the input columns are stored sorted by group and
the permutation is kept, as for weights quantized here.
"""
from __future__ import annotations

import numpy as np

from tinyloop.errors import TinyLoopError
from tinyloop.model.quant import QuantizedTensor, pack_codes

GPTQ_BITS = (2, 4, 8)


def unpack_int32(packed: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """Unpack b-bit fields of int32 words along `axis` (each word -> 32/bits values)."""
    words = np.asarray(packed).astype(np.int64) & 0xFFFFFFFF
    per_word = 32 // bits
    mask = (1 << bits) - 1
    fields = np.stack([(words >> (bits * j)) & mask for j in range(per_word)], axis=axis + 1)
    shape = list(words.shape)
    shape[axis] *= per_word
    return fields.reshape(shape).astype(np.uint8)


def import_gptq_linear(qweight, qzeros, scales, g_idx, bits: int, checkpoint_format: str = "gptq") -> QuantizedTensor:
    if bits not in GPTQ_BITS:
        raise TinyLoopError(f"GPTQ import supports {GPTQ_BITS} bits, got {bits}")
    if checkpoint_format not in ("gptq", "gptq_v2"):
        raise TinyLoopError(f"checkpoint format must be gptq (v1) or gptq_v2, got {checkpoint_format!r}")
    codes = unpack_int32(qweight, bits, axis=0)                         # (in, out)
    zeros = unpack_int32(qzeros, bits, axis=1).astype(np.int64)         # (groups, out)
    if checkpoint_format == "gptq":
        zeros = (zeros + 1) & ((1 << bits) - 1)                         # v1 stored zero - 1
    scales = np.asarray(scales, np.float32)                             # (groups, out)
    in_dim, out_dim = codes.shape
    groups = scales.shape[0]
    g_idx = np.asarray(g_idx, np.int64)
    if zeros.shape != (groups, out_dim) or g_idx.shape != (in_dim,) or in_dim % groups:
        raise TinyLoopError(f"inconsistent GPTQ tensors: qweight gives {in_dim}x{out_dim}, scales "
                            f"{scales.shape}, qzeros {zeros.shape}, g_idx {g_idx.shape}")
    group_size = in_dim // groups
    order = np.argsort(g_idx, kind="stable")
    if not np.array_equal(g_idx[order], np.repeat(np.arange(groups), group_size)):
        raise TinyLoopError("g_idx does not give every group the same number of input columns; "
                            "this layout cannot be stored group-wise")
    identity = np.array_equal(order, np.arange(in_dim))
    stored = np.ascontiguousarray(codes.T[:, order])                    # (out, in) in group order
    scale = np.ascontiguousarray(scales.T)                              # (out, groups)
    offset = np.ascontiguousarray(-(zeros.T.astype(np.float32)) * scale)
    return QuantizedTensor(pack_codes(stored, bits), scale, offset, bits, group_size,
                           "gptq-import", None if identity else order.astype(np.int32))
