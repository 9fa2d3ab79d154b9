"""twins/arith.py fma_f32 (the twin of tl_fma, the rows path's multiply-accumulate) against an
independent oracle: the exact value of a * b + c as a fraction, rounded to float32 by hand
(nearest, ties to even)."""
from fractions import Fraction

import numpy as np

from tinyloop.backends.reference.twins.arith import fma_f32

F = np.float32


def rounded_once(a: F, b: F, c: F) -> F:
    """a * b + c exactly, then the float32 nearest it (ties to the even significand)."""
    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    guess = F(float(exact))                                # within an ulp of the answer
    low = guess if Fraction(float(guess)) <= exact else np.nextafter(guess, F(-np.inf))
    high = np.nextafter(low, F(np.inf))
    below, above = exact - Fraction(float(low)), Fraction(float(high)) - exact
    if below != above:
        return low if below < above else high
    return low if int(low.view(np.uint32)) % 2 == 0 else high


def same_bits(got, want) -> bool:
    return np.asarray(got, F).view(np.uint32) == np.asarray(want, F).view(np.uint32)


def test_the_double_rounding_case_rounds_once():
    """(1 + 2^-12)^2 = 1 + 2^-11 + 2^-24 lies exactly halfway between two floats; a tiny c
    takes the exact sum past the half. Rounding to float64 first lands on the half (c is below
    float64's ulp there), and the tie then goes down to the even float: the wrong one."""
    a = F(1 + 2.0 ** -12)
    c = F(2.0 ** -80)
    want = F(1 + 2.0 ** -11 + 2.0 ** -23)
    assert rounded_once(a, a, c) == want
    assert same_bits(fma_f32(a, a, c), want)
    assert not same_bits(F(float(a) * float(a) + float(c)), want)      # what double rounding gives
    assert same_bits(fma_f32(a, a, -c), F(1 + 2.0 ** -11))             # the other side of the half


def test_random_operands_round_once():
    """Operands over a wide range of exponents, with c drawn to cancel a * b (the sum's leading
    bits vanish), to sit far below it, or near its rounding bit."""
    rng = np.random.default_rng(11)
    n = 4000
    a = (rng.standard_normal(n) * 2.0 ** rng.integers(-40, 40, n)).astype(F)
    b = (rng.standard_normal(n) * 2.0 ** rng.integers(-40, 40, n)).astype(F)
    product = a.astype(np.float64) * b.astype(np.float64)
    c = np.select([np.arange(n) % 4 == 0, np.arange(n) % 4 == 1, np.arange(n) % 4 == 2],
                  [-product, product * 2.0 ** -rng.integers(20, 40, n), rng.standard_normal(n) * 2.0 ** 60],
                  rng.standard_normal(n) * 2.0 ** rng.integers(-60, 60, n)).astype(F)
    got = fma_f32(a, b, c)
    want = np.array([rounded_once(x, y, z) for x, y, z in zip(a, b, c)], F)
    assert (got.view(np.uint32) == want.view(np.uint32)).all()


def test_signed_zeros_and_specials():
    zero = F(0.0)
    assert same_bits(fma_f32(F(-3.0), zero, zero), zero)               # -0 + +0 is +0
    assert same_bits(fma_f32(F(-3.0), zero, F(-0.0)), F(-0.0))         # -0 + -0 stays -0
    assert same_bits(fma_f32(F(2.0), F(3.0), F(-6.0)), zero)           # exact cancellation: +0
    assert np.isinf(fma_f32(F(np.inf), F(1.0), F(1.0)))
    assert np.isnan(fma_f32(F(np.inf), F(0.0), F(1.0)))
    big = F(3e38)
    assert np.isinf(fma_f32(big, F(2.0), F(0.0)))                      # overflow rounds to inf
