"""Row-wise normalisations over the last axis (each row independent of the others).

Compiled kernels (kernels/norms.py, the definition and the invariance argument there):
the sums over D in the lanes order of kernels/lanes.py, sqrt and division IEEE-exact,
weight and bias applied elementwise; a row's bits depend only on the row, the weights and
eps, on every CPU. The NumPy oracle is kernels/norms_oracle.py.
"""
import numpy as np

from tinyloop.backends.cpu.kernels import rows as _kernels


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x: (T, D), weight: (D,) -> (T, D) float32 = (x * inv) * weight, inv = 1 / sqrt(mean(x^2) + eps)."""
    return _kernels.rms_norm(x, weight, eps)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float) -> np.ndarray:
    """x: (T, D), weight/bias: (D,) -> (T, D) float32 = ((x - mean) * inv) * weight (+ bias)."""
    return _kernels.layer_norm(x, weight, bias, eps)
