"""Rotary position embedding, interleaved pairs (dims 2i and 2i+1 rotate together).

This is the original LLaMA / llama.cpp "normal" convention, so GGUF llama weights
load without permuting the query and key projections. A pair (x[2i], x[2i+1]) is
the complex number x[2i] + i x[2i+1], and the rotation is one complex product.

The frequencies are worked out once on the host (`inv_frequencies`, `model_frequencies`)
and every backend builds its table from them, so RoPE scaling means the same everywhere.
"""
import numpy as np

from tinyloop.backends.cpu.kernels import rows as _kernels
from tinyloop.backends.reference.positions import inv_frequencies, model_frequencies  # noqa: F401  (unchanged)


def rope_table(max_positions: int, inv_freq: np.ndarray) -> np.ndarray:
    """-> (max_positions, hd / 2) complex64 rotations e^{i p f_j} for the (hd / 2,)
    frequencies f (inv_frequencies): the angle p * f_j and its cos and sin in float64 by our
    own code (kernels/rope.py, kernels/rows_f64.py: IEEE operations only, not NumPy's
    CPU-dispatched sin/cos), then rounded to float32; the same table on every CPU."""
    return _kernels.rope_table(max_positions, inv_freq)


def apply_rope(x: np.ndarray, rotation: np.ndarray) -> np.ndarray:
    """x: (T, heads, hd) float32; rotation: (T, hd/2) complex64 -> (T, heads, hd) float32:
    each pair (a, b) times (c, d) = (a c - b d, a d + b c), the products rounded first
    (kernels/rope.py)."""
    return _kernels.apply_rope(x, rotation)
