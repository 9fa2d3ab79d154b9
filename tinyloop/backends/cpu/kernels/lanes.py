"""The one reduction order of the CPU kernels: 16 lanes, then a fixed tree.

A sum over an axis of length K is split into LANES = 16 partial sums: lane l adds, in
increasing order, the terms the kernel assigns to it (for a plain dot product the terms
k with k % 16 == l; the linear kernels assign a packed byte's columns to lanes their own
way, linear.py). The 16 lane sums are then added in one fixed tree, `tree_sum16`:
width 8, 4, 2, 1, lane l taking lane l + width. A loop over the 16 lanes vectorises (one
AVX-512 register, two AVX2 ones, four SSE ones) with the same operations in the same
order whatever the vector width, because lanes never mix until the tree.
"""
import numpy as np
from numba import njit

LANES = 16


@njit(inline="always", cache=True)
def tree_sum16(acc):
    """acc: (16,) float32 lane sums -> their fixed-tree sum (acc is overwritten)."""
    for width in (8, 4, 2, 1):
        for lane in range(width):
            acc[lane] = acc[lane] + acc[lane + width]
    return acc[0]


def tree_sum16_numpy(acc: np.ndarray) -> np.ndarray:
    """The oracle's tree_sum16 over the last axis: (..., 16) float32 -> (...) float32."""
    acc = np.array(acc, np.float32)
    for width in (8, 4, 2, 1):
        acc[..., :width] = acc[..., :width] + acc[..., width:2 * width]
    return acc[..., 0]


@njit(inline="always", cache=True)
def dot16(a, b, n):
    """sum(a[:n] * b[:n]) in the lane order: lane l adds a[k] * b[k] for k = l, l + 16, ..."""
    acc = np.zeros(LANES, np.float32)
    full = n - n % LANES
    for k0 in range(0, full, LANES):
        for lane in range(LANES):
            acc[lane] = acc[lane] + a[k0 + lane] * b[k0 + lane]
    for k in range(full, n):
        acc[k - full] = acc[k - full] + a[k] * b[k]
    return tree_sum16(acc)


def dot16_numpy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The oracle's dot16 over the last axis (broadcast): (..., n) x (..., n) -> (...) float32."""
    a, b = np.broadcast_arrays(np.asarray(a, np.float32), np.asarray(b, np.float32))
    n = a.shape[-1]
    acc = np.zeros(a.shape[:-1] + (LANES,), np.float32)
    for k0 in range(0, n, LANES):
        width = min(LANES, n - k0)
        acc[..., :width] = acc[..., :width] + a[..., k0:k0 + width] * b[..., k0:k0 + width]
    return tree_sum16_numpy(acc)
