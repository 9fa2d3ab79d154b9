"""KV cache modes: what each stores per token, independent of the backend that stores it.

    fp16    keys and values rounded to half precision
    int8    8-bit codes, per (token, head, group of 32) an f16 scale and min
    int4    4-bit codes, the same groups
    int4-h  int4 after an orthonormal Hadamard rotation over the head dimension
            (queries get the same rotation, so scores are unchanged; outputs are
            rotated back), which spreads outlier channels before quantizing
    fp32    float32, unrounded

Quantized modes group along the head dimension per token and head: a group is GROUP
values (or the whole head if hd is not a multiple of GROUP), codes are unsigned,
value = code * scale + min. Per-token groups are the only grouping that can be
finished when a token is written: per-channel key grouping (over tokens) would need a
full-precision residual buffer re-quantized later, which breaks write-once rows,
rollback and ring buffers.
"""
from __future__ import annotations

import numpy as np

KV_MODES = ("fp16", "int8", "int4", "int4-h", "fp32")
GROUP = 32
CODE_BITS = {"int8": 8, "int4": 4, "int4-h": 4}


def group_size(head_dim: int) -> int:
    return GROUP if head_dim % GROUP == 0 else head_dim


def check_mode(mode: str) -> str:
    if mode not in KV_MODES:
        raise ValueError(f"KV cache mode must be one of {', '.join(KV_MODES)}, got {mode!r}")
    return mode


def packed_bytes_per_row(mode: str, n_kv: int, head_dim: int) -> int:
    """Bytes one token's keys and values together take in the mode's packed layout (what a GPU stores)."""
    if mode in CODE_BITS:
        groups = head_dim // group_size(head_dim)
        return 2 * n_kv * (head_dim * CODE_BITS[mode] // 8 + groups * 4)      # codes + f16 scale + f16 min
    return 2 * n_kv * head_dim * (2 if mode == "fp16" else 4)


def hadamard(head_dim: int) -> np.ndarray:
    """The orthonormal Sylvester-Hadamard matrix of order head_dim (a power of two): (hd, hd) float32."""
    if head_dim & (head_dim - 1):
        raise ValueError(f"the Hadamard rotation needs a power-of-two head_dim, got {head_dim}")
    matrix = np.ones((1, 1))
    while matrix.shape[0] < head_dim:
        matrix = np.block([[matrix, matrix], [matrix, -matrix]])
    return (matrix / np.sqrt(head_dim)).astype(np.float32)
