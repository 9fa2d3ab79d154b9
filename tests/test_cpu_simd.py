"""The vector operations of the integer kernels (backends/cpu/kernels/simd.py) against
their definitions, written here in NumPy, over random and extreme bytes; and the same bits
under every lowering (AVX2, SSSE3, portable IR), each compiled in a process of its own."""
import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
from numba import njit

from tinyloop.backends.cpu.kernels import simd
from tinyloop.backends.cpu.targets import compile_env

pytestmark = pytest.mark.slow      # the numba backend's kernels: -m slow


@njit
def _madd(a, b, out):
    for i in range(a.shape[0] // 32):
        v = simd.madd_pairs(simd.madd_u8s8(simd.load_bytes(a, i * 32), simd.load_bytes(b, i * 32)))
        simd.store_f32x8(out, i * 32, simd.to_f32x8(v))


@njit
def _dot4(acc, a, b, out):
    for i in range(a.shape[0] // 32):
        v = simd.dot4_u8s8(simd.splat_i32(acc[i]), simd.load_bytes(a, i * 32), simd.load_bytes(b, i * 32))
        simd.store_f32x8(out, i * 32, simd.to_f32x8(v))


@njit
def _madd16(a, b, out):
    for i in range(a.shape[0] // 32):
        v = simd.madd_u8s8(simd.load_bytes(a, i * 32), simd.load_bytes(b, i * 32))
        simd.store_f32x8(out, i * 64, simd.to_f32x8(simd.madd_pairs(simd.add_i16(v, simd.zero_i16()))))


@njit
def _sign_abs(a, b, ones, signed, absolute):
    """Each result widened by a madd with bytes of 1 (exact): the sums of 4 lanes."""
    one = simd.load_bytes(ones, 0)
    for i in range(a.shape[0] // 32):
        s = simd.sign_bytes(simd.load_bytes(a, i * 32), simd.load_bytes(b, i * 32))
        m = simd.abs_bytes(simd.load_bytes(a, i * 32))
        simd.store_f32x8(signed, i * 32, simd.to_f32x8(simd.madd_pairs(simd.madd_u8s8(one, s))))
        simd.store_f32x8(absolute, i * 32, simd.to_f32x8(simd.madd_pairs(simd.madd_u8s8(m, one))))


@njit
def _fields(a, nib, crumb):
    for h in range(2):
        simd.store_f32x8(nib, h * 32, simd.to_f32x8(simd.madd_pairs(simd.madd_u8s8(simd.load_nibbles(a, 0, h),
                                                                                   simd.load_bytes(a, 32)))))
    for j in range(4):
        simd.store_f32x8(crumb, j * 32, simd.to_f32x8(simd.madd_pairs(simd.madd_u8s8(simd.load_crumbs(a, 0, j),
                                                                                     simd.load_bytes(a, 32)))))


@njit
def _widen(h, out):
    for i in range(h.shape[0] // 8):
        simd.store_f32x8(out, i * 32, simd.load_group8(h, i * 8))


def test_half_scales_widen_exactly_for_every_pattern():
    """Every half pattern widens to its float32 value; a NaN keeps its payload and sign and is
    quieted (the quiet bit set: what F16C's instruction does, and so the portable form too)."""
    patterns = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = np.empty(65536, np.float32)
    _widen(patterns, got)
    want = patterns.view(np.float16).astype(np.float32).view(np.uint32)
    want = np.where(np.isnan(patterns.view(np.float16)), want | np.uint32(0x400000), want)
    assert np.array_equal(got.view(np.uint32), want)


def _pairs4(u, s):
    """Definition: sum over each group of 4 lanes of u (unsigned) * s (signed), exact."""
    return (u.astype(np.int64) * s.astype(np.int64)).reshape(-1, 4).sum(axis=1).astype(np.float32)


def test_madd_is_the_exact_sum_of_products_in_range():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 129, 32 * 64).astype(np.uint8)             # |c| <= 128, as the kernels give
    b = rng.integers(-127, 128, 32 * 64).astype(np.int8)
    a[:32], b[:32] = 128, -127                                      # the extremes: pairs of -32512
    a[32:64], b[32:64] = 128, 127
    out = np.zeros(8 * 64, np.float32)
    _madd(a, b.view(np.uint8), out)
    assert np.array_equal(out, _pairs4(a, b))


def test_dot4_is_the_accumulator_plus_the_exact_sum_of_four_products():
    """vpdpbusd where the target has VNNI, the madd pair elsewhere: the same integers."""
    rng = np.random.default_rng(3)
    a = rng.integers(0, 129, 32 * 64).astype(np.uint8)
    b = rng.integers(-127, 128, 32 * 64).astype(np.int8)
    a[:32], b[:32] = 128, -127                                      # the extremes: lanes of -65024
    acc = rng.integers(-(1 << 20), 1 << 20, 64).astype(np.int32)   # exact in float32 with the sums
    out = np.zeros(8 * 64, np.float32)
    _dot4(acc, a, b.view(np.uint8), out)
    assert np.array_equal(out, np.repeat(acc, 8).astype(np.float32) + _pairs4(a, b))


def test_madd_saturates_past_int16_as_the_instruction_does():
    """Out of the kernels' range the definition is pmaddubsw's: each pair saturates to int16."""
    a = np.full(32, 255, np.uint8)
    b = np.full(32, 127, np.int8)
    out = np.zeros(8, np.float32)
    _madd(a, b.view(np.uint8), out)
    assert np.array_equal(out, np.full(8, 2 * 32767, np.float32))


def test_sign_and_abs():
    rng = np.random.default_rng(2)
    a = rng.integers(-127, 128, 32 * 8).astype(np.int8)
    b = rng.integers(-128, 128, 32 * 8).astype(np.int8)
    b[::7] = 0
    a[:4] = [-127, 127, 0, -1]
    ones = np.ones(32, np.uint8)
    signed, absolute = np.zeros(64, np.float32), np.zeros(64, np.float32)
    _sign_abs(a.view(np.uint8), b.view(np.uint8), ones, signed, absolute)
    want_sign = np.where(b < 0, -a.astype(np.int64), np.where(b == 0, 0, a.astype(np.int64)))
    assert np.array_equal(signed, _pairs4(np.ones(256, np.uint8), want_sign))
    a8 = a.copy()
    a8[5] = -128                                                     # |-128| = 128 as an unsigned byte
    _sign_abs(a8.view(np.uint8), b.view(np.uint8), ones, signed, absolute)
    assert np.array_equal(absolute, _pairs4(np.abs(a8.astype(np.int64)), np.ones(256, np.int8)))


def test_nibble_and_crumb_fields():
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, 64).astype(np.uint8)
    nib, crumb = np.zeros(16, np.float32), np.zeros(32, np.float32)
    _fields(a, nib, crumb)
    x = a[32:].view(np.int8)
    assert np.array_equal(nib, np.concatenate([_pairs4(a[:32] & 15, x), _pairs4(a[:32] >> 4, x)]))
    assert np.array_equal(crumb, np.concatenate([_pairs4((a[:32] >> (2 * j)) & 3, x) for j in range(4)]))


_FINGERPRINT = """
import hashlib, numpy as np
from numba import njit
from tinyloop.backends.cpu.kernels import simd
from tinyloop.backends.cpu.kernels.simd import FEATURES, LOWERING
from tinyloop.backends.cpu.linear import linear, prepare_linear
from tinyloop.model.quant import quantize_rtn
rng = np.random.default_rng(7)
digest = hashlib.sha256()
for bits, group in ((8, 32), (4, 32), (2, 32), (4, 16), (8, 64)):
    w = rng.standard_normal((40, 192)).astype(np.float32)
    packed = prepare_linear([quantize_rtn(w, bits, group)])
    x = (rng.standard_normal((19, 192)) * 3).astype(np.float32)
    digest.update(linear(x, packed).tobytes())
w = rng.standard_normal((40, 192)).astype(np.float16)          # f16 weights: the half widening
digest.update(linear((rng.standard_normal((19, 192)) * 3).astype(np.float32), prepare_linear([w])).tobytes())

@njit
def widen(h, out):
    for i in range(h.shape[0] // 8):
        simd.store_f32x8(out, i * 32, simd.load_group8(h, i * 8))
halves = np.empty(65536, np.float32)
widen(np.arange(65536, dtype=np.uint32).astype(np.uint16), halves)
digest.update(halves.tobytes())
print(LOWERING + ("+vnni" if simd.VNNI else "") + ("+f16c" if "f16c" in FEATURES else ""), digest.hexdigest())
"""


def _cpu_flags() -> set:
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        return set()
    line = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def test_every_lowering_gives_the_same_bits():
    """The integer kernels compiled for this CPU, for a pre-AVX2 x86 (SSSE3: nehalem) and for
    numba's generic target (the portable IR) write the same outputs, bit for bit."""
    targets = {"host": None, "generic": "generic"}
    if {"ssse3", "sse4_2"} <= _cpu_flags():
        targets["nehalem"] = "nehalem"
    if {"avx2", "fma", "bmi2", "f16c"} <= _cpu_flags():
        targets["haswell"] = "haswell"            # AVX2 without VNNI: the pair sums where the host has vpdpbusd
    seen = {}
    for name, cpu in targets.items():
        env = dict(os.environ)
        env.pop("NUMBA_CPU_NAME", None)
        env.pop("NUMBA_CPU_FEATURES", None)
        env.update(compile_env(cpu or ""))          # the named CPU's features, not this one's
        done = subprocess.run([sys.executable, "-c", _FINGERPRINT], env=env, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        seen[name] = done.stdout.split()
    lowerings = {lowering for lowering, _ in seen.values()}
    # each named target compiled the code of its own instruction set, not this CPU's
    expected = {"generic": "portable", "nehalem": "ssse3", "haswell": "avx2+f16c"}
    assert {name: seen[name][0] for name in seen if name != "host"} == \
        {name: lowering for name, lowering in expected.items() if name in seen}, seen
    assert len(lowerings) >= 2, seen
    assert len({digest for _, digest in seen.values()}) == 1, seen
