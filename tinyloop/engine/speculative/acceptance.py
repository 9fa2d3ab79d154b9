"""Deciding, at one tree node, which drafted child (if any) the verifier accepts.

Greedy: the child whose token is the verifier's argmax, else the argmax itself is
the correction. Sampling (lossless, multi-candidate): the children were drawn
independently from the draft's distribution q; each in turn is accepted with
probability min(1, p(x) / q(x)), and after a rejection the target becomes the
normalised residual max(p - q, 0). If every child is rejected (or there is none)
the token is drawn from the current target. The emitted token is then distributed
exactly as p, whatever q is.
"""
from __future__ import annotations

import numpy as np


def accept_greedy(target_token: int, child_tokens: list[int]) -> int | None:
    """Index into child_tokens of the accepted child, or None."""
    for index, token in enumerate(child_tokens):
        if token == target_token:
            return index
    return None


def accept_sampled(target: np.ndarray, draft: np.ndarray | None, child_tokens: list[int],
                   rng: np.random.Generator) -> tuple[int | None, np.ndarray]:
    """target p, draft q: (V,) float64 distributions.

    Returns (index of the accepted child or None, the distribution to draw the
    correction from when None).
    """
    p = target
    for index, token in enumerate(child_tokens):
        # accept with probability min(1, p/q); one uniform per candidate looked at
        if rng.random() * draft[token] < p[token]:
            return index, p
        residual = np.maximum(p - draft, 0.0)
        total = residual.sum()
        if total <= 0.0:          # p <= q everywhere: p == q up to rounding, keep p
            continue
        p = residual / total
    return None, p
