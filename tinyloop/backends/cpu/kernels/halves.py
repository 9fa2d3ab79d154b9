"""IEEE half-precision bits -> float32, exactly, in registers (numba has no float16 type)."""
import numpy as np
from numba import njit

from tinyloop.backends.cpu.kernels.fmath import _bits_to_f32


@njit(inline="always", cache=True)
def half_to_float(h):
    """IEEE half bits (uint16) -> float32, exactly (normals, subnormals, zeros, inf, NaN payloads)."""
    h = np.int32(h)
    sign = (h & 0x8000) << 16
    exponent = (h >> 10) & 0x1F
    mantissa = h & 0x3FF
    # normal: rebias the exponent (15 -> 127) and widen the mantissa; inf/NaN: all-ones exponent
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13)
    bits = (sign | 0x7F800000 | (mantissa << 13)) if exponent == 31 else bits
    # subnormal or zero: mantissa * 2**-24, exact in float32
    tiny = np.float32(mantissa) * np.float32(5.960464477539063e-08)
    tiny = -tiny if sign else tiny
    return tiny if exponent == 0 else _bits_to_f32(np.int32(bits))

