"""Top-k candidate ids on the host (NumPy): the reference for the device-side top-k; and
the log-normalizer, a compiled fixed-order float64 computation (kernels/topk.py)."""
import numpy as np

from tinyloop.backends.reference.topk import top_k_ids  # noqa: F401  (the host's selection, unchanged)
from tinyloop.backends.cpu.kernels import rows as _kernels


def log_normalizer(scores: np.ndarray) -> float:
    """log(sum(exp(scores))) of a (V,) float64 row, computed stably: top + log(sum(exp(s - top)))
    with our own float64 exp and log and the sum in the lanes order (kernels/topk.py), so the
    same bits on every CPU (np.exp / np.log may differ in the last bit between CPUs)."""
    return _kernels.log_normalizer(scores)
