"""Top-k candidate ids on the host (NumPy): the reference for the device-side top-k."""
import numpy as np


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
    """log(sum(exp(scores))) of a (V,) float64 row, computed stably."""
    top = scores.max()
    return float(top + np.log(np.exp(scores - top).sum()))
