"""The quantized linear kernels: integer dot products on int8 activations, float scales in a
fixed order. y[r, o] = sum_k x[r, k] W[o, k] for W of 2, 4 or 8-bit codes, as stored.

The definition (every float operation float32, rounded on its own):
- The stored columns (act-order and padding applied by the caller) are cut into segments of
  S = gcd(group size, 32) columns; a segment never straddles a weight group.
- Each row's segment is quantized on its own (quantize_rows): amax = max |x|, dx = amax / 127,
  xq = rint(x / dx) clamped to [-127, 127] (int8), sx = sum xq (exact). dx = 0 and xq = 0
  when amax / 127 is 0 (all zeros, or underflow); dx = NaN and xq = 0 when a value is not
  finite (so the outputs are NaN, as a float product's would be). xs = dx * sx.
- A weight is w = c * scale + min' with an integer code c: unsigned q for 2 and 4 bits
  (min' = min), or q - z with an offset z when every min of the block is -z * scale (GGUF's
  Q4_0: z = 8; then min' = min + z * scale = 0 exactly, which keeps the large q * x and
  min * x terms from cancelling in float); q - 128 for 8 bits (min' = min + 128 * scale: 0 for
  GGUF's Q8_0).
- Per (row, output), one accumulator a = 0, then for each segment s in order, of group g:
      i = sum over the segment of c[o, k] * xq[k]                      (int32, exact)
      a = a + ((scale'[o, g] * dx[s]) * float(i) + min'[o, g] * xs[s])
  (for z > 0 the kernel sums q and subtracts z * sx: the same exact integer).

Why a row's bits depend only on its own x and the weights: the integer sum is exact, so the
order in which the instructions add its products (pairs, then 16-bit lanes, then 32-bit; or
4 at a time into 32 bits with VNNI's vpdpbusd: simd.py) cannot change it; the float steps
run per output lane in segment order, the same for 1 row or 4096, on any thread, under any
instruction set (simd.py: no FMA, no reassociation). Rows share the unpacked weights, never an accumulator; threads split
(row chunk, output tiles) pairs, never a sum.

Bounds that keep every integer step exact (simd.py's operations are exact below them): a
4-bit code times |xq| <= 127 is at most 1905, a pair 3810, the 8 pairs of a lane over a
32-column segment 30480 < 32767 (int16); 2-bit codes a quarter of that; 8-bit codes are
multiplied as |c| <= 128 by xq with c's sign (pairs <= 32512) and widened to int32 at once.
A segment's int32 sum is below 32 * 128 * 127 < 2**24, so float(i) is exact.

Weight layout (linear.py lays it out once at load, layout_codes): tiles of 8 outputs; per tile
the stored columns in quads of 4, each quad one load of the lanes simd.py describes, lane L
holding output L // 4 of the tile and column 4 * quad + L % 4:
  8-bit: 32 bytes, byte L = lane L (signed c);  4-bit: 16 bytes, lane L < 16 the low nibble
  of byte L, lane L >= 16 the high nibble of byte L - 16;  2-bit: 8 bytes, lane L bits
  2 (L // 8) of byte L % 8.
So one broadcast of a row's 4 xq bytes meets the 8 outputs' 4 codes lane for lane.
"""
import numpy as np
from numba import njit, prange

from tinyloop.backends.cpu.kernels.simd import (
    VNNI, abs_bytes, add_i16, add_i32, broadcast4, dot4_u8s8, fadd, fmul, load_bytes, load_crumbs, load_f32,
    load_f32x8, load_group8, load_i32, load_nibbles,
    madd_pairs, madd_u8s8, sign_bytes, splat_f32, splat_i32, store_f32x8, sub_i32, to_f32x8, zero_f32, zero_i16,
    zero_i32)

F = np.float32
TILE = 8                         # outputs per tile: the 8 int32 / float32 lanes of a 256-bit register
PER_PACK = {8: 1, 4: 2, 2: 4}    # quads in one 32-byte pack
# Rows a task takes: for each 32-column segment it reads every row's xq bytes and
# accumulators, so ROW_CHUNK rows' xq (ROW_CHUNK x K bytes) must stay in L1 across a tile's
# segments. 64 rows of a 1,536-wide input (98 KB) did not: a 128-row prefill chunk ran at
# 268 tok/s on one thread against 469 at 8 rows (the default model, a 1k-token prompt).
ROW_CHUNK = 8
TILE_GROUP = 16                  # tiles a task computes: 128 outputs


NONE_1D = np.zeros(0, np.float32)            # "no bias" / "no residual" for the kernel
NONE_2D = np.zeros((0, 0), np.float32)


def segment_of(group_size: int) -> int:
    """The segment length S = gcd(group size, 32), or 0 when the kernels cannot take the
    group size (S must hold whole quads of 4 columns)."""
    s = int(np.gcd(group_size, 32))
    return s if s % 4 == 0 else 0


# ---------------------------------------------------------------------------- activations
@njit(cache=True, boundscheck=False)
def quantize_rows(x, segment):
    """x: (T, K) float32, K a multiple of segment -> xq (T, K) int8, dx, xs (T, K / segment)
    float32, sx (T, K / segment) int32 (the module docstring's definition)."""
    n_rows, width = x.shape
    n_seg = width // segment
    xq = np.zeros((n_rows, width), np.int8)
    dx = np.zeros((n_rows, n_seg), np.float32)
    xs = np.zeros((n_rows, n_seg), np.float32)
    sx = np.zeros((n_rows, n_seg), np.int32)
    for r in range(n_rows):
        for s in range(n_seg):
            k0 = s * segment
            amax = F(0.0)
            finite = True
            for k in range(k0, k0 + segment):
                a = abs(x[r, k])
                if not a <= F(3.4028234663852886e38):          # inf or NaN
                    finite = False
                elif a > amax:
                    amax = a
            if not finite:
                dx[r, s] = F(np.nan)
                xs[r, s] = F(np.nan)
                continue
            d = amax / F(127.0)
            if d == F(0.0):
                continue
            total = 0
            for k in range(k0, k0 + segment):
                q = np.rint(x[r, k] / d)
                q = min(max(q, F(-127.0)), F(127.0))
                xq[r, k] = np.int8(q)
                total += np.int32(q)
            dx[r, s] = d
            sx[r, s] = total
            xs[r, s] = d * F(total)
    return xq, dx, xs, sx


# ---------------------------------------------------------------------------- one segment's integer sums
@njit(inline="always", cache=True)
def _out_byte(r, out_width, col, t):
    """Where row r's 8 outputs of tile t start in out (bytes)."""
    return (r * out_width + col + t * TILE) * 4


@njit(inline="always", cache=True)
def _accumulate(out, o_byte, dvec, mvec, dx, xs, x_byte, isum):
    """out lanes at byte o_byte += (scale' * dx) * float(isum) + min' * xs (float32, lane-wise),
    dx and xs the row's segment's (at byte x_byte of their arrays)."""
    term = fadd(fmul(fmul(dvec, splat_f32(load_f32(dx, x_byte))), to_f32x8(isum)),
                fmul(mvec, splat_f32(load_f32(xs, x_byte))))
    store_f32x8(out, o_byte, fadd(load_f32x8(out, o_byte), term))


@njit(inline="always", cache=True)
def _sum4_8quads_pairs(w0, w1, w2, w3, w4, w5, w6, w7, xq, xb):
    """The 32-column segment of 4- or 2-bit codes (8 quads already unpacked) against the row's
    xq bytes at xb: int32 lanes (16-bit partial sums, which the bounds keep exact)."""
    s = add_i16(add_i16(add_i16(madd_u8s8(w0, broadcast4(xq, xb)), madd_u8s8(w1, broadcast4(xq, xb + 4))),
                        add_i16(madd_u8s8(w2, broadcast4(xq, xb + 8)), madd_u8s8(w3, broadcast4(xq, xb + 12)))),
                add_i16(add_i16(madd_u8s8(w4, broadcast4(xq, xb + 16)), madd_u8s8(w5, broadcast4(xq, xb + 20))),
                        add_i16(madd_u8s8(w6, broadcast4(xq, xb + 24)), madd_u8s8(w7, broadcast4(xq, xb + 28)))))
    return madd_pairs(s)


@njit(inline="always", cache=True)
def _sum4_8quads_vnni(w0, w1, w2, w3, w4, w5, w6, w7, xq, xb):
    """The same exact int32 sums by `vpdpbusd` (4 products a lane at once, into int32), in two
    chains of 4 so consecutive instructions do not wait on each other."""
    a = dot4_u8s8(dot4_u8s8(dot4_u8s8(dot4_u8s8(zero_i32(), w0, broadcast4(xq, xb)), w1, broadcast4(xq, xb + 4)),
                            w2, broadcast4(xq, xb + 8)), w3, broadcast4(xq, xb + 12))
    b = dot4_u8s8(dot4_u8s8(dot4_u8s8(dot4_u8s8(zero_i32(), w4, broadcast4(xq, xb + 16)), w5,
                                      broadcast4(xq, xb + 20)), w6, broadcast4(xq, xb + 24)), w7, broadcast4(xq, xb + 28))
    return add_i32(a, b)


# Integer sums are exact whichever instructions add them, so the choice changes no bit
# (tests/test_cpu_simd.py compiles both and compares).
_sum4_8quads = _sum4_8quads_vnni if VNNI else _sum4_8quads_pairs


@njit(inline="always", cache=True)
def _quad(codes, tile_byte, q, bits):
    """Quad q of a tile's codes (its packs start at byte tile_byte): I8x32 lanes."""
    if bits == 4:
        return load_nibbles(codes, tile_byte + (q >> 1) * 32, q & 1)
    if bits == 2:
        return load_crumbs(codes, tile_byte + (q >> 2) * 32, q & 3)
    return load_bytes(codes, tile_byte + q * 32)


@njit(inline="always", cache=True)
def _signed_quad(magnitude, codes, w_byte, xq, xb):
    """One quad of 8-bit signed codes c (at byte w_byte; `magnitude` = |c|, unpacked once per
    segment) against the row's 4 xq bytes at xb: sum |c| (xq with c's sign) = sum c xq, int32 lanes."""
    return madd_pairs(madd_u8s8(magnitude, sign_bytes(broadcast4(xq, xb), load_bytes(codes, w_byte))))


# ---------------------------------------------------------------------------- the kernel
def _linear_int(xq, dx, xs, sx, codes, scale, mins, bits, segment, group_size, offset, out, col, bias, residual):
    """out[r, col + o] = the definition's y for every row r of xq and output o of the block,
    then + bias[col + o] if bias has any element, then + residual[r, col + o] if residual has
    any (the order of the NumPy backend's residual + (x W^T + bias)).

    xq: (T, Kp) int8, dx, xs, sx: (T, Kp / segment) (quantize_rows); codes: (n_tiles,
    n_packs, 32) uint8 (the layout above); scale, mins: (n_tiles, n_groups, 8) float32, or
    uint16 half bits widened exactly (scale, min'); offset: z (subtracted as z * sx; 0 for 8 bits, whose codes are
    signed); out: (T, W) float32 with W >= col + 8 n_tiles (padding columns are written);
    bias: (W,) float32 or empty; residual: (T, W) float32 or empty."""
    n_rows, width = xq.shape
    n_tiles, n_packs = codes.shape[0], codes.shape[1]
    n_groups = scale.shape[1]
    n_seg = width // segment
    quads = segment // 4
    seg_per_group = group_size // segment
    out_width = out.shape[1]
    n_chunks = (n_rows + ROW_CHUNK - 1) // ROW_CHUNK
    n_tile_groups = (n_tiles + TILE_GROUP - 1) // TILE_GROUP
    # items run tile group by tile group (row chunks inner), so a thread's consecutive items
    # reuse one tile group's weights from L2 (a thread takes a contiguous range of items)
    for item in prange(n_chunks * n_tile_groups):
        r0 = (item % n_chunks) * ROW_CHUNK
        r1 = min(r0 + ROW_CHUNK, n_rows)
        t0 = (item // n_chunks) * TILE_GROUP
        for t in range(t0, min(t0 + TILE_GROUP, n_tiles)):
            for r in range(r0, r1):
                store_f32x8(out, _out_byte(r, out_width, col, t), zero_f32())
            for s in range(n_seg):
                g = s // seg_per_group
                dvec = load_group8(scale, (t * n_groups + g) * TILE)
                mvec = load_group8(mins, (t * n_groups + g) * TILE)
                tile_byte = t * n_packs * 32
                q0 = s * quads                          # the segment's first quad
                if bits != 8 and quads == 8:           # the common case: 32-column segments, unpacked once
                    w0 = _quad(codes, tile_byte, q0, bits)
                    w1 = _quad(codes, tile_byte, q0 + 1, bits)
                    w2 = _quad(codes, tile_byte, q0 + 2, bits)
                    w3 = _quad(codes, tile_byte, q0 + 3, bits)
                    w4 = _quad(codes, tile_byte, q0 + 4, bits)
                    w5 = _quad(codes, tile_byte, q0 + 5, bits)
                    w6 = _quad(codes, tile_byte, q0 + 6, bits)
                    w7 = _quad(codes, tile_byte, q0 + 7, bits)
                    for r in range(r0, r1):
                        isum = _sum4_8quads(w0, w1, w2, w3, w4, w5, w6, w7, xq, r * width + s * segment)
                        if offset:
                            isum = sub_i32(isum, splat_i32(offset * load_i32(sx, (r * n_seg + s) * 4)))
                        _accumulate(out, _out_byte(r, out_width, col, t), dvec, mvec, dx, xs, (r * n_seg + s) * 4, isum)
                elif bits != 8:                         # short segments (groups of 4, 8 or 16 columns)
                    for r in range(r0, r1):
                        xb = r * width + s * segment
                        s16 = zero_i16()
                        for q in range(quads):
                            s16 = add_i16(s16, madd_u8s8(_quad(codes, tile_byte, q0 + q, bits),
                                                         broadcast4(xq, xb + 4 * q)))
                        isum = madd_pairs(s16)
                        if offset:
                            isum = sub_i32(isum, splat_i32(offset * load_i32(sx, (r * n_seg + s) * 4)))
                        _accumulate(out, _out_byte(r, out_width, col, t), dvec, mvec, dx, xs, (r * n_seg + s) * 4, isum)
                elif quads == 8:                        # 8-bit signed codes, 32 columns: |c| unpacked once
                    a0 = abs_bytes(_quad(codes, tile_byte, q0, 8))
                    a1 = abs_bytes(_quad(codes, tile_byte, q0 + 1, 8))
                    a2 = abs_bytes(_quad(codes, tile_byte, q0 + 2, 8))
                    a3 = abs_bytes(_quad(codes, tile_byte, q0 + 3, 8))
                    a4 = abs_bytes(_quad(codes, tile_byte, q0 + 4, 8))
                    a5 = abs_bytes(_quad(codes, tile_byte, q0 + 5, 8))
                    a6 = abs_bytes(_quad(codes, tile_byte, q0 + 6, 8))
                    a7 = abs_bytes(_quad(codes, tile_byte, q0 + 7, 8))
                    b = tile_byte + q0 * 32
                    for r in range(r0, r1):
                        xb = r * width + s * segment
                        isum = add_i32(add_i32(add_i32(_signed_quad(a0, codes, b, xq, xb),
                                                       _signed_quad(a1, codes, b + 32, xq, xb + 4)),
                                               add_i32(_signed_quad(a2, codes, b + 64, xq, xb + 8),
                                                       _signed_quad(a3, codes, b + 96, xq, xb + 12))),
                                       add_i32(add_i32(_signed_quad(a4, codes, b + 128, xq, xb + 16),
                                                       _signed_quad(a5, codes, b + 160, xq, xb + 20)),
                                               add_i32(_signed_quad(a6, codes, b + 192, xq, xb + 24),
                                                       _signed_quad(a7, codes, b + 224, xq, xb + 28))))
                        _accumulate(out, _out_byte(r, out_width, col, t), dvec, mvec, dx, xs, (r * n_seg + s) * 4, isum)
                else:                                   # 8-bit, short segments
                    for r in range(r0, r1):
                        xb = r * width + s * segment
                        isum = zero_i32()
                        for q in range(quads):
                            w_byte = tile_byte + (q0 + q) * 32
                            isum = add_i32(isum, _signed_quad(abs_bytes(load_bytes(codes, w_byte)), codes, w_byte,
                                                              xq, xb + 4 * q))
                        _accumulate(out, _out_byte(r, out_width, col, t), dvec, mvec, dx, xs, (r * n_seg + s) * 4, isum)
            if bias.shape[0] or residual.shape[0]:     # the epilogue, after the whole sum
                for r in range(r0, r1):
                    o_byte = _out_byte(r, out_width, col, t)
                    y = load_f32x8(out, o_byte)
                    if bias.shape[0]:
                        y = fadd(y, load_f32x8(bias, (col + t * TILE) * 4))
                    if residual.shape[0]:
                        y = fadd(y, load_f32x8(residual, o_byte))
                    store_f32x8(out, o_byte, y)


# threaded, and one thread for small calls (waking threads costs more than they save there):
# the same body (prange is range in the latter), so the same bits
linear_int = njit(cache=True, parallel=True, boundscheck=False)(_linear_int)
linear_int_serial = njit(cache=True, boundscheck=False)(_linear_int)


@njit(cache=True)
def quantized_linear(x, segment, codes, scale, mins, bits, group_size, offset, out, col, bias, residual, threaded):
    """One call for a block whose input is x itself (no act-order or padding): x (T, Kp)
    quantized (quantize_rows), then the kernel, threaded or on this thread."""
    xq, dx, xs, sx = quantize_rows(x, segment)
    if threaded:
        linear_int(xq, dx, xs, sx, codes, scale, mins, bits, segment, group_size, offset, out, col, bias, residual)
    else:
        linear_int_serial(xq, dx, xs, sx, codes, scale, mins, bits, segment, group_size, offset, out, col, bias,
                          residual)


def warm_up() -> None:
    """Compile (or load from numba's cache) every kind's paths on tiny arrays."""
    for bits in (8, 4, 2):
        for segment in (32, 16):
            xq, dx, xs, sx = quantize_rows(np.zeros((2, 32), np.float32), segment)
            codes = np.zeros((1, 8 // PER_PACK[bits], 32), np.uint8)
            out = np.zeros((2, TILE), np.float32)
            for dtype in (np.float32, np.uint16):
                scale = np.zeros((1, 1, TILE), dtype)
                for kernel in (linear_int, linear_int_serial):
                    for bias, residual in ((NONE_1D, NONE_2D), (out[0].copy(), out.copy())):
                        kernel(xq, dx, xs, sx, codes, scale, scale, bits, segment, 32, 0, out, 0, bias, residual)
                for threaded in (False, True):
                    for bias, residual in ((NONE_1D, NONE_2D), (out[0].copy(), out.copy())):
                        quantized_linear(np.zeros((2, 32), np.float32), segment, codes, scale, scale, bits, 32, 0,
                                         out, 0, bias, residual, threaded)
