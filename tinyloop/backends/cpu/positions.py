"""Rotary position embedding, interleaved pairs (dims 2i and 2i+1 rotate together).

This is the original LLaMA / llama.cpp "normal" convention, so GGUF llama weights
load without permuting the query and key projections. A pair (x[2i], x[2i+1]) is
the complex number x[2i] + i x[2i+1], and the rotation is one complex product.
"""
import numpy as np


def rope_table(max_positions: int, head_dim: int, theta: float) -> np.ndarray:
    """-> (max_positions, head_dim / 2) complex64 rotations e^{i p theta^(-2j/hd)},
    computed in float64."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)   # (hd/2,)
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return (np.cos(angles) + 1j * np.sin(angles)).astype(np.complex64)


def apply_rope(x: np.ndarray, rotation: np.ndarray) -> np.ndarray:
    """x: (T, heads, hd) float32, contiguous; rotation: (T, hd/2) complex64 -> (T, heads, hd)."""
    pairs = np.ascontiguousarray(x).view(np.complex64)                  # (T, heads, hd/2)
    return (pairs * rotation[:, None, :]).view(np.float32)
