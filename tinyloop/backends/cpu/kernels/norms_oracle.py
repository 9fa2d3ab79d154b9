"""The oracle of norms.py, written from the definition in NumPy: every row at once,
elementwise float32 operations, the sums over D as explicit loops in the lanes order
(lanes.dot16_numpy / tree_sum16_numpy)."""
import numpy as np

from tinyloop.backends.cpu.kernels.lanes import LANES, dot16_numpy, tree_sum16_numpy

F = np.float32


def sum16_numpy(x: np.ndarray) -> np.ndarray:
    """(T, n) -> (T,): lane l adds x[:, l], x[:, l + 16], ... in order, then tree_sum16."""
    x = np.asarray(x, F)
    acc = np.zeros(x.shape[:-1] + (LANES,), F)
    for k in range(x.shape[-1]):
        acc[..., k % LANES] = acc[..., k % LANES] + x[..., k]
    return tree_sum16_numpy(acc)


def rms_norm(x, weight, eps) -> np.ndarray:
    x, weight = np.asarray(x, F), np.asarray(weight, F)
    with np.errstate(all="ignore"):
        mean_square = dot16_numpy(x, x) / F(x.shape[-1])                  # (T,)
        inv = F(1.0) / np.sqrt(mean_square + F(eps))
        return ((x * inv[:, None]) * weight).astype(F)


def layer_norm(x, weight, bias, eps) -> np.ndarray:
    x, weight = np.asarray(x, F), np.asarray(weight, F)
    width = F(x.shape[-1])
    with np.errstate(all="ignore"):
        centered = x - (sum16_numpy(x) / width)[:, None]
        inv = F(1.0) / np.sqrt(dot16_numpy(centered, centered) / width + F(eps))
        out = (centered * inv[:, None]) * weight
        if bias is not None:
            out = out + np.asarray(bias, F)
    return out.astype(F)
