"""Twins of cuda/common.cuh: the exp polynomial, the fused multiply-add and the warp butterfly
sum, float32 op for op."""
import numpy as np

F = np.float32
_LOG2E, _LN2_HI, _LN2_LO = F(1.44269502), F(0.693359375), F(-2.12194440e-4)
_TAYLOR = [F(1.98412698e-4), F(1.38888889e-3), F(8.33333333e-3), F(4.16666667e-2),
           F(1.66666667e-1), F(0.5), F(1.0), F(1.0)]


def exp_f32(x) -> np.ndarray:
    """tl_exp: float32 array -> float32 array, the same bits as the kernel's exp."""
    x = np.asarray(x, F)
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        n = np.rint(x * _LOG2E)
        r = x - n * _LN2_HI
        r = r - n * _LN2_LO
        p = _TAYLOR[0]
        for c in _TAYLOR[1:]:
            p = p * r + c                    # two float32 roundings: mul, then add
        n_safe = np.where(np.isfinite(n), n, 0).astype(np.int64)
        e1 = np.trunc(n_safe / 2).astype(np.int64)              # C integer division truncates
        e2 = n_safe - e1
        s1 = ((e1 + 127) << 23).astype(np.uint32).view(F)
        s2 = ((e2 + 127) << 23).astype(np.uint32).view(F)
        out = (p * s1) * s2
    out = np.where(x < F(-104.0), F(0), out)
    out = np.where(x > F(88.8), F(np.inf), out)
    return np.where(np.isnan(x), x, out).astype(F)


def warp_sum(lanes: np.ndarray) -> np.ndarray:
    """tl_warp_sum over the last axis (32 lanes): xor butterfly 16, 8, 4, 2, 1 -> lane 0's value."""
    v = np.asarray(lanes, F)
    assert v.shape[-1] == 32
    lane = np.arange(32)
    for offset in (16, 8, 4, 2, 1):
        v = v + v[..., lane ^ offset]
    return v[..., 0]


def fma_f32(a, b, c) -> np.ndarray:
    """tl_fma (__fmaf_rn): float32 a * b + c rounded once to float32, elementwise.

    The product is exact in float64 (24 + 24 significant bits), and the float64 sum s with
    its exact error e (TwoSum) is the exact value s + e. Rounding s + e to float64 "to odd"
    (an inexact s whose last bit is even moves one step towards e) and then to float32
    rounds the exact value once: float64 keeps more than float32's bits + 2, which is what
    rounding to odd first needs. Special values (infinities, NaN) take the float64 sum."""
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.asarray(a, F).astype(np.float64) * np.asarray(b, F).astype(np.float64)
        c = np.asarray(c, F).astype(np.float64)
        s = p + c
        t = s - p
        e = (p - (s - t)) + (c - t)                        # s + e == p + c exactly (finite s)
        even = (s.view(np.int64) & 1) == 0
        move = np.isfinite(s) & (e != 0) & even
        s = np.where(move, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
        return s.astype(F)
