"""The int4-h rotation: the fast Walsh-Hadamard transform in one fixed order, then one multiply.

fwht(x) for a row of hd values (a power of two): stages h = 1, 2, 4, ..., hd / 2, each
turning every pair (j, j + h) with j & h == 0 into (a + b, a - b); then every element
multiplied by float32(1 / sqrt(hd)) (kv/modes.py's hadamard() entries, rounded the same).
It equals x @ hadamard(hd) up to rounding, and its order is fixed by hd alone: each
element is a float32 expression that does not depend on the row's neighbours, on the
thread or on the vector width (the j loop of a stage vectorises across independent pairs).
This is the arithmetic of the CUDA twin (backends/reference/twins/kv.py fwht), so the CPU's
int4-h cache holds the very bits the GPU's does.
"""
import numpy as np
from numba import njit, prange

F = np.float32


def hadamard_norm(head_dim: int) -> np.float32:
    """float32(1 / sqrt(hd)), as kv/modes.py's hadamard() rounds its entries."""
    return F(1.0 / np.sqrt(head_dim))


@njit(inline="always", cache=True)
def fwht_row(x, n, norm):
    """x: (>= n,) float32, rotated in place over its first n entries."""
    h = 1
    while h < n:
        for start in range(0, n, 2 * h):
            for j in range(start, start + h):
                a = x[j]
                b = x[j + h]
                x[j] = a + b
                x[j + h] = a - b
        h *= 2
    for j in range(n):
        x[j] = x[j] * norm


@njit(parallel=True, cache=True)
def fwht_rows(x, out, norm):
    """x: (N, hd) float32 (any strides) -> out (N, hd) C-contiguous, each row rotated alone."""
    n_rows, head_dim = x.shape
    for i in prange(n_rows):
        for j in range(head_dim):
            out[i, j] = x[i, j]
        fwht_row(out[i], head_dim, norm)


def rotate(x: np.ndarray) -> np.ndarray:
    """(..., hd) float32 -> fwht of every row: (..., hd) float32, a new array."""
    x = np.asarray(x, F)
    head_dim = x.shape[-1]
    if head_dim & (head_dim - 1):
        raise ValueError(f"the Hadamard rotation needs a power-of-two head_dim, got {head_dim}")
    flat = np.ascontiguousarray(x.reshape(-1, head_dim))
    out = np.empty(flat.shape, F)
    fwht_rows(flat, out, hadamard_norm(head_dim))
    return out.reshape(x.shape)
