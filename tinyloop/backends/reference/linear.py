"""Linear layers: y = x @ W (+ b), with W stored (in, out) for fast row products."""
import numpy as np

from tinyloop.backends.reference.layout import canonical


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None,
           exact: bool = True) -> np.ndarray:
    """x: (T, in), weight: (in, out), bias: (out,) -> (T, out) float32.

    exact=True issues one matrix-vector product per row. OpenBLAS picks a different
    summation order for a single row (gemv) than for a block of rows (gemm), and
    different blockings for different row counts; a stacked (T, 1, in) @ (in, out)
    product makes NumPy call gemv once per row, on a contiguous row (layout.py) and
    the layer's one weight array, so each row's result is the same whatever T is and
    wherever x came from. exact=False is plain GEMM, for the prompt's prefill.
    """
    x = canonical(x)
    if exact:
        out = (x[:, None, :] @ weight)[:, 0, :]          # (T, out)
    else:
        out = x @ weight                                  # (T, out)
    if bias is not None:
        out += bias
    return out
