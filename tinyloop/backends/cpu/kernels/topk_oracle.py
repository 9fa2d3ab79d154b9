"""The oracle of topk.py in NumPy: argmax and top-k from a lexicographic sort on (rank of
the value, id), the rank written independently of the kernel's bit keys (NaN first,
then the values descending with -0 == +0), and the log-normalizer from rows_f64_oracle's
exp / log with the sum as an explicit loop in the lanes order."""
import numpy as np

from tinyloop.backends.cpu.kernels.lanes import LANES
from tinyloop.backends.cpu.kernels.rows_f64_oracle import exp_f64, log_f64


def ranked_ids(row: np.ndarray) -> np.ndarray:
    """(V,) float32 -> all ids, best first: NaNs first (by id), then by value descending
    (-0 == +0), ties by id."""
    row = np.asarray(row, np.float32)
    nan = np.isnan(row)
    value = np.where(nan, 0, row).astype(np.float64) + 0.0          # -0 -> +0
    ids = np.arange(row.shape[0])
    return ids[np.lexsort((ids, -value, ~nan))]


def argmax(logits) -> np.ndarray:
    return np.array([ranked_ids(row)[0] for row in np.asarray(logits, np.float32)], np.int64)


def top_k(logits, k: int):
    logits = np.asarray(logits, np.float32)
    n = min(k, logits.shape[1]) if k > 0 else 0
    ids = np.array([ranked_ids(row)[:n] for row in logits], np.int64).reshape(len(logits), n)
    values = np.take_along_axis(logits, ids, axis=1).astype(np.float64)
    return ids, values, np.array([log_normalizer(row) for row in logits])


def log_normalizer(row) -> float:
    row = np.asarray(row)
    row = row.astype(np.float64)
    if np.isnan(row).any():
        return float("nan")
    top = row.max()
    with np.errstate(invalid="ignore"):
        terms = exp_f64(row - top)
    acc = np.zeros(LANES)
    for k0 in range(0, row.shape[0], LANES):                          # lane l: k = l, l + 16, ...
        chunk = terms[k0:k0 + LANES]
        acc[:chunk.shape[0]] = acc[:chunk.shape[0]] + chunk
    for width in (8, 4, 2, 1):
        acc[:width] = acc[:width] + acc[width:2 * width]
    return float(top + log_f64(acc[0])[0])
