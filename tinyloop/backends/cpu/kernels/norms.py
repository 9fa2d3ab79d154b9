"""rms_norm and layer_norm, one row at a time, the row's arithmetic fixed by this code.

Definition (x one row of D float32 values, every step rounded to float32):
  sum16(v)   = the lanes order of lanes.py: lane l adds v[l], v[l + 16], ... in order from
               0, then tree_sum16 (8, 4, 2, 1);  dot16(a, b) the same over a[k] * b[k].
  rms_norm:   inv = 1 / sqrt(dot16(x, x) / D + eps);        out[j] = (x[j] * inv) * w[j]
  layer_norm: mean = sum16(x) / D;  c[j] = x[j] - mean;
              inv = 1 / sqrt(dot16(c, c) / D + eps);       out[j] = (c[j] * inv) * w[j] (+ b[j])
sqrt and / are IEEE correctly rounded; no FMA (no fastmath). A row is computed by one call
of `_rms_row` / `_layer_row`, whichever driver (serial or prange over rows) calls it and
whichever thread runs it, and reads nothing but its own row, the weights and eps: its bits
cannot depend on the other rows, their number, the thread count or the CPU.
"""
import numpy as np
from numba import njit, prange

from tinyloop.backends.cpu.kernels.lanes import LANES, dot16, tree_sum16

F = np.float32
ONE = F(1.0)


@njit(inline="always", cache=True, error_model="numpy")
def sum16(a, n):
    """sum(a[:n]) in the lane order: lane l adds a[k] for k = l, l + 16, ..., then the tree."""
    acc = np.zeros(LANES, np.float32)
    full = n - n % LANES
    for k0 in range(0, full, LANES):
        for lane in range(LANES):
            acc[lane] = acc[lane] + a[k0 + lane]
    for k in range(full, n):
        acc[k - full] = acc[k - full] + a[k]
    return tree_sum16(acc)


@njit(cache=True, error_model="numpy")
def _rms_row(x, weight, eps, out, t):
    width = x.shape[1]
    row = x[t]
    inv = ONE / np.sqrt(dot16(row, row, width) / F(width) + eps)
    dest = out[t]
    for j in range(width):
        dest[j] = (row[j] * inv) * weight[j]


@njit(cache=True, error_model="numpy")
def _layer_row(x, weight, bias, has_bias, eps, out, t):
    width = x.shape[1]
    row = x[t]
    dest = out[t]
    mean = sum16(row, width) / F(width)
    for j in range(width):
        dest[j] = row[j] - mean
    inv = ONE / np.sqrt(dot16(dest, dest, width) / F(width) + eps)
    if has_bias:
        for j in range(width):
            dest[j] = (dest[j] * inv) * weight[j] + bias[j]
    else:
        for j in range(width):
            dest[j] = (dest[j] * inv) * weight[j]


@njit(cache=True, error_model="numpy")
def rms_norm_serial(x, weight, eps, out):
    for t in range(x.shape[0]):
        _rms_row(x, weight, eps, out, t)


@njit(parallel=True, cache=True, error_model="numpy")
def rms_norm_parallel(x, weight, eps, out):
    for t in prange(x.shape[0]):
        _rms_row(x, weight, eps, out, t)


@njit(cache=True, error_model="numpy")
def layer_norm_serial(x, weight, bias, has_bias, eps, out):
    for t in range(x.shape[0]):
        _layer_row(x, weight, bias, has_bias, eps, out, t)


@njit(parallel=True, cache=True, error_model="numpy")
def layer_norm_parallel(x, weight, bias, has_bias, eps, out):
    for t in prange(x.shape[0]):
        _layer_row(x, weight, bias, has_bias, eps, out, t)
