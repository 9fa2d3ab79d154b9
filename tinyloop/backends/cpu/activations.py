"""Elementwise activations (float32 in, float32 out).

Compiled kernels (kernels/activations.py) on fmath.py's exp / tanh / silu: IEEE operations
only, the same bits for an element wherever it sits and on every CPU. The NumPy oracle is
kernels/activations_oracle.py.
"""
import numpy as np

from tinyloop.backends.cpu.kernels import rows as _kernels
from tinyloop.backends.cpu.kernels.fmath_oracle import silu_f32


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (GPT-2's): (0.5 x) (1 + tanh(sqrt(2/pi) (x + ((0.044715 x) x) x)))."""
    return _kernels.gelu(x)


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x) = x / (1 + exp(-x)), fmath's silu_f32 (in NumPy: not on the hot path)."""
    return silu_f32(x)


def swiglu(up: np.ndarray, ffn_dim: int) -> np.ndarray:
    """up: (T, 2 ffn) = [gate | up] -> silu(gate) * up."""
    return _kernels.swiglu(up, ffn_dim)
