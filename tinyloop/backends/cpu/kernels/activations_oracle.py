"""The oracle of activations.py: the definitions as NumPy elementwise float32 operations
(fmath_oracle's exp / tanh / silu)."""
import numpy as np

from tinyloop.backends.cpu.kernels.fmath_oracle import silu_f32, tanh_f32

F = np.float32


def swiglu(up, ffn_dim: int) -> np.ndarray:
    up = np.asarray(up, F)
    with np.errstate(all="ignore"):
        return (silu_f32(up[:, :ffn_dim]) * up[:, ffn_dim:]).astype(F)


def gelu(x) -> np.ndarray:
    x = np.asarray(x, F)
    with np.errstate(all="ignore"):
        u = F(0.7978845608028654) * (x + ((F(0.044715) * x) * x) * x)
        return ((F(0.5) * x) * (F(1.0) + tanh_f32(u))).astype(F)
