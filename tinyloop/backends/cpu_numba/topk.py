"""Top-k candidate ids on the host (NumPy): the reference for the device-side top-k; and
the log-normalizer, a compiled fixed-order float64 computation (kernels/topk.py)."""
import numpy as np

from tinyloop.backends.cpu_numba.kernels import rows as _kernels


def top_k_ids(scores: np.ndarray, k: int) -> np.ndarray:
    """The k best ids (all if k is 0 or >= V), by score descending, ties to the lower id."""
    if 0 < k < scores.shape[0]:
        # Everything strictly above the k-th value, then ties at it by lower id.
        kth = np.partition(scores, -k)[-k]
        above = np.flatnonzero(scores > kth)
        tied = np.flatnonzero(scores == kth)[:k - above.shape[0]]
        ids = np.concatenate([above, tied])
    else:
        ids = np.arange(scores.shape[0])
    order = np.lexsort((ids, -scores[ids]))
    return ids[order]


def log_normalizer(scores: np.ndarray) -> float:
    """log(sum(exp(scores))) of a (V,) float64 row, computed stably: top + log(sum(exp(s - top)))
    with our own float64 exp and log and the sum in the lanes order (kernels/topk.py), so the
    same bits on every CPU (np.exp / np.log may differ in the last bit between CPUs)."""
    return _kernels.log_normalizer(scores)
