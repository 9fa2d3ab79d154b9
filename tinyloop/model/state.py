"""The seeded random initial state of a recurrence (config.initial_state = "random").

Recurrent-depth models such as Huginn start their core iterations from noise rather
than from the prelude's output. Their reference code draws it from the framework's
global generator, which no other implementation can reproduce; here a token's noise is
a function of (state_seed, position) alone, so prefill, decode, draft and verify, and
any batch, give a token the same state (the exactness rule), and two runs the same text.
"""
from __future__ import annotations

import numpy as np

TRUNCATE_AT = 3.0       # the reference's truncated normal is cut at +-3 standard deviations


def initial_state(std: float, seed: int, positions, dim: int) -> np.ndarray:
    """-> (T, dim) float32: per position, a standard normal truncated to [-3, 3]
    (out-of-range draws redrawn from the same stream) times std."""
    positions = np.asarray(positions, np.int64)
    out = np.zeros((positions.shape[0], dim), np.float32)
    if std == 0:
        return out
    for row, position in enumerate(positions):
        rng = np.random.default_rng([seed, int(position)])
        z = rng.standard_normal(dim)
        outside = np.abs(z) > TRUNCATE_AT
        while outside.any():
            z[outside] = rng.standard_normal(int(outside.sum()))
            outside = np.abs(z) > TRUNCATE_AT
        out[row] = z * std
    return out
