"""Embedding tables on the CPU: kept as the file stores them, rows widened when looked up.

A quantized table (GGUF's Q8_0 token embeddings, say) stays its memory-mapped codes,
scales and mins; a lookup dequantizes just the T rows asked for, w = q * scale + min per
element (model/quant.py's dequantize, two float32 roundings, elementwise, so a row's
values never depend on which other rows are looked up with it). A half or float table
stays a view of the file; rows widen exactly.
"""
from __future__ import annotations

import numpy as np

from tinyloop.model.quant import QuantizedTensor, dequantize


def prepare_embedding(table):
    """(rows, D) float array or QuantizedTensor -> the handle `embed` reads (no copy)."""
    return table if isinstance(table, QuantizedTensor) else np.asarray(table)


def embed(table, ids) -> np.ndarray:
    """ids: (T,) ints -> (T, D) float32."""
    ids = np.asarray(ids)
    if isinstance(table, QuantizedTensor):
        rows = QuantizedTensor(table.codes[ids], table.scale[ids], table.min[ids], table.bits, table.group_size,
                               table.method, table.perm, table.in_features)
        return dequantize(rows, np.float32)
    return table[ids].astype(np.float32)
