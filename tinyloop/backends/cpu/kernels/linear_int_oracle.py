"""The integer linear kernels' oracle: their definition (kernels/linear_int.py) in NumPy.

Written apart from the kernels: codes come from model.quant.unpack_codes (not the kernels'
lane layout), the activation quantization uses NumPy's max, rint and clip, each segment's
integer sum is an int64 matrix product (exact, so its order cannot matter), and the float
steps are NumPy elementwise float32 operations with the definition's parentheses, segment
after segment. Slow; for tests.
"""
import numpy as np

from tinyloop.model.quant import QuantizedTensor, unpack_codes

F = np.float32


def segment_length(group_size: int) -> int:
    return int(np.gcd(group_size, 32))


def quantize_activations(x: np.ndarray, segment: int):
    """x: (T, K) float32 -> xq (T, K) int64, dx, xs (T, K / segment) float32, sx int64."""
    n_rows, width = x.shape
    blocks = x.reshape(n_rows, width // segment, segment)
    finite = np.all(np.isfinite(blocks), axis=2)                                  # (T, n_seg)
    amax = np.max(np.abs(np.where(np.isfinite(blocks), blocks, F(0))), axis=2)
    dx = (amax / F(127)).astype(F)
    usable = finite & (dx != 0)
    safe = np.where(usable, dx, F(1))[:, :, None]
    scaled = np.where(usable[:, :, None] & np.isfinite(blocks), (blocks / safe).astype(F), F(0))
    xq = np.clip(np.rint(scaled), -127, 127).astype(np.int64)
    sx = xq.sum(axis=2)
    dx = np.where(finite, np.where(usable, dx, F(0)), F(np.nan)).astype(F)
    xs = (dx * sx.astype(F)).astype(F)
    return xq.reshape(n_rows, width), dx, xs, sx


def offset_of(tensor: QuantizedTensor) -> int:
    """z (kernels/linear_int.py): 128 for 8 bits; 2**(bits - 1) for 2 or 4 bits when every
    min is exactly -z * scale; else 0."""
    if tensor.bits == 8:
        return 128
    z = 1 << (tensor.bits - 1)
    scale, mins = (np.asarray(a).astype(F) for a in (tensor.scale, tensor.min))
    return z if np.all(mins == F(-z) * scale) else 0


def int_oracle(x: np.ndarray, tensor: QuantizedTensor) -> np.ndarray:
    """x: (T, in) float32 -> (T, out) float32: the bits the integer kernel writes (no bias)."""
    in_features = x.shape[1]
    q = unpack_codes(np.asarray(tensor.codes), tensor.bits).astype(np.int64)      # (N, padded), stored order
    padded = q.shape[1]
    source = np.asarray(tensor.perm) if tensor.perm is not None else np.arange(padded)
    stored_x = np.zeros((x.shape[0], padded), F)                                  # padding reads 0
    keep = source < in_features
    stored_x[:, keep] = x[:, source[keep]]
    z = offset_of(tensor)
    c = q - z
    scale = np.asarray(tensor.scale).astype(F)                                    # (N, G)
    mins = np.asarray(tensor.min).astype(F)
    folded = (mins + (F(z) * scale).astype(F)).astype(F) if z else mins
    s_len = segment_length(tensor.group_size)
    xq, dx, xs, _ = quantize_activations(stored_x, s_len)
    acc = np.zeros((x.shape[0], q.shape[0]), F)                                   # (T, N)
    for s in range(padded // s_len):
        g = s * s_len // tensor.group_size
        cols = slice(s * s_len, (s + 1) * s_len)
        isum = (xq[:, cols] @ c[:, cols].T).astype(F)                             # exact integers, then float
        term = ((scale[None, :, g] * dx[:, s, None]).astype(F) * isum).astype(F) \
            + (folded[None, :, g] * xs[:, s, None]).astype(F)
        acc = (acc + term.astype(F)).astype(F)
    return acc
