"""Rotary position embedding, interleaved pairs (dims 2i and 2i+1 rotate together).

This is the original LLaMA / llama.cpp "normal" convention, so GGUF llama weights
load without permuting the query and key projections.
"""
import numpy as np


def rope_tables(max_positions: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """-> cos, sin: (max_positions, head_dim / 2) float32, computed in float64."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)   # (hd/2,)
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x: (T, heads, hd); cos/sin: (T, hd/2) for these positions -> (T, heads, hd)."""
    even = x[..., 0::2]
    odd = x[..., 1::2]
    c = cos[:, None, :]
    s = sin[:, None, :]
    out = np.empty_like(x)
    out[..., 0::2] = even * c - odd * s
    out[..., 1::2] = even * s + odd * c
    return out
