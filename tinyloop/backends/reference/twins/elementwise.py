"""Twins of cuda/elementwise.cu: the same float32 operations in the same order, so the
kernels and these functions agree bit for bit. The CPU backend's norms.py, positions.py
and activations.py stay the reference for what each op means; they differ from these
in the order of the norms' sums (NumPy's pairwise sum), in exp (np.exp) and in tanh."""
import numpy as np

from tinyloop.backends.reference.twins.arith import exp_f32, warp_sum

F = np.float32
NORM_THREADS = 256                     # the norms' block size: it fixes their sum order
_SQRT_2_OVER_PI = F(0.7978845608028654)
_GELU_CUBIC = F(0.044715)


def embed_rows(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """table: (V, D), ids: (T,) -> (T, D)."""
    return table[np.asarray(ids)]


def add_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (np.asarray(a, F) + np.asarray(b, F)).astype(F)


def norm_row_sum(values: np.ndarray) -> np.ndarray:
    """values: (T, D) float32 -> (T,): the kernels' norm_block_sum over each row. Thread t
    adds elements t, t + 256, ... in order from 0; each warp's 32 partials go through the
    xor butterfly; the 8 warp totals through a halving tree."""
    rows, width = values.shape
    partial = np.zeros((rows, NORM_THREADS), F)                           # (T, 256)
    for start in range(0, width, NORM_THREADS):
        chunk = values[:, start:start + NORM_THREADS]
        partial[:, :chunk.shape[1]] = partial[:, :chunk.shape[1]] + chunk
    warps = warp_sum(partial.reshape(rows, NORM_THREADS // 32, 32))      # (T, 8)
    half = warps.shape[1] // 2
    while half:
        warps = warps[:, :half] + warps[:, half:2 * half]
        half //= 2
    return warps[:, 0]


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x: (T, D), weight: (D,) -> (T, D) = (x * inv) * weight, inv = 1 / sqrt(mean(x^2) + eps)."""
    x = np.asarray(x, F)
    with np.errstate(over="ignore"):                                     # squares may overflow, as on the GPU
        mean_square = norm_row_sum(x * x) / F(x.shape[1])                # (T,)
    inv = F(1.0) / np.sqrt(mean_square + F(eps))
    return (x * inv[:, None]) * weight


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None, eps: float) -> np.ndarray:
    """x: (T, D), weight / bias: (D,) -> (T, D) = ((x - mean) * inv) * weight (+ bias)."""
    x = np.asarray(x, F)
    width = F(x.shape[1])
    with np.errstate(over="ignore"):
        centered = x - (norm_row_sum(x) / width)[:, None]                 # (T, D)
        variance = norm_row_sum(centered * centered) / width              # (T,)
    out = (centered * (F(1.0) / np.sqrt(variance + F(eps)))[:, None]) * weight
    return out if bias is None else out + bias


def rope_rows(x: np.ndarray, rotation: np.ndarray) -> np.ndarray:
    """x: (T, heads, hd) float32, rotation: (T, hd/2) complex64 -> (T, heads, hd):
    (a, b) -> (a c - b d, a d + b c), products first, never fused."""
    x = np.asarray(x, F)
    a, b = x[..., 0::2], x[..., 1::2]                                     # (T, heads, hd/2)
    c, d = rotation.real[:, None, :], rotation.imag[:, None, :]           # (T, 1, hd/2)
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * d
    out[..., 1::2] = a * d + b * c
    return out


def swiglu(up: np.ndarray, ffn_dim: int) -> np.ndarray:
    """up: (T, 2 ffn) = [gate | up] -> (T, ffn) = (g / (1 + exp(-g))) * up."""
    gate, value = up[:, :ffn_dim], up[:, ffn_dim:]
    with np.errstate(over="ignore", invalid="ignore"):
        return (gate / (F(1.0) + exp_f32(np.negative(gate)))) * value


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """(0.5 x) (1 + tanh(u)), u = sqrt(2/pi) (x + ((0.044715 x) x) x); tanh(u) =
    sign(u) (1 - e) / (1 + e), e = exp(-2|u|) (never overflows; 0 for large |u|)."""
    x = np.asarray(x, F)
    with np.errstate(over="ignore", invalid="ignore"):
        u = _SQRT_2_OVER_PI * (x + ((_GELU_CUBIC * x) * x) * x)
        e = exp_f32(F(-2.0) * np.abs(u))
        t = (F(1.0) - e) / (F(1.0) + e)
        t = np.where(u < F(0), -t, t)
        return (F(0.5) * x) * (F(1.0) + t)
