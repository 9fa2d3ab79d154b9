"""exp, tanh, silu in float32 from IEEE additions and multiplications only (no libm, no FMA).

Every CPU rounds +, -, *, / and sqrt identically (IEEE-754, round to nearest even), so these
give the same bits on any CPU and under any numba compile target; libm's and NumPy's exp
choose their instructions per CPU and may differ in the last bit.

exp(x) = 2**n * e**r with n = round(x / ln 2) and r = x - n ln 2 (Cody-Waite: ln 2 split in a
high part with trailing zero bits, so n * LN2_HI is exact for |n| < 2**11, and a low part),
|r| <= ln 2 / 2; e**r by its Taylor polynomial to degree 7 in Horner form (truncation below
6e-9 relative; measured at most 1.2 ulp from the true value over [-87, 88]); 2**n built
from its bits. Arguments below -87.3 (where the result would leave float32's normal range)
give +0, so exp(-inf) = 0 exactly, as attention's masks need; above 88.72, +inf. The body
has no branch, so LLVM vectorises loops that call it (2 ns -> about 0.3 ns an element).
"""
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

F = np.float32
LOG2E = F(1.4426950408889634)
LN2_HI = F(0.693145751953125)          # 12 significant bits: n * LN2_HI exact for |n| < 2**11
LN2_LO = F(1.4286067653302226e-06)     # ln 2 - LN2_HI
EXP_HIGH = F(88.72283)                 # above: +inf
EXP_LOW = F(-87.33654)                 # below: +0 (the smallest normal result is e**-87.336)
# 1/k! for k = 7 .. 2, rounded to float32
C7, C6, C5, C4 = F(1 / 5040), F(1 / 720), F(1 / 120), F(1 / 24)
C3, C2 = F(1 / 6), F(0.5)
ONE, HALF, TWO, ZERO = F(1.0), F(0.5), F(2.0), F(0.0)


@intrinsic
def _bits_to_f32(typingctx, bits):
    """An int32's bits seen as a float32 (a register move, vectorisable)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return sig, codegen


@njit(inline="always", cache=True)
def exp_f32(x):
    """e**x for a float32 x (NaN propagates)."""
    c = min(max(x, EXP_LOW), EXP_HIGH)                  # NaN -> EXP_HIGH here; restored below
    n = np.floor(c * LOG2E + HALF)                      # an integer in [-126, 128]
    r = (c - n * LN2_HI) - n * LN2_LO
    p = ((((((C7 * r + C6) * r + C5) * r + C4) * r + C3) * r + C2) * r + ONE) * r + ONE
    k = np.int32(n)
    # 2**n as two factors 2**(n - n//2) * 2**(n//2): each within the normal exponents
    half = k >> 1
    y = (p * _bits_to_f32((half + 127) << 23)) * _bits_to_f32((k - half + 127) << 23)
    y = ZERO if x < EXP_LOW else y
    y = F(np.inf) if x > EXP_HIGH else y
    return x if x != x else y


@njit(inline="always", cache=True)
def tanh_f32(x):
    """tanh from exp: 1 - 2 / (e**(2|x|) + 1), odd by construction; +-1 past |x| = 10."""
    a = min(abs(x), F(10.0))
    t = ONE - TWO / (exp_f32(TWO * a) + ONE)
    t = ONE if abs(x) > F(10.0) else t
    return t if x >= ZERO else (-t if x < ZERO else x)


@njit(inline="always", cache=True)
def silu_f32(x):
    """x * sigmoid(x) = x / (1 + e**-x)."""
    return x / (ONE + exp_f32(-x))
