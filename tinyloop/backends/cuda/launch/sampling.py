"""Launch geometry for cuda/sampling.cu: one block per logits row. logits: (T, V) float32,
C-contiguous; outputs preallocated by the caller."""
import numpy as np

from tinyloop.backends.reference.twins.sampling import ROW_THREADS, TOPK_MAX

TOPK_THREADS = 512           # top_k_rows: each pass over the row is spread over more threads


def _rows(logits) -> tuple[int, int]:
    if logits.dtype != np.float32 or logits.ndim != 2 or not logits.flags.c_contiguous:
        raise ValueError(f"expected C-contiguous (T, V) float32 logits, got {logits.dtype} "
                         f"shape {logits.shape}")
    return logits.shape


def argmax(module, logits, ids_out):
    """ids_out: (T,) int32 <- each row's largest value, the lowest id on ties (first NaN if any)."""
    rows, vocab = _rows(logits)
    if rows:
        module.get_function("argmax_rows")((rows,), (ROW_THREADS,),
                                           (logits, np.int32(rows), np.int32(vocab), ids_out))
    return ids_out


def top_k(module, logits, k: int, ids_out, values_out):
    """ids_out: (T, k) int32, values_out: (T, k) float32 <- the k largest values of each row,
    descending, ties to the lower id (NaN above +inf). 1 <= k <= min(V, 64): for k >= V the
    caller wants every id, which top_k with k = V gives when V <= 64."""
    rows, vocab = _rows(logits)
    if not 1 <= k <= min(vocab, TOPK_MAX):
        raise ValueError(f"top_k needs 1 <= k <= min(V, {TOPK_MAX}) = {min(vocab, TOPK_MAX)}, got k={k}")
    if ids_out.shape != (rows, k) or values_out.shape != (rows, k):
        raise ValueError(f"top_k outputs must be ({rows}, {k}), got {ids_out.shape} and {values_out.shape}")
    if rows:
        module.get_function("top_k_rows")((rows,), (TOPK_THREADS,),
                                          (logits, np.int32(rows), np.int32(vocab), np.int32(k),
                                           ids_out, values_out))
    return ids_out, values_out


def logsumexp(module, logits, out):
    """out: (T,) float64 <- log(sum(exp(row))) computed stably in double."""
    rows, vocab = _rows(logits)
    if rows:
        module.get_function("logsumexp_rows")((rows,), (ROW_THREADS,),
                                              (logits, np.int32(rows), np.int32(vocab), out))
    return out
