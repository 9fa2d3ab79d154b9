"""Twin of cuda/kv.cu: quantize-and-store and the accepted-path row copy, float32 op for op.

Stored arrays per side are the device layout of the KV pool (cuda/README.md): float modes
`data` (n_kv, rows, hd) float16 / float32; int modes `codes` (..., hd * bits / 8) uint8
packed little-end first, `scale` and `min` (..., groups) float16. fp16/fp32/int8/int4 are
the CPU backend's stored values exactly (IntStore.quantize is the kernel's arithmetic:
min and max per group, f16 scale = half((max - min) / levels), f16 min, codes =
clip(rint((x - min) / safe scale))). int4-h first rotates with the fast Walsh-Hadamard
transform and one multiply by float32(1 / sqrt(hd)), where the CPU backend multiplies by
the Hadamard matrix with BLAS (same values up to rounding).
"""
from __future__ import annotations

import numpy as np

from tinyloop.backends.reference.kvstore import IntStore
from tinyloop.kv.modes import CODE_BITS
from tinyloop.model.quant import pack_codes

F = np.float32


def hadamard_norm(head_dim: int) -> np.float32:
    """float32(1 / sqrt(hd)), rounded as kv/modes.py's hadamard() rounds its entries."""
    return F(1.0 / np.sqrt(head_dim))


def fwht(x: np.ndarray) -> np.ndarray:
    """(..., hd) float32 -> the same shape: stages h = 1, 2, 4, ... turn pairs (j, j + h),
    j & h == 0, into (a + b, a - b); then one multiply by hadamard_norm(hd). Equals
    x @ hadamard(hd) up to rounding; it is its own inverse up to rounding."""
    x = np.asarray(x, F)
    lead, head_dim = x.shape[:-1], x.shape[-1]
    if head_dim & (head_dim - 1):
        raise ValueError(f"the Hadamard rotation needs a power-of-two head_dim, got {head_dim}")
    y, h = x, 1
    while h < head_dim:
        pairs = y.reshape(*lead, head_dim // (2 * h), 2, h)          # [..., block, (j | j + h), i]
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        y = np.stack([a + b, a - b], axis=-2).reshape(*lead, head_dim)
        h *= 2
    return y * hadamard_norm(head_dim)


def stored_rows(mode: str, x: np.ndarray) -> dict:
    """x: (..., hd) float32 -> what the kernel stores for those rows, by array name."""
    x = np.asarray(x, F)
    if mode == "fp32":
        return {"data": x.copy()}
    if mode == "fp16":
        return {"data": x.astype(np.float16)}
    bits = CODE_BITS[mode]
    if mode == "int4-h":
        x = fwht(x)
    codes, scale, offset = IntStore(bits).quantize(x)
    lead, head_dim = x.shape[:-1], x.shape[-1]
    packed = pack_codes(codes.reshape(-1, head_dim), bits).reshape(*lead, head_dim * bits // 8)
    return {"codes": packed, "scale": scale, "min": offset}


def kv_write(mode: str, keys_arrays: dict, values_arrays: dict, blocks, rows, keys, values) -> None:
    """Host twin of kv_write_<mode>: keys, values (T, n_kv, hd) stored at physical rows `rows`
    (T,) of the slot whose block table row is `blocks` (pool row blocks[r // 64] * 64 + r % 64)
    in the pool's side dicts (n_kv, rows, ...), in place. blocks (T, W): token t's own table
    row blocks[t] (several caches in one launch: per_token_tables)."""
    rows = np.asarray(rows, np.int64)
    blocks = np.asarray(blocks, np.int64)
    table = blocks[np.arange(rows.shape[0]), rows // 64] if blocks.ndim == 2 else blocks[rows // 64]
    rows = table * 64 + rows % 64
    for arrays, x in ((keys_arrays, keys), (values_arrays, values)):
        for name, stored in stored_rows(mode, np.asarray(x, F).transpose(1, 0, 2)).items():   # (n_kv, T, ...)
            arrays[name][:, rows] = stored


def copy_rows(arrays, source, target) -> None:
    """Host twin of rows_gather + rows_scatter: every pool array (n_kv, rows, ...) gets pool rows
    source[i] -> target[i], all sources read before any target is written."""
    for array in arrays:
        array[:, np.asarray(target)] = array[:, np.asarray(source)]
