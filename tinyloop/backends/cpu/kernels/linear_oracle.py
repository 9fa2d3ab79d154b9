"""The float linear kernels' oracle: their arithmetic (kernels/linear.py) in NumPy, from the definition
(linear_oracle also routes quantized parts to the integer kernels' oracle, linear_int_oracle.py).

Written apart from the kernels: codes come from model.quant.unpack_codes (not the kernels'
float peeling of a byte), half weights from NumPy's own float16 conversion, no tiles, and
every sum is a sequence of NumPy elementwise additions in the defined order (never np.sum,
np.dot or BLAS, whose order is theirs). Vectorised over rows and outputs; slow, for tests.
"""
import numpy as np

from tinyloop.model.quant import QuantizedTensor, unpack_codes

F = np.float32


def quant_oracle(x: np.ndarray, tensor: QuantizedTensor) -> np.ndarray:
    """x: (T, in) float32 -> (T, out) float32: the bits the quantized kernels write (no bias)."""
    in_features = x.shape[1]
    codes = unpack_codes(np.asarray(tensor.codes), tensor.bits).astype(F)    # (N, padded), stored order
    padded = codes.shape[1]
    source = np.asarray(tensor.perm) if tensor.perm is not None else np.arange(padded)
    stored_x = np.zeros((x.shape[0], padded), F)                             # (T, padded); padding reads 0
    keep = source < in_features
    stored_x[:, keep] = x[:, source[keep]]
    scale = np.asarray(tensor.scale).astype(F)                               # (N, G)
    mins = np.asarray(tensor.min).astype(F)
    gs = tensor.group_size
    acc = np.zeros((x.shape[0], codes.shape[0]), F)                          # (T, N)
    for g in range(scale.shape[1]):
        part = np.zeros_like(acc)
        x_sum = np.zeros(x.shape[0], F)
        for k in range(g * gs, (g + 1) * gs):
            part = part + stored_x[:, k, None] * codes[None, :, k]
            x_sum = x_sum + stored_x[:, k]
        acc = acc + (scale[None, :, g] * part + mins[None, :, g] * x_sum[:, None])
    return acc


def float_oracle(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """x: (T, K), weight: (N, K) float32 or float16 -> (T, N) float32, k summed in order."""
    x = np.asarray(x, F)
    weight = np.asarray(weight).astype(F)
    acc = np.zeros((x.shape[0], weight.shape[0]), F)
    for k in range(x.shape[1]):
        acc = acc + x[:, k, None] * weight[None, :, k]
    return acc


def linear_oracle(x: np.ndarray, parts, bias=None) -> np.ndarray:
    """The fused linear of `parts` (as prepare_linear takes them) applied to x, + bias: quantized
    parts by the integer kernels' definition where their group size allows it (a multiple of
    4 columns), else by the float one."""
    from tinyloop.backends.cpu.kernels.linear_int_oracle import int_oracle, segment_length

    def one(p):
        if not isinstance(p, QuantizedTensor):
            return float_oracle(x, p)
        return int_oracle(x, p) if segment_length(p.group_size) % 4 == 0 else quant_oracle(x, p)
    outs = [one(p) for p in parts]
    out = np.concatenate(outs, axis=1)
    return out if bias is None else out + np.asarray(bias, F)
