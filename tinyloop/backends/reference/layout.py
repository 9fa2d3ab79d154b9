"""The one operand layout of the exact path.

BLAS and NumPy pick their kernel, and with it the order in which a dot product is
summed, from the call: shapes, strides (a matrix's leading dimension, a vector's
increment), transposition and thread count. Two calls that agree on all of those sum
in the same order; two that differ in any of them may not, and on some CPUs do.
Measured with NumPy 2.4's OpenBLAS 0.3.31: a (1, 8) @ (8, 64) product whose (64, 8)
key block has rows 16 floats apart (a fancy-index gather with two KV heads) differs
in the last bits from the same block stored with rows 8 floats apart under the
SkylakeX kernels, and agrees under Prescott, Nehalem, Sandybridge and Haswell. What
did not matter under any of them: where the operands start in memory (alignment).

So every product and reduction on the exact path first brings its operands into one
canonical layout, whatever produced them: a slice of the cache, a ring-buffer gather,
a dequantized copy, a draft tree's path gather. For a row vector or a row batch that
is C-contiguous float32. For a stack of matrices (attention's 64-key blocks) it is
each matrix C-contiguous float32: BLAS sees one 2-D matrix per call (its pointer,
leading dimension and shape), never the strides between the matrices of a stack, so
a view of the cache whose blocks are contiguous needs no copy. After that, the call
a given query row makes depends only on the model's shapes.
"""
import numpy as np


def canonical(x) -> np.ndarray:
    """x as C-contiguous float32 (no copy when it already is)."""
    return np.ascontiguousarray(x, dtype=np.float32)


def canonical_blocks(x) -> np.ndarray:
    """A stack of matrices (..., rows, cols) with each matrix C-contiguous float32 (no copy
    when each already is, whatever the strides between them)."""
    if (x.dtype == np.float32 and x.strides[-1] == 4 and x.strides[-2] == 4 * x.shape[-1]):
        return x
    return np.ascontiguousarray(x, dtype=np.float32)
