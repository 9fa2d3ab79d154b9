"""The oracle of rope.py: the table from rows_f64_oracle's sincos, the rotation as NumPy
float32 elementwise products, then the subtraction / addition."""
import numpy as np

from tinyloop.backends.cpu.kernels.rows_f64_oracle import sincos_f64

F = np.float32


def rope_table(max_positions: int, inv_freq) -> np.ndarray:
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * np.asarray(inv_freq, np.float64)[None, :]
    sin, cos = sincos_f64(angles)
    out = np.empty(angles.shape + (2,), F)
    out[..., 0], out[..., 1] = cos.astype(F), sin.astype(F)
    return out.reshape(max_positions, -1).view(np.complex64)


def apply_rope(x, rotation) -> np.ndarray:
    x = np.asarray(x, F)
    rot = np.ascontiguousarray(rotation, np.complex64).view(F)            # (T, hd)
    c, d = rot[:, None, 0::2], rot[:, None, 1::2]                         # (T, 1, hd/2)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    with np.errstate(all="ignore"):
        out[..., 0::2] = (a * c) - (b * d)
        out[..., 1::2] = (a * d) + (b * c)
    return out
