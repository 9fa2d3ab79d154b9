"""Twins of cuda/sampling.cu. argmax and top-k rank by a 64-bit key that is distinct per
logit (value order, -0 == +0, NaN above +inf; then the lower id), so their result is one
exact set whatever the kernel's thread order; logsumexp follows the kernel's float64 sum
order (the kernel's exp and log are CUDA's, so compare within 1e-12, not bitwise)."""
import numpy as np

ROW_THREADS = 256                      # argmax_rows / logsumexp_rows block size: logsumexp's sum order
TOPK_MAX = 64                          # the largest k top_k_rows supports


def rank_keys(logits: np.ndarray) -> np.ndarray:
    """logits: (T, V) float32 -> (T, V) uint64, larger = ranked first."""
    logits = np.asarray(logits, np.float32)
    bits = logits.view(np.uint32).copy()
    bits[bits == np.uint32(0x80000000)] = 0                               # -0 ties with +0
    negative = (bits & np.uint32(0x80000000)) != 0
    key = np.where(negative, ~bits, bits | np.uint32(0x80000000))
    key = np.where(np.isnan(logits), np.uint32(0xFFFFFFFF), key).astype(np.uint64)
    ids = np.arange(logits.shape[1], dtype=np.uint64)
    return (key << np.uint64(32)) | (np.uint64(0xFFFFFFFF) - ids)


def argmax_rows(logits: np.ndarray) -> np.ndarray:
    """(T, V) -> (T,) int32: the largest value, the lowest id on ties, the first NaN if any."""
    return np.argmax(rank_keys(logits), axis=1).astype(np.int32)


def top_k_rows(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(T, V), 1 <= k <= min(V, 64) -> ids (T, k) int32, values (T, k) float32, best first."""
    logits = np.asarray(logits, np.float32)
    ids = np.argsort(rank_keys(logits), axis=1)[:, ::-1][:, :k].astype(np.int32)   # (T, k)
    return ids, np.take_along_axis(logits, ids, axis=1)


def logsumexp_rows(logits: np.ndarray) -> np.ndarray:
    """(T, V) -> (T,) float64 = m + log(sum exp(x - m)): thread t sums x[t], x[t + 256], ...
    in order, then a halving tree over the 256 partials."""
    logits = np.asarray(logits, np.float32)
    rows, width = logits.shape
    top = logits[np.arange(rows), argmax_rows(logits)].astype(np.float64)        # (T,)
    with np.errstate(invalid="ignore", over="ignore"):
        terms = np.exp(logits.astype(np.float64) - top[:, None])                 # (T, V)
        partial = np.zeros((rows, ROW_THREADS))                                   # (T, 256)
        for start in range(0, width, ROW_THREADS):
            chunk = terms[:, start:start + ROW_THREADS]
            partial[:, :chunk.shape[1]] = partial[:, :chunk.shape[1]] + chunk
        half = ROW_THREADS // 2
        while half:
            partial = partial[:, :half] + partial[:, half:2 * half]
            half //= 2
        return top + np.log(partial[:, 0])
