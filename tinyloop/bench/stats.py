"""Summaries of repeated runs: every figure is the median of its runs, with min and max."""
from __future__ import annotations

import math
import statistics
import time


def summarize(runs: list) -> dict:
    """{"median", "min", "max", "runs"} of one figure's measured runs."""
    return {"median": statistics.median(runs), "min": min(runs), "max": max(runs), "runs": list(runs)}


def ratio(numerator: dict, denominator: dict) -> dict | None:
    """numerator / denominator: the ratio of the medians, and the range of the per-run
    ratios (runs taken in the same rounds pair up, so drift hits both sides alike)."""
    if not numerator or not denominator or not denominator["median"]:
        return None
    pairs = [a / b for a, b in zip(numerator["runs"], denominator["runs"]) if b]
    return {"median": numerator["median"] / denominator["median"],
            "min": min(pairs) if pairs else None, "max": max(pairs) if pairs else None}


def percentile(values: list, share: float) -> float:
    """The nearest-rank percentile (share in [0, 1]) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, math.ceil(round(share * len(ordered), 9)))
    return ordered[min(rank, len(ordered)) - 1]


def repeat_for(min_seconds: float, once) -> tuple:
    """Call once() -> (count, seconds timed) until the timed seconds add up to min_seconds:
    (total count, total seconds). A 2 ms prefill timed once says more about the
    scheduler than about the code."""
    count = seconds = 0.0
    deadline = time.perf_counter() + 60 * max(min_seconds, 0.05)     # a guard, never reached in practice
    while seconds < min_seconds or count == 0:
        done, spent = once()
        count, seconds = count + done, seconds + spent
        if time.perf_counter() > deadline:
            break
    return count, seconds
