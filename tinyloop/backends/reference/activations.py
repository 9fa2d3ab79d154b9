"""Elementwise activations (float32 in, float32 out)."""
import numpy as np

_SQRT_2_OVER_PI = np.float32(0.7978845608028654)
_GELU_CUBIC = np.float32(0.044715)


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (GPT-2's): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    inner = _SQRT_2_OVER_PI * (x + _GELU_CUBIC * x * x * x)
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(inner))


def silu(x: np.ndarray) -> np.ndarray:
    """x * sigmoid(x) = x / (1 + exp(-x))."""
    out = np.negative(x)
    np.exp(out, out=out)
    out += np.float32(1.0)
    np.divide(x, out, out=out)
    return out


def swiglu(up: np.ndarray, ffn_dim: int) -> np.ndarray:
    """up: (T, 2 ffn) = [gate | up] -> silu(gate) * up."""
    out = silu(up[:, :ffn_dim])
    out *= up[:, ffn_dim:]
    return out
