"""IEEE half-precision bits -> float32, exactly, in registers (numba has no float16 type).

One definition on every target: normals and subnormals widen exactly, infinities stay, and a
NaN keeps its sign and payload with the quiet bit set (IEEE 754: a conversion delivers a quiet
NaN). Where the compile target has F16C, the conversion is LLVM's `fpext half to float`, which
is `vcvtph2ps` and which LLVM's SLP vectoriser packs 8 or 16 at a time (the f16 linear kernels
widen 16 weights per column: linear_generated.py); elsewhere (NUMBA_CPU_NAME=generic, other
architectures) it is the integer arithmetic below, which gives the same bits.
"""
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from tinyloop.backends.cpu.kernels.fmath import _bits_to_f32
from tinyloop.backends.cpu.kernels.simd import FEATURES


@njit(inline="always", cache=True)
def half_to_float_arithmetic(h):
    """IEEE half bits (uint16) -> float32 by integer steps (the module docstring's definition)."""
    h = np.int32(h)
    sign = (h & 0x8000) << 16
    exponent = (h >> 10) & 0x1F
    mantissa = h & 0x3FF
    # normal: rebias the exponent (15 -> 127) and widen the mantissa; inf, NaN (quieted): all-ones exponent
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13)
    quiet = 0x400000 if mantissa != 0 else 0
    bits = (sign | 0x7F800000 | (mantissa << 13) | quiet) if exponent == 31 else bits
    # subnormal or zero: mantissa * 2**-24, exact in float32
    tiny = np.float32(mantissa) * np.float32(5.960464477539063e-08)
    tiny = -tiny if sign else tiny
    return tiny if exponent == 0 else _bits_to_f32(np.int32(bits))


@intrinsic
def _fpext_half(typingctx, h):
    """uint16 half bits -> float32 through LLVM's fpext (F16C targets only)."""
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    if h != types.uint16:
        return None
    return types.float32(h), codegen


if "f16c" in FEATURES:
    @njit(inline="always", cache=True)
    def half_to_float(h):
        """IEEE half bits (uint16) -> float32, exactly (the module docstring's definition)."""
        return _fpext_half(np.uint16(h))
else:
    half_to_float = half_to_float_arithmetic
