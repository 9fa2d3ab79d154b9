"""The oracle of rows_f64.py: exp_f64, log_f64 and sincos_f64 replayed step by step in
NumPy float64 elementwise operations (one ufunc per IEEE operation)."""
import numpy as np

D = np.float64


class K:
    """The constants, from fdlibm's e_exp.c, e_log.c, k_sin.c, k_cos.c and e_rem_pio2.c,
    written here again (not imported, so a changed constant in the kernel fails the tests)."""
    EXP_INV_LN2 = D(1.44269504088896338700e+00)
    EXP_LN2_HI = D(6.93147180369123816490e-01)
    EXP_LN2_LO = D(1.90821492927058770002e-10)
    EXP_P1, EXP_P2 = D(1.66666666666666019037e-01), D(-2.77777777770155933842e-03)
    EXP_P3, EXP_P4 = D(6.61375632143793436117e-05), D(-1.65339022054652515390e-06)
    EXP_P5 = D(4.13813679705723846039e-08)
    EXP_HIGH, EXP_LOW = D(7.09782712893383973096e+02), D(-7.45133219101941108420e+02)
    LG1, LG2, LG3 = D(6.666666666666735130e-01), D(3.999999999940941908e-01), D(2.857142874366239149e-01)
    LG4, LG5, LG6 = D(2.222219843214978396e-01), D(1.818357216161805012e-01), D(1.531383769920937332e-01)
    LG7 = D(1.479819860511658591e-01)
    SQRT2 = D(np.sqrt(2.0))
    INV_PIO2 = D(6.36619772367581382433e-01)
    PIO2_1 = D(1.57079632673412561417e+00)
    PIO2_1T = D(6.07710050650619224932e-11)
    S1, S2 = D(-1.66666666666666324348e-01), D(8.33333333332248946124e-03)
    S3, S4 = D(-1.98412698298579493134e-04), D(2.75573137070700676789e-06)
    S5, S6 = D(-2.50507602534068634195e-08), D(1.58969099521155010221e-10)
    C1, C2 = D(4.16666666666666019037e-02), D(-1.38888888888741095749e-03)
    C3, C4 = D(2.48015872894767294178e-05), D(-2.75573143513906633035e-07)
    C5, C6 = D(2.08757232129817482790e-09), D(-1.13596475577881948265e-11)



def _pow2(k: np.ndarray) -> np.ndarray:
    return ((k + 1023) << 52).astype(np.int64).view(D)


def exp_f64(x) -> np.ndarray:
    x = np.asarray(x, D)
    with np.errstate(all="ignore"):
        c = np.minimum(np.maximum(x, K.EXP_LOW), K.EXP_HIGH)
        kf = np.floor(c * K.EXP_INV_LN2 + D(0.5))
        hi = c - kf * K.EXP_LN2_HI
        lo = kf * K.EXP_LN2_LO
        r = hi - lo
        t = r * r
        p = r - t * (K.EXP_P1 + t * (K.EXP_P2 + t * (K.EXP_P3 + t * (K.EXP_P4 + t * K.EXP_P5))))
        y = D(1.0) - ((lo - (r * p) / (D(2.0) - p)) - hi)
        k = np.where(np.isnan(kf), 0, kf).astype(np.int64)
        half = k >> 1
        y = (y * _pow2(half)) * _pow2(k - half)
    y = np.where(x < K.EXP_LOW, D(0), y)
    y = np.where(x > K.EXP_HIGH, D(np.inf), y)
    return np.where(x != x, x, y)


def log_f64(x) -> np.ndarray:
    x = np.atleast_1d(np.asarray(x, D))
    out = np.full(x.shape, np.nan)
    out[x == 0] = -np.inf
    out[x == np.inf] = np.inf
    ok = (x > 0) & (x < np.inf)
    v = x[ok]
    m, e = np.frexp(v)                          # v = m 2**e, m in [0.5, 1): exact
    m, k = m * D(2.0), e - 1                    # [1, 2)
    high = m > K.SQRT2
    m = np.where(high, m * D(0.5), m)
    k = np.where(high, k + 1, k)
    f = m - D(1.0)
    s = f / (D(2.0) + f)
    z = s * s
    w = z * z
    t1 = w * (K.LG2 + w * (K.LG4 + w * K.LG6))
    t2 = z * (K.LG1 + w * (K.LG3 + w * (K.LG5 + w * K.LG7)))
    r = t2 + t1
    hfsq = D(0.5) * f * f
    dk = k.astype(D)
    out[ok] = dk * K.EXP_LN2_HI - ((hfsq - (s * (hfsq + r) + dk * K.EXP_LN2_LO)) - f)
    return out


def sincos_f64(x):
    x = np.asarray(x, D)
    fn = np.floor(x * K.INV_PIO2 + D(0.5))
    r = x - fn * K.PIO2_1
    w = fn * K.PIO2_1T
    y0 = r - w
    y1 = (r - y0) - w
    z = y0 * y0
    v = z * y0
    rs = K.S2 + z * (K.S3 + z * (K.S4 + z * (K.S5 + z * K.S6)))
    s = y0 - ((z * (D(0.5) * y1 - v * rs) - y1) - v * K.S1)
    rc = z * (K.C1 + z * (K.C2 + z * (K.C3 + z * (K.C4 + z * (K.C5 + z * K.C6)))))
    hz = D(0.5) * z
    wc = D(1.0) - hz
    c = wc + (((D(1.0) - wc) - hz) + (z * rc - y0 * y1))
    q = fn.astype(np.int64) & 3
    sin = np.choose(q, [s, c, -s, -c])
    cos = np.choose(q, [c, -s, -c, s])
    return sin, cos
