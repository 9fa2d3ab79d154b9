"""RoPE: the rotation table (built once at load) and its application (per forward).

apply (interleaved pairs, the table's rows chosen by the plan): for each row t, head h and
pair i, with (a, b) = (x[t, h, 2i], x[t, h, 2i + 1]) and (c, d) = (cos, sin) of the row's
rotation i, in float32:
    out[t, h, 2i] = (a * c) - (b * d);    out[t, h, 2i + 1] = (a * d) + (b * c)
the two products rounded first, then the subtraction / addition (never fused: no fastmath).
NumPy's complex64 product, the old path, may use FMA on one CPU and not on another.
An element reads only its own pair and its row's rotation: no dependence on other rows,
heads, the thread split or the CPU.

table: angle = float64(p) * f_j (one IEEE multiplication, exact for p and rounded once),
then (cos, sin) of it by rows_f64.sincos_f64 (our own reduction and fdlibm's polynomials,
IEEE operations only), each rounded to float32 (IEEE, round to nearest even). NumPy's
float64 sin/cos may choose CPU-specific SIMD code; this table is the same on every CPU.
"""
import numpy as np
from numba import njit, prange

from tinyloop.backends.cpu.kernels.rows_f64 import sincos_f64


@njit(cache=True, error_model="numpy")
def _rope_row(x, rot, out, t):
    """x, out: (T, heads, hd/2) complex64 (the pairs), rot: (T, hd/2) complex64. The product
    is written out in float32 (not numba's complex multiplication, whose special cases vary
    with the Python version); complex64 loads and stores vectorise well."""
    heads, pairs = x.shape[1], x.shape[2]
    r = rot[t]
    for h in range(heads):
        src = x[t, h]
        dest = out[t, h]
        for i in range(pairs):
            a, b = src[i].real, src[i].imag
            c, d = r[i].real, r[i].imag
            dest[i] = np.complex64(complex(a * c - b * d, a * d + b * c))    # float32 parts: exact


@njit(cache=True, error_model="numpy")
def rope_serial(x, rot, out):
    for t in range(x.shape[0]):
        _rope_row(x, rot, out, t)


@njit(parallel=True, cache=True, error_model="numpy")
def rope_parallel(x, rot, out):
    for t in prange(x.shape[0]):
        _rope_row(x, rot, out, t)


@njit(parallel=True, cache=True, error_model="numpy")
def rope_table_kernel(inv_freq, out):
    """inv_freq: (hd/2,) float64, out: (P, hd) float32 <- (cos, sin) pairs of p * f_j."""
    positions, pairs = out.shape[0], inv_freq.shape[0]
    for p in prange(positions):
        for j in range(pairs):
            sin, cos = sincos_f64(np.float64(p) * inv_freq[j])
            out[p, 2 * j] = np.float32(cos)
            out[p, 2 * j + 1] = np.float32(sin)
