"""256-bit vector values in numba kernels: LLVM vector types and the few operations the
integer linear kernels need (linear_int.py).

numba has no vector type, and LLVM's vectorisers do not find what these kernels need (a
byte-by-byte multiply whose pairs add into 16 bits, then into 32). So each operation here
is a numba intrinsic that emits LLVM IR on a 256-bit value: I8x32 (32 bytes), I16x16,
I32x8 and F32x8 (eight float32 lanes). Values live in registers; numba passes them
between intrinsics like any scalar.

Why the results are the same on every CPU: each operation is defined on exact integers
(madd_u8s8, madd_pairs: products and sums that cannot overflow for the inputs the kernels
give them, which linear_int.py bounds), or is one IEEE-754 float32 operation per lane
(fmul, fadd, exact int -> float conversion of |v| < 2**24). Where the compile target has
the instruction that computes it in one step (AVX2 `vpmaddubsw`, `vpmaddwd`; SSSE3/SSE2's
128-bit forms on each half), the intrinsic calls it; elsewhere (NUMBA_CPU_NAME=generic,
other architectures) it emits the same definition in portable IR (widen, multiply, add
the even and odd lanes). dot4_u8s8 adds 4 products a lane straight into int32 with VNNI's
`vpdpbusd` where the target has AVX512-VNNI (or AVX-VNNI), and with the pair above
elsewhere. Integer results are exact either way, float lanes are rounded alone (no
fast-math flag: LLVM may not fuse a multiply and an add), so the bits do not depend on
which lowering ran. numba caches a kernel per target CPU and feature set, so a
kernel compiled for one lowering is never run on a machine of the other.

Lane layouts (what the loads mean, linear_int.py lays the weights out to match):
- load_bytes(a, i): the 32 bytes at a[i:].
- load_nibbles(a, i, h): the 32 bytes at a[i:], their low (h = 0) or high (h = 1) nibbles.
- load_crumbs(a, i, j): the 32 bytes at a[i:], their bits 2 j and 2 j + 1.
- broadcast4(a, i): the 4 bytes a[i:i + 4] repeated 8 times (lane L is a[i + L % 4]).
"""
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.registry import cpu_target
from numba.extending import intrinsic, models, register_model


class VectorType(types.Type):
    """A 256-bit LLVM vector of `lanes` elements of `element` (an llvmlite type)."""

    def __init__(self, element, lanes: int, name: str):
        self.element, self.lanes = element, lanes
        super().__init__(name=name)

    @property
    def ir(self) -> ir.VectorType:
        return ir.VectorType(self.element, self.lanes)


@register_model(VectorType)
class _VectorModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, fe_type.ir)


I8x32 = VectorType(ir.IntType(8), 32, "i8x32")
I16x16 = VectorType(ir.IntType(16), 16, "i16x16")
I32x8 = VectorType(ir.IntType(32), 8, "i32x8")
F32x8 = VectorType(ir.FloatType(), 8, "f32x8")

_I32 = ir.IntType(32)


def target_features() -> set:
    """The instruction-set features numba compiles for ("+avx2" -> "avx2"): the host CPU's,
    or none under NUMBA_CPU_NAME=generic."""
    features = cpu_target.target_context.codegen()._tm_features
    return {f[1:] for f in features.split(",") if f.startswith("+")}


FEATURES = target_features()
LOWERING = "avx2" if "avx2" in FEATURES else "ssse3" if "ssse3" in FEATURES else "portable"
# vpdpbusd on 256-bit registers: AVX512-VNNI with AVX512VL (EVEX), or AVX-VNNI (VEX)
VNNI = LOWERING == "avx2" and ({"avx512vnni", "avx512vl"} <= FEATURES or "avxvnni" in FEATURES)


# ---------------------------------------------------------------------------- IR helpers
def _pointer(context, builder, array_type, array, index, pointee):
    """A pointer to byte `index` of the array's data, typed as `pointee`."""
    data = context.make_array(array_type)(context, builder, array).data
    base = builder.bitcast(data, ir.IntType(8).as_pointer())
    return builder.bitcast(builder.gep(base, [index]), pointee.as_pointer())


def _const(vector: ir.VectorType, value):
    return ir.Constant(vector, [value] * vector.count)


def _lanes(builder, a, b, picks):
    """shufflevector: lanes of a (0..n-1) and b (n..2n-1) in the order `picks`."""
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, len(picks)), list(picks)))


def _halves(builder, v):
    n = v.type.count
    return _lanes(builder, v, v, range(n // 2)), _lanes(builder, v, v, range(n // 2, n))


def _joined(builder, lo, hi):
    return _lanes(builder, lo, hi, range(2 * lo.type.count))


def _per_half(builder, name, half_result: ir.VectorType, x, y):
    """A 128-bit instruction `name` on the low halves of x and y, then on their high halves,
    the two results joined: the SSSE3/SSE2 form of a 256-bit operation."""
    (xl, xh), (yl, yh) = _halves(builder, x), _halves(builder, y)
    return _joined(builder, _call(builder, name, half_result, [xl, yl]), _call(builder, name, half_result, [xh, yh]))


def _call(builder, name, result, args):
    function = cgutils.get_or_insert_function(builder.module, ir.FunctionType(result, [a.type for a in args]), name)
    return builder.call(function, args)


def _splat(builder, vector: ir.VectorType, scalar):
    v = builder.insert_element(ir.Constant(vector, None), scalar, ir.Constant(_I32, 0))
    return _lanes(builder, v, v, [0] * vector.count)


def _even_odd_sum(builder, v, wide: ir.VectorType, extend):
    """Lanes 2i and 2i + 1 of v, each extended to `wide`'s element, added: (n / 2) lanes."""
    n = v.type.count
    even = extend(_lanes(builder, v, v, range(0, n, 2)), wide)
    odd = extend(_lanes(builder, v, v, range(1, n, 2)), wide)
    return builder.add(even, odd)


# ---------------------------------------------------------------------------- loads and stores
@intrinsic
def load_bytes(typingctx, array, index):
    """32 bytes at byte `index` of the array's data (unaligned)."""
    def codegen(context, builder, signature, args):
        return builder.load(_pointer(context, builder, signature.args[0], args[0], args[1], I8x32.ir), align=1)
    return I8x32(array, index), codegen


def _load_fields(context, builder, signature, args, bits):
    """32 bytes at byte args[1] shifted right by bits * args[2], masked to `bits` bits."""
    v = builder.load(_pointer(context, builder, signature.args[0], args[0], args[1], I8x32.ir), align=1)
    shift = builder.trunc(builder.mul(context.cast(builder, args[2], signature.args[2], types.int32),
                                      ir.Constant(_I32, bits)), ir.IntType(8))
    shifted = builder.lshr(v, _splat(builder, I8x32.ir, shift))
    return builder.and_(shifted, _const(I8x32.ir, (1 << bits) - 1))


@intrinsic
def load_nibbles(typingctx, array, index, which):
    """32 bytes at byte `index` -> their low (which = 0) or high (1) nibbles."""
    def codegen(context, builder, signature, args):
        return _load_fields(context, builder, signature, args, 4)
    return I8x32(array, index, which), codegen


@intrinsic
def load_crumbs(typingctx, array, index, which):
    """32 bytes at byte `index` -> their 2-bit fields `which` (0: bits 0-1, ..., 3: bits 6-7)."""
    def codegen(context, builder, signature, args):
        return _load_fields(context, builder, signature, args, 2)
    return I8x32(array, index, which), codegen


@intrinsic
def broadcast4(typingctx, array, index):
    """The 4 bytes at byte `index`, repeated 8 times."""
    def codegen(context, builder, signature, args):
        word = builder.load(_pointer(context, builder, signature.args[0], args[0], args[1], _I32), align=1)
        return builder.bitcast(_splat(builder, ir.VectorType(_I32, 8), word), I8x32.ir)
    return I8x32(array, index), codegen


@intrinsic
def load_f32x8(typingctx, array, index):
    """8 float32 at byte `index`."""
    def codegen(context, builder, signature, args):
        return builder.load(_pointer(context, builder, signature.args[0], args[0], args[1], F32x8.ir), align=4)
    return F32x8(array, index), codegen


def _half_to_float(builder, h16):
    """<8 x i16> IEEE half bits -> <8 x float>, exactly, in integer and float lanes (for targets
    without F16C): normals rebiased, subnormals as mantissa * 2**-24, inf kept, and a NaN
    quieted (its payload kept, the quiet bit set), as F16C's vcvtph2ps does."""
    i32v = ir.VectorType(_I32, 8)
    h = builder.zext(h16, i32v)
    sign = builder.shl(builder.and_(h, _const(i32v, 0x8000)), _const(i32v, 16))
    exponent = builder.and_(builder.lshr(h, _const(i32v, 10)), _const(i32v, 0x1F))
    mantissa = builder.and_(h, _const(i32v, 0x3FF))
    wide_mantissa = builder.shl(mantissa, _const(i32v, 13))
    normal = builder.or_(builder.or_(sign, builder.shl(builder.add(exponent, _const(i32v, 112)), _const(i32v, 23))),
                         wide_mantissa)
    quiet = builder.select(builder.icmp_unsigned("!=", mantissa, _const(i32v, 0)), _const(i32v, 0x400000),
                           _const(i32v, 0))
    special = builder.or_(builder.or_(builder.or_(sign, _const(i32v, 0x7F800000)), wide_mantissa), quiet)
    bits = builder.select(builder.icmp_unsigned("==", exponent, _const(i32v, 31)), special, normal)
    tiny = builder.fmul(builder.sitofp(mantissa, F32x8.ir), _const(F32x8.ir, 5.960464477539063e-08))
    tiny = builder.select(builder.icmp_unsigned("!=", sign, _const(i32v, 0)), builder.fneg(tiny), tiny)
    return builder.select(builder.icmp_unsigned("==", exponent, _const(i32v, 0)), tiny,
                          builder.bitcast(bits, F32x8.ir))


@intrinsic
def load_group8(typingctx, array, index):
    """8 consecutive elements from element `index` of a float32 array, or of a uint16 array of
    IEEE half bits widened exactly, NaNs quieted (F16C's vcvtph2ps where the target has it)."""
    half = array.dtype == types.uint16

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        index = context.cast(builder, args[1], signature.args[1], types.int64)
        if not half:
            pointer = builder.bitcast(builder.gep(data, [index]), F32x8.ir.as_pointer())
            return builder.load(pointer, align=4)
        pointer = builder.bitcast(builder.gep(data, [index]), ir.VectorType(ir.IntType(16), 8).as_pointer())
        h16 = builder.load(pointer, align=2)
        if "f16c" in FEATURES:
            return builder.fpext(builder.bitcast(h16, ir.VectorType(ir.HalfType(), 8)), F32x8.ir)
        return _half_to_float(builder, h16)
    return F32x8(array, index), codegen


@intrinsic
def load_codes8_f32(typingctx, array, index, bits):
    """8 codes from byte `index` as float32 (exact): bits 8, bytes index .. index + 7; bits 4,
    the nibbles of bytes index .. index + 3, each byte's low nibble first."""
    def codegen(context, builder, signature, args):
        i32v = ir.VectorType(_I32, 8)
        if signature.args[2].literal_value == 8:
            v = builder.load(_pointer(context, builder, signature.args[0], args[0], args[1],
                                      ir.VectorType(ir.IntType(8), 8)), align=1)
            return builder.uitofp(builder.zext(v, i32v), F32x8.ir)
        v = builder.load(_pointer(context, builder, signature.args[0], args[0], args[1],
                                  ir.VectorType(ir.IntType(8), 4)), align=1)
        spread = builder.zext(_lanes(builder, v, v, [0, 0, 1, 1, 2, 2, 3, 3]), i32v)
        nibbles = builder.and_(builder.lshr(spread, ir.Constant(i32v, [0, 4] * 4)), _const(i32v, 15))
        return builder.uitofp(nibbles, F32x8.ir)
    if not isinstance(bits, types.IntegerLiteral) or bits.literal_value not in (4, 8):
        return None
    return F32x8(array, index, bits), codegen


@intrinsic
def load_f32(typingctx, array, index):
    """The float32 at byte `index` (no index wrap-around or bounds code: the kernels' offsets
    are computed in range)."""
    def codegen(context, builder, signature, args):
        return builder.load(_pointer(context, builder, signature.args[0], args[0], args[1], ir.FloatType()), align=4)
    return types.float32(array, index), codegen


@intrinsic
def load_i32(typingctx, array, index):
    """The int32 at byte `index`."""
    def codegen(context, builder, signature, args):
        return builder.load(_pointer(context, builder, signature.args[0], args[0], args[1], _I32), align=4)
    return types.int32(array, index), codegen


@intrinsic
def store_f32x8(typingctx, array, index, value):
    """value's 8 float32 to byte `index` of the array."""
    def codegen(context, builder, signature, args):
        builder.store(args[2], _pointer(context, builder, signature.args[0], args[0], args[1], F32x8.ir), align=4)
        return context.get_dummy_value()
    return types.void(array, index, value), codegen


# ---------------------------------------------------------------------------- integer arithmetic
def _madd_u8s8_ir(builder, x, y):
    """madd_u8s8's IR (its docstring)."""
    if LOWERING == "avx2":
        return _call(builder, "llvm.x86.avx2.pmadd.ub.sw", I16x16.ir, [x, y])
    if LOWERING == "ssse3":
        return _per_half(builder, "llvm.x86.ssse3.pmadd.ub.sw.128", ir.VectorType(ir.IntType(16), 8), x, y)
    wide = ir.VectorType(_I32, 32)
    products = builder.mul(builder.zext(x, wide), builder.sext(y, wide))
    sums = _even_odd_sum(builder, products, ir.VectorType(_I32, 16), lambda v, t: v)
    low, high = _const(sums.type, -32768), _const(sums.type, 32767)
    sums = builder.select(builder.icmp_signed("<", sums, low), low, sums)
    sums = builder.select(builder.icmp_signed(">", sums, high), high, sums)
    return builder.trunc(sums, I16x16.ir)


def _madd_pairs_ir(builder, v):
    """madd_pairs's IR (its docstring)."""
    if LOWERING == "avx2":                      # vpmaddwd / pmaddwd by ones: the pair sum, exact
        return _call(builder, "llvm.x86.avx2.pmadd.wd", I32x8.ir, [v, _const(I16x16.ir, 1)])
    if LOWERING == "ssse3":
        return _per_half(builder, "llvm.x86.sse2.pmadd.wd", ir.VectorType(_I32, 4), v, _const(I16x16.ir, 1))
    return _even_odd_sum(builder, v, I32x8.ir, builder.sext)


@intrinsic
def madd_u8s8(typingctx, a, b):
    """a's bytes unsigned times b's signed, lanes 2i and 2i + 1 added: I16x16.

    Exact when no pair sum leaves int16 (|sum| < 32768): the kernels' operands are at most
    128 (a) and 127 (b) in magnitude, so a pair is at most 32512. The AVX2/SSSE3 instruction
    saturates instead of wrapping past int16; the portable form computes the same exact
    sum (and saturates the same way, so even out-of-range inputs agree)."""
    def codegen(context, builder, signature, args):
        return _madd_u8s8_ir(builder, *args)
    return I16x16(a, b), codegen


@intrinsic
def madd_pairs(typingctx, a):
    """a's int16 lanes 2i and 2i + 1 added into int32: I32x8 (exact)."""
    def codegen(context, builder, signature, args):
        return _madd_pairs_ir(builder, args[0])
    return I32x8(a), codegen


@intrinsic
def dot4_u8s8(typingctx, acc, a, b):
    """acc + (a's bytes unsigned times b's signed, the 4 products of each int32 lane added):
    I32x8, exact (no saturation) for the kernels' operands (|a| <= 128, |b| <= 127: a lane
    adds at most 65024). One `vpdpbusd` where the target has VNNI; elsewhere madd_u8s8 then
    madd_pairs (whose pair sums the same bounds keep below int16's limit), the same integers."""
    def codegen(context, builder, signature, args):
        total, x, y = args
        if VNNI:
            word = ir.VectorType(_I32, 8)
            return _call(builder, "llvm.x86.avx512.vpdpbusd.256", word,
                         [total, builder.bitcast(x, word), builder.bitcast(y, word)])
        return builder.add(total, _madd_pairs_ir(builder, _madd_u8s8_ir(builder, x, y)))
    return I32x8(acc, a, b), codegen


@intrinsic
def sign_bytes(typingctx, a, b):
    """a's signed bytes with the sign of b's: -a where b < 0, 0 where b == 0, a where b > 0
    (psignb; a is never -128 here, so the negation is exact)."""
    def codegen(context, builder, signature, args):
        x, y = args
        if LOWERING == "avx2":
            return _call(builder, "llvm.x86.avx2.psign.b", I8x32.ir, [x, y])
        if LOWERING == "ssse3":
            return _per_half(builder, "llvm.x86.ssse3.psign.b.128", ir.VectorType(ir.IntType(8), 16), x, y)
        zero = _const(I8x32.ir, 0)
        negated = builder.select(builder.icmp_signed("<", y, zero), builder.sub(zero, x), x)
        return builder.select(builder.icmp_signed("==", y, zero), zero, negated)
    return I8x32(a, b), codegen


@intrinsic
def abs_bytes(typingctx, a):
    """|a| of signed bytes, as unsigned bytes (|-128| = 128)."""
    def codegen(context, builder, signature, args):
        zero = _const(I8x32.ir, 0)
        return builder.select(builder.icmp_signed("<", args[0], zero), builder.sub(zero, args[0]), args[0])
    return I8x32(a), codegen


@intrinsic
def add_i16(typingctx, a, b):
    def codegen(context, builder, signature, args):
        return builder.add(args[0], args[1])
    return I16x16(a, b), codegen


@intrinsic
def add_i32(typingctx, a, b):
    def codegen(context, builder, signature, args):
        return builder.add(args[0], args[1])
    return I32x8(a, b), codegen


@intrinsic
def splat_i32(typingctx, value):
    """An int32 (or smaller integer) repeated in 8 lanes."""
    def codegen(context, builder, signature, args):
        return _splat(builder, I32x8.ir, context.cast(builder, args[0], signature.args[0], types.int32))
    return I32x8(value), codegen


@intrinsic
def sub_i32(typingctx, a, b):
    def codegen(context, builder, signature, args):
        return builder.sub(args[0], args[1])
    return I32x8(a, b), codegen


@intrinsic
def zero_i16(typingctx):
    def codegen(context, builder, signature, args):
        return _const(I16x16.ir, 0)
    return I16x16(), codegen


@intrinsic
def zero_i32(typingctx):
    def codegen(context, builder, signature, args):
        return _const(I32x8.ir, 0)
    return I32x8(), codegen


# ---------------------------------------------------------------------------- float lanes
@intrinsic
def to_f32x8(typingctx, a):
    """int32 lanes -> float32 (exact for |v| < 2**24, which the kernels' sums are)."""
    def codegen(context, builder, signature, args):
        return builder.sitofp(args[0], F32x8.ir)
    return F32x8(a), codegen


@intrinsic
def fmul(typingctx, a, b):
    def codegen(context, builder, signature, args):
        return builder.fmul(args[0], args[1])
    return F32x8(a, b), codegen


@intrinsic
def fadd(typingctx, a, b):
    def codegen(context, builder, signature, args):
        return builder.fadd(args[0], args[1])
    return F32x8(a, b), codegen


@intrinsic
def splat_f32(typingctx, value):
    """A float32 repeated in 8 lanes."""
    def codegen(context, builder, signature, args):
        return _splat(builder, F32x8.ir, context.cast(builder, args[0], signature.args[0], types.float32))
    return F32x8(value), codegen


@intrinsic
def zero_f32(typingctx):
    def codegen(context, builder, signature, args):
        return _const(F32x8.ir, 0.0)
    return F32x8(), codegen
