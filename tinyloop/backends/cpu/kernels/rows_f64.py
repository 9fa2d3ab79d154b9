"""float64 exp, log, sin and cos of our own, from IEEE additions, multiplications and
divisions only (no libm, no FMA), so they give the same bits on every CPU and numba target.

Why: NumPy's float64 exp/sin/cos pick AVX-512 or baseline code by CPU, and glibc's exp/log
pick an FMA or a plain variant (ifunc), so their last bit may differ between machines. The
log-normalizer of top_k (topk.py) and the RoPE table (rope.py) are built on these instead.

The algorithms are fdlibm's (Sun's freely distributable libm, also FreeBSD's msun), made
branch-free where they run over arrays:
- exp_f64: k = round(x / ln 2), r = (x - k ln2_hi) - k ln2_lo (ln2_hi has 32 significant
  bits, so k ln2_hi is exact for |k| < 2**21), e**r from fdlibm's degree-5 minimax
  rational form, scaled by 2**k as two exact factors (2**(k>>1) * 2**(k - (k>>1)), one
  rounding into the subnormal range at most). Below -745.2: +0; above 709.78: +inf; NaN in,
  NaN out. Under 1 ulp (fdlibm's bound).
- log_f64: x = 2**e * m with m in [sqrt(2)/2, sqrt(2)), f = m - 1, s = f / (2 + f), log m
  from fdlibm's Lg1..Lg7 polynomial in s*s. Under 1 ulp. Scalar (once per row).
- sincos_f64 (|x| < 2**20 * pi / 2): n = round(x * 2/pi), r = x - n pio2_1 (exact: pio2_1
  has 33 significant bits and n < 2**20) with the tail n pio2_1t carried as a second word
  (fdlibm's first reduction round, good to about 85 bits), then fdlibm's __kernel_sin and
  __kernel_cos on (r, tail) and the quadrant n mod 4. Under 1 ulp on the reduced range.
Every step is one IEEE operation rounded to float64; numba without fastmath emits no FMA
contraction, so the bits are fixed by this code (the oracle, rows_f64_oracle.py, replays the
same steps in NumPy and the tests compare bit for bit).
"""
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

D = np.float64
ONE, HALF, TWO, ZERO = D(1.0), D(0.5), D(2.0), D(0.0)

# exp
EXP_INV_LN2 = D(1.44269504088896338700e+00)
EXP_LN2_HI = D(6.93147180369123816490e-01)
EXP_LN2_LO = D(1.90821492927058770002e-10)
EXP_P1 = D(1.66666666666666019037e-01)
EXP_P2 = D(-2.77777777770155933842e-03)
EXP_P3 = D(6.61375632143793436117e-05)
EXP_P4 = D(-1.65339022054652515390e-06)
EXP_P5 = D(4.13813679705723846039e-08)
EXP_HIGH = D(7.09782712893383973096e+02)          # above: +inf
EXP_LOW = D(-7.45133219101941108420e+02)          # below: +0

# log
LG1 = D(6.666666666666735130e-01)
LG2 = D(3.999999999940941908e-01)
LG3 = D(2.857142874366239149e-01)
LG4 = D(2.222219843214978396e-01)
LG5 = D(1.818357216161805012e-01)
LG6 = D(1.531383769920937332e-01)
LG7 = D(1.479819860511658591e-01)
SQRT2 = D(1.4142135623730951)

# sin / cos
INV_PIO2 = D(6.36619772367581382433e-01)
PIO2_1 = D(1.57079632673412561417e+00)            # first 33 bits of pi/2
PIO2_1T = D(6.07710050650619224932e-11)          # pi/2 - PIO2_1
SINCOS_LIMIT = D(1.6e6)                           # < 2**20 * pi / 2: n < 2**20, n * PIO2_1 exact
S1 = D(-1.66666666666666324348e-01)
S2 = D(8.33333333332248946124e-03)
S3 = D(-1.98412698298579493134e-04)
S4 = D(2.75573137070700676789e-06)
S5 = D(-2.50507602534068634195e-08)
S6 = D(1.58969099521155010221e-10)
C1 = D(4.16666666666666019037e-02)
C2 = D(-1.38888888888741095749e-03)
C3 = D(2.48015872894767294178e-05)
C4 = D(-2.75573143513906633035e-07)
C5 = D(2.08757232129817482790e-09)
C6 = D(-1.13596475577881948265e-11)


@intrinsic
def _bits_to_f64(typingctx, bits):
    """An int64's bits seen as a float64 (a register move, vectorisable)."""
    sig = types.float64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())
    return sig, codegen


@intrinsic
def _f64_to_bits(typingctx, value):
    """A float64's bits seen as an int64."""
    sig = types.int64(types.float64)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))
    return sig, codegen


@njit(inline="always", cache=True, error_model="numpy")
def exp_f64(x):
    """e**x for a float64 x (fdlibm's e_exp.c, branch-free)."""
    c = min(max(x, EXP_LOW), EXP_HIGH)               # NaN: restored below
    kf = np.floor(c * EXP_INV_LN2 + HALF)             # an integer in [-1075, 1024]
    hi = c - kf * EXP_LN2_HI
    lo = kf * EXP_LN2_LO
    r = hi - lo
    t = r * r
    p = r - t * (EXP_P1 + t * (EXP_P2 + t * (EXP_P3 + t * (EXP_P4 + t * EXP_P5))))
    y = ONE - ((lo - (r * p) / (TWO - p)) - hi)
    k = np.int64(kf)
    half = k >> 1
    y = (y * _bits_to_f64((half + 1023) << 52)) * _bits_to_f64((k - half + 1023) << 52)
    y = ZERO if x < EXP_LOW else y
    y = np.inf if x > EXP_HIGH else y
    return x if x != x else y


@njit(inline="always", cache=True, error_model="numpy")
def log_f64(x):
    """Natural log of a float64 (fdlibm's e_log.c): NaN for x < 0 or NaN, -inf at 0, +inf at +inf."""
    if not (x > ZERO and x < np.inf):
        if x == ZERO:
            return -np.inf
        if x == np.inf:
            return x
        return np.nan
    bits = _f64_to_bits(x)
    e = (bits >> 52) & 0x7FF
    if e == 0:                                        # subnormal: scale into the normals first
        x = x * D(18014398509481984.0)                # 2**54
        bits = _f64_to_bits(x)
        e = ((bits >> 52) & 0x7FF) - 54
    m = _bits_to_f64((bits & 0x000FFFFFFFFFFFFF) | 0x3FF0000000000000)    # [1, 2)
    k = e - 1023
    if m > SQRT2:
        m = m * HALF                                  # exact
        k = k + 1
    f = m - ONE
    s = f / (TWO + f)
    z = s * s
    w = z * z
    t1 = w * (LG2 + w * (LG4 + w * LG6))
    t2 = z * (LG1 + w * (LG3 + w * (LG5 + w * LG7)))
    r = t2 + t1
    hfsq = HALF * f * f
    dk = D(k)
    return dk * EXP_LN2_HI - ((hfsq - (s * (hfsq + r) + dk * EXP_LN2_LO)) - f)


@njit(inline="always", cache=True, error_model="numpy")
def _kernel_sin(x, y):
    z = x * x
    v = z * x
    r = S2 + z * (S3 + z * (S4 + z * (S5 + z * S6)))
    return x - ((z * (HALF * y - v * r) - y) - v * S1)


@njit(inline="always", cache=True, error_model="numpy")
def _kernel_cos(x, y):
    z = x * x
    r = z * (C1 + z * (C2 + z * (C3 + z * (C4 + z * (C5 + z * C6)))))
    hz = HALF * z
    w = ONE - hz
    return w + (((ONE - w) - hz) + (z * r - x * y))


@njit(inline="always", cache=True, error_model="numpy")
def sincos_f64(x):
    """(sin x, cos x) for a float64 0 <= x < SINCOS_LIMIT (the caller checks the range)."""
    fn = np.floor(x * INV_PIO2 + HALF)
    r = x - fn * PIO2_1                               # exact
    w = fn * PIO2_1T
    y0 = r - w
    y1 = (r - y0) - w
    s = _kernel_sin(y0, y1)
    c = _kernel_cos(y0, y1)
    q = np.int64(fn) & 3
    sin = s if q == 0 else (c if q == 1 else (-s if q == 2 else -c))
    cos = c if q == 0 else (-s if q == 1 else (-c if q == 2 else s))
    return sin, cos
