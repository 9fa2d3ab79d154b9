"""swiglu and gelu (tanh approximation): elementwise, every element by the same float32
steps whatever its position, its row or the thread that computes it.

  swiglu: out[t, j] = silu_f32(g) * u,  g = up[t, j], u = up[t, F + j]   (silu_f32: g / (1 + exp_f32(-g)))
  gelu:   u = S * (x + ((C * x) * x) * x), S = float32(sqrt(2 / pi)), C = float32(0.044715);
          out = (0.5 * x) * (1 + tanh_f32(u))
exp_f32 / tanh_f32 are fmath.py's (IEEE +, -, *, / only; branch-free, so the loops
vectorise: the vector body and the scalar tail perform the same operations on each element).
No fastmath: no FMA, no reassociation. The parallel drivers split rows (swiglu) or flat
ranges (gelu) between threads; an element's arithmetic does not depend on the split.
"""
import numpy as np
from numba import njit, prange

from tinyloop.backends.cpu.kernels.fmath import silu_f32, tanh_f32

F = np.float32
SQRT_2_OVER_PI = F(0.7978845608028654)
GELU_CUBIC = F(0.044715)
HALF, ONE = F(0.5), F(1.0)
CHUNK = 4096                    # gelu's parallel grain (elements)


@njit(cache=True, error_model="numpy")
def _swiglu_row(up, ffn, out, t):
    row = up[t]
    dest = out[t]
    for j in range(ffn):
        dest[j] = silu_f32(row[j]) * row[ffn + j]


@njit(cache=True, error_model="numpy")
def swiglu_serial(up, ffn, out):
    for t in range(up.shape[0]):
        _swiglu_row(up, ffn, out, t)


@njit(parallel=True, cache=True, error_model="numpy")
def swiglu_parallel(up, ffn, out):
    for t in prange(up.shape[0]):
        _swiglu_row(up, ffn, out, t)


@njit(cache=True, error_model="numpy")
def _gelu_range(x, out, start, stop):
    for i in range(start, stop):
        v = x[i]
        u = SQRT_2_OVER_PI * (v + ((GELU_CUBIC * v) * v) * v)
        out[i] = (HALF * v) * (ONE + tanh_f32(u))


@njit(cache=True, error_model="numpy")
def gelu_serial(x, out):
    _gelu_range(x, out, 0, x.shape[0])


@njit(parallel=True, cache=True, error_model="numpy")
def gelu_parallel(x, out):
    n = x.shape[0]
    for c in prange((n + CHUNK - 1) // CHUNK):
        _gelu_range(x, out, c * CHUNK, min(n, (c + 1) * CHUNK))
