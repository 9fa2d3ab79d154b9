"""Row-wise normalisations over the last axis (each row independent of the others)."""
import numpy as np

from tinyloop.backends.reference.layout import canonical


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x: (T, D), weight: (D,) -> (T, D). Each row's sum runs over its own contiguous row."""
    x = canonical(x)
    mean_square = np.add.reduce(x * x, axis=-1, keepdims=True) / np.float32(x.shape[-1])   # (T, 1)
    return x * (np.float32(1.0) / np.sqrt(mean_square + np.float32(eps))) * weight


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float) -> np.ndarray:
    """x: (T, D), weight/bias: (D,) -> (T, D). Each row's sums run over its own contiguous row."""
    x = canonical(x)
    width = np.float32(x.shape[-1])
    mean = np.add.reduce(x, axis=-1, keepdims=True) / width                          # (T, 1)
    centered = x - mean
    variance = np.add.reduce(centered * centered, axis=-1, keepdims=True) / width    # (T, 1)
    out = centered * (np.float32(1.0) / np.sqrt(variance + np.float32(eps))) * weight
    if bias is not None:
        out += bias
    return out
