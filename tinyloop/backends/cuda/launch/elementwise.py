"""Launch geometry for cuda/elementwise.cu. Arrays are device arrays (CuPy, or the CPU
harness's NumPy arrays), float32 unless named otherwise; outputs are preallocated by the
caller. Each function launches one kernel and returns its output.

The norms and the MLP activations write a float32 or a float16 `out` (fp16 activations:
the output is a linear layer's input, rounded to the nearest half); its dtype picks which."""
import numpy as np

from tinyloop.backends.reference.twins.elementwise import NORM_THREADS
from tinyloop.backends.cuda.launch.memory import may_overlap

ROW_THREADS = 256            # embed_rows, rope_rows: one block per row, threads stride the row
FLAT_THREADS = 256           # add_rows, swiglu, gelu_tanh: grid-stride loops
FLAT_MAX_BLOCKS = 4096       # enough blocks to fill every SM several times; more only costs launches


def _flat_grid(n: int) -> tuple:
    if n >= 2**31:
        raise ValueError(f"elementwise kernels take int sizes: {n} elements is over 2^31 - 1")
    return (max(1, min(-(-n // FLAT_THREADS), FLAT_MAX_BLOCKS)),)


def _row_stride(x) -> int:
    """x: (T, width) float32 with unit column stride -> its row stride in floats."""
    if x.dtype != np.float32 or x.ndim != 2 or (x.shape[1] > 1 and x.strides[1] != 4):
        raise ValueError(f"expected a (T, width) float32 array with contiguous rows, got "
                         f"{x.dtype} shape {x.shape} strides {x.strides}")
    return x.strides[0] // 4


def _out_half(out, *inputs) -> np.int32:
    """The kernels' out_half flag for `out` (float32 or float16); a half `out` cannot share
    memory with a float input (the kernels would read half-overwritten floats)."""
    if out.dtype == np.float32:
        return np.int32(0)
    if out.dtype != np.float16:
        raise ValueError(f"out must be float32 or float16, got {out.dtype}")
    for a in inputs:
        if a is not None and may_overlap(a, out):
            raise ValueError("a float16 out cannot be computed in place over its float32 input")
    return np.int32(1)


def _check_contiguous(*arrays) -> None:
    for a in arrays:
        if not a.flags.c_contiguous:
            raise ValueError(f"expected a C-contiguous array, got shape {a.shape} strides {a.strides}")


def embed(module, table, ids, out):
    """table: (V, D), ids: (T,) int32, out: (T, D) <- table[ids]."""
    _check_contiguous(table, ids, out)
    rows, width = out.shape
    if rows:
        module.get_function("embed_rows")((rows,), (ROW_THREADS,),
                                          (table, ids, out, np.int32(rows), np.int32(width)))
    return out


def add(module, a, b, out):
    """a, b, out: same shape, contiguous <- a + b (out may be a: the residual add in place)."""
    _check_contiguous(a, b, out)
    n = out.size
    if n:
        module.get_function("add_rows")(_flat_grid(n), (FLAT_THREADS,), (a, b, out, np.int32(n)))
    return out


def rms_norm(module, x, weight, eps: float, out):
    """x: (T, D) (row stride free), weight: (D,), out: (T, D) contiguous, float32 or float16."""
    _check_contiguous(weight, out)
    out_half = _out_half(out, x)
    rows, width = x.shape
    if rows:
        module.get_function("rms_norm")((rows,), (NORM_THREADS,),
                                        (x, np.int32(_row_stride(x)), weight, out, out_half,
                                         np.int32(rows), np.int32(width), np.float32(eps)))
    return out


def layer_norm(module, x, weight, bias, eps: float, out):
    """x: (T, D) (row stride free), weight, bias: (D,) (bias may be None), out: (T, D) contiguous,
    float32 or float16."""
    _check_contiguous(weight, out)
    out_half = _out_half(out, x)
    rows, width = x.shape
    if rows:
        module.get_function("layer_norm")((rows,), (NORM_THREADS,),
                                          (x, np.int32(_row_stride(x)), weight,
                                           weight if bias is None else bias, np.int32(bias is not None),
                                           out, out_half, np.int32(rows), np.int32(width), np.float32(eps)))
    return out


def rope(module, x, rotation):
    """x: (T, heads, hd), rotated in place: heads hd floats apart, any token stride (a view
    of the fused qkv output). rotation: (T, hd/2) complex64, contiguous."""
    rows, heads, head_dim = x.shape
    if x.dtype != np.float32 or x.strides[2] != 4 or (heads > 1 and x.strides[1] != 4 * head_dim):
        raise ValueError(f"rope expects (T, heads, hd) float32 with heads packed, got {x.dtype} "
                         f"strides {x.strides}")
    if rotation.dtype != np.complex64 or rotation.shape != (rows, head_dim // 2):
        raise ValueError(f"rotation must be ({rows}, {head_dim // 2}) complex64, got "
                         f"{rotation.dtype} {rotation.shape}")
    _check_contiguous(rotation)
    if rows:
        module.get_function("rope_rows")((rows,), (ROW_THREADS,),
                                         (x, np.int32(x.strides[0] // 4), rotation.view(np.float32),
                                          np.int32(rows), np.int32(heads), np.int32(head_dim)))
    return x


def swiglu(module, up, out):
    """up: (T, 2F) = [gate | up], out: (T, F) float32 or float16 <- silu(gate) * up."""
    _check_contiguous(up, out)
    out_half = _out_half(out, up)
    rows, ffn_dim = out.shape
    if up.shape != (rows, 2 * ffn_dim):
        raise ValueError(f"swiglu: up must be ({rows}, {2 * ffn_dim}), got {up.shape}")
    if out.size:
        module.get_function("swiglu")(_flat_grid(out.size), (FLAT_THREADS,),
                                      (up, out, out_half, np.int32(rows), np.int32(ffn_dim)))
    return out


def gelu(module, x, out):
    """x, out: same shape, contiguous <- GELU (tanh) of x; out float32 (may be x) or float16."""
    _check_contiguous(x, out)
    out_half = _out_half(out, x)
    n = out.size
    if n:
        module.get_function("gelu_tanh")(_flat_grid(n), (FLAT_THREADS,), (x, out, out_half, np.int32(n)))
    return out
