"""The linear kernels: y[r, o] = sum_k x[r, k] W[o, k], on the weights as stored.

One arithmetic for every row, whatever the call: prefill, decode, draft, verify, tree and
batched rows all run these kernels, and a row's bits depend only on its own inputs.

The definition (float32, every operation rounded on its own: no FMA, no reassociation):
- Float weights (float32, or float16 widened exactly): per output o, one accumulator
  a = 0, then a = a + x[k] * W[o, k] for k = 0, 1, ..., K - 1 in order.
- Quantized weights, w = q * scale[o, g] + min[o, g] for the columns k of group g (scale
  and min in float32, float16 ones widened exactly at load; codes
  q of 2, 4 or 8 bits in the file's stored column order; act-order is applied to x by the
  caller, which also pads x with zeros to the padded width): since the sum of x w over a
  group is scale * (sum x q) + min * (sum x),
      s[g] = x[k0] + x[k0 + 1] + ... in order over the group's columns   (per row, group_sums)
      p    = x[k0] * q[k0] + x[k0 + 1] * q[k0 + 1] + ... in order         (per row, output, group)
      a    = a + (scale[o, g] * p + min[o, g] * s[g])                      groups in order
  Codes are exact small integers in float32, so q costs no rounding.

Why no row can see another: the sums run over k for one (row, output) at a time, in one
thread; rows are processed in blocks of 4 that share the unpacked weight bytes, but each
row keeps its own accumulators, and a block of 4 performs, per row, the very operations
of a single row. Threads split (row chunk, output tile) pairs, never a sum. Vectorisation
runs across the 16 outputs of a tile, which never meet. So the bits of a row depend on
its own x and the weights only: not on the row count (1, 16, 65, 4096), the row's place in
the call, the thread count or the CPU.

The weights are re-laid once at load (cpu/linear.py) into tiles of TILE = 16 outputs, the
stored bytes kept whole: tiles[t, b, j] is byte b of output row t * 16 + j's codes, so one
16-byte load feeds 16 outputs. The loops are written out by scripts/gen_linear_kernels.py
(linear_generated.py); its docstring says why.
"""
import numpy as np
from numba import njit

from tinyloop.backends.cpu.kernels import linear_generated as generated

TILE = 16
KERNELS = {"q8": generated.linear_q8, "q4": generated.linear_q4, "q2": generated.linear_q2,
           "f32": generated.linear_f32, "f16": generated.linear_f16}
# The same bodies on the calling thread alone (prange is range there), for small calls: waking
# the other threads costs more than they save, and switching numba's thread count per call
# costs microseconds of its own. Same code, so the same bits.
SERIAL_KERNELS = {kind: njit(cache=True)(kernel.py_func) for kind, kernel in KERNELS.items()}


@njit(cache=True)
def group_sums(x, group_size):
    """x: (T, K) float32 -> (T, K / group_size): each group's columns added in order."""
    n_rows, k_dim = x.shape
    n_groups = k_dim // group_size
    sums = np.zeros((n_rows, n_groups), np.float32)
    for r in range(n_rows):
        for g in range(n_groups):
            s = np.float32(0.0)
            for k in range(g * group_size, (g + 1) * group_size):
                s = s + x[r, k]
            sums[r, g] = s
    return sums


def tiles_of(rows: np.ndarray) -> np.ndarray:
    """(N, W) per-output rows (codes' bytes, scales, float weights) -> (ceil(N / 16), W, 16),
    tiles[t, w, j] = rows[16 t + j, w]; missing outputs of the last tile are zeros."""
    n, width = rows.shape
    padded = -(-n // TILE) * TILE
    grown = np.zeros((padded, width), rows.dtype)
    grown[:n] = rows
    return np.ascontiguousarray(grown.reshape(padded // TILE, TILE, width).transpose(0, 2, 1))


def warm_up(kind: str) -> None:
    """Compile (or load from numba's cache) the kernel of one weight kind ("q4", "f32", ...) on
    tiny arrays, so no request pays for it. The backend calls it the first time a model's
    weights need the kind: a Q4_1 model never compiles the int2 kernel."""
    x = np.zeros((5, 32), np.float32)
    out = np.zeros((5, TILE), np.float32)
    for kernel in (KERNELS[kind], SERIAL_KERNELS[kind]):
        if kind.startswith("q"):
            bits = int(kind[1:])
            kernel(x, group_sums(x, 16), np.zeros((1, 32 * bits // 8, TILE), np.uint8),
                   np.zeros((1, 2, TILE), np.float32), np.zeros((1, 2, TILE), np.float32), 16 * bits // 8, TILE,
                   out, 0)
        else:
            kernel(x, np.zeros((1, 32, TILE), np.float32 if kind == "f32" else np.uint16), TILE, out, 0)
