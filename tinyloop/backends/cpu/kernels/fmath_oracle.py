"""The oracle of fmath.py: exp_f32, tanh_f32 and silu_f32 transcribed into NumPy
elementwise float32 operations (one ufunc per IEEE operation, so every step rounds to
float32 exactly as the compiled kernel's step does). The tests compare the kernels with
these bit for bit; nothing here runs on the product's path."""
import numpy as np

F = np.float32


class K:
    """fmath's constants, written here again from their definitions (not imported, so a
    changed constant in the kernel fails the tests)."""
    LOG2E = F(1.4426950408889634)                # 1 / ln 2
    LN2_HI = F(0.693145751953125)                # ln 2 to 12 significant bits (exactly 2839 / 4096)
    LN2_LO = F(0.6931471805599453 - 0.693145751953125)
    EXP_HIGH = F(88.72283)
    EXP_LOW = F(-87.33654)
    C7, C6, C5, C4, C3, C2 = F(1 / 5040), F(1 / 720), F(1 / 120), F(1 / 24), F(1 / 6), F(0.5)
    ONE, HALF = F(1.0), F(0.5)



def exp_f32(x) -> np.ndarray:
    """fmath.exp_f32 over a float32 array."""
    x = np.asarray(x, F)
    with np.errstate(all="ignore"):
        c = np.minimum(np.maximum(x, K.EXP_LOW), K.EXP_HIGH)          # NaN: restored at the end
        n = np.floor(c * K.LOG2E + K.HALF)
        r = (c - n * K.LN2_HI) - n * K.LN2_LO
        p = K.C7 * r + K.C6
        for coefficient in (K.C5, K.C4, K.C3, K.C2, K.ONE, K.ONE):
            p = p * r + coefficient
        k = np.where(np.isnan(n), 0, n).astype(np.int32)
        half = k >> 1                                                   # floor(k / 2)
        scale_a = ((half + 127) << 23).astype(np.int32).view(F)
        scale_b = ((k - half + 127) << 23).astype(np.int32).view(F)
        y = (p * scale_a) * scale_b
    y = np.where(x < K.EXP_LOW, F(0), y)
    y = np.where(x > K.EXP_HIGH, F(np.inf), y)
    return np.where(x != x, x, y).astype(F)


def tanh_f32(x) -> np.ndarray:
    """fmath.tanh_f32: 1 - 2 / (e**(2|x|) + 1) with |x| capped at 10, the sign of x."""
    x = np.asarray(x, F)
    with np.errstate(all="ignore"):
        a = np.minimum(np.abs(x), F(10.0))
        t = F(1.0) - F(2.0) / (exp_f32(F(2.0) * a) + F(1.0))
    t = np.where(np.abs(x) > F(10.0), F(1.0), t).astype(F)
    return np.where(x >= F(0), t, np.where(x < F(0), -t, x)).astype(F)


def silu_f32(x) -> np.ndarray:
    """fmath.silu_f32: x / (1 + e**-x)."""
    x = np.asarray(x, F)
    with np.errstate(all="ignore"):
        return (x / (F(1.0) + exp_f32(np.negative(x)))).astype(F)
