"""Rotary position embedding, interleaved pairs (dims 2i and 2i+1 rotate together).

This is the original LLaMA / llama.cpp "normal" convention, so GGUF llama weights
load without permuting the query and key projections. A pair (x[2i], x[2i+1]) is
the complex number x[2i] + i x[2i+1], and the rotation is one complex product.

The frequencies are worked out once on the host (`inv_frequencies`, `model_frequencies`)
and every backend builds its table from them, so RoPE scaling means the same everywhere.
"""
import numpy as np

from tinyloop.model.config import ROPE_SCALINGS


def inv_frequencies(head_dim: int, theta: float, scaling: str = "none", factor: float = 1.0,
                    low_freq_factor: float = 1.0, high_freq_factor: float = 4.0,
                    original_max_positions: int = 0) -> np.ndarray:
    """-> (head_dim / 2,) float64 angular frequencies of the pairs, theta^(-2j/hd), rescaled
    by `scaling`:

    "llama3" (Llama 3.1 and later): a pair whose wavelength 2 pi / f is longer than
    original_max_positions / low_freq_factor turns `factor` times slower; one shorter than
    original_max_positions / high_freq_factor is kept; in between, the frequency is a blend
    f * ((1 - t) / factor + t), t going linearly in original_max_positions / wavelength from
    0 (at the long end) to 1 (at the short end), so the three ranges meet without a jump."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)   # (hd/2,)
    if scaling == "none":
        return inv_freq
    if scaling != "llama3":
        raise ValueError(f"unknown RoPE scaling {scaling!r}; known: {', '.join(ROPE_SCALINGS)}")
    periods_in_context = original_max_positions * inv_freq / (2 * np.pi)          # = original / wavelength
    t = np.clip((periods_in_context - low_freq_factor) / (high_freq_factor - low_freq_factor), 0.0, 1.0)
    return inv_freq * ((1.0 - t) / factor + t)


def model_frequencies(config) -> np.ndarray:
    """The frequencies a ModelConfig asks for (its rope_* fields)."""
    return inv_frequencies(config.head_dim, config.rope_theta, config.rope_scaling, config.rope_factor,
                           config.rope_low_freq_factor, config.rope_high_freq_factor,
                           config.rope_original_max_positions)


def rope_table(max_positions: int, inv_freq: np.ndarray) -> np.ndarray:
    """-> (max_positions, hd / 2) complex64 rotations e^{i p f_j} for the (hd / 2,)
    frequencies f (inv_frequencies), computed in float64."""
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * np.asarray(inv_freq, np.float64)[None, :]
    return (np.cos(angles) + 1j * np.sin(angles)).astype(np.complex64)


def apply_rope(x: np.ndarray, rotation: np.ndarray) -> np.ndarray:
    """x: (T, heads, hd) float32, contiguous; rotation: (T, hd/2) complex64 -> (T, heads, hd)."""
    pairs = np.ascontiguousarray(x).view(np.complex64)                  # (T, heads, hd/2)
    return (pairs * rotation[:, None, :]).view(np.float32)
