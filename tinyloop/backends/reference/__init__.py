"""The NumPy reference backend: NumPy/OpenBLAS kernels of the forward pass (backend.py puts
them behind the Backend interface of backends/base.py), chosen with TINYLOOP_CPU_KERNELS=numpy.

The product's CPU path is backends/cpu/ (our own compiled kernels). This backend is kept as
a reference the tests compare against (an independent implementation of the same model),
and twins/ holds each CUDA kernel's NumPy twin, its specification op for op. Because BLAS
chooses its summation order per call, this backend cannot promise that a row's bits are
independent of the rows computed beside it in a prefill (`row_invariant` is False): with it
the engine runs one generation at a time and the prefix cache is off (engine/engine.py).

Two flavours of the row-wise products exist:
- `exact` (row-invariant): the result for one position does not depend on how many
  positions share the call. Used by decode, draft and verify, so that a verify pass
  over T positions equals T decode steps bit for bit.
- `bulk`: full GEMM, fastest for the prompt's prefill, which every mode shares.

The exact path's invariant: one arithmetic per row, whatever the path. For a given
query row, every product and reduction receives operands of the same shape, strides,
dtype and call pattern, whether the row comes from a plain decode step, a chain
verify, a tree verify, a sliding window or a ring buffer:
- linear: one gemv per row, (1, in) contiguous @ the layer's one (in, out) weight;
- attention scores: one fixed-shape product per (KV head, query, block of 64 keys),
  the query heads of the KV head's group together, (group, hd) @ (hd, 64), the key
  block a C-contiguous (64, hd) matrix (a view of the cache, or a copy when its rows
  were gathered from a ring, a tree path or a quantized store);
- probability . value: one product per (KV head, query, block), (group, 64) @ a
  C-contiguous (64, hd + 1) value block whose last column holds ones, so the same call
  yields the block's probability sum;
- block combine: a sum over the blocks strictly in index order (attention.sequential_sum);
  blocks outside a query's range hold exact zeros, and x + 0 = x;
- norms: sums over a row's own contiguous D values; everything else (RoPE's complex
  product included) is elementwise.
Why it holds: BLAS and NumPy choose a kernel, and so a summation order, from the call
(shapes, strides, transposition, thread count), not from the values; layout.py gives
every call the same strides, and the shapes depend only on the model. Alignment
does not enter (measured under every OpenBLAS core type this project tests). The
elementwise functions (exp, tanh, sqrt, division, the complex product) give each element
the same bits wherever it sits in an array, and NumPy sums an axis that is not the
innermost in index order. `tests/test_layout_invariance.py` pins each of these
assumptions, and `scripts/exactness_matrix.py` re-runs the exactness tests under
every OpenBLAS core type and NumPy SIMD level the CPU can execute.
"""
from tinyloop.backends.reference.backend import NumpyBackend, DenseLinear

__all__ = ["NumpyBackend", "DenseLinear"]
