"""Twin of cuda/linear.cu on a host PackedLinear (pack_linear(..., xp=numpy)).

`linear_rows` does what linear_rows_* do, float32 operation for operation: lane l of
column o adds, in order, the products weight * input of its words of the row, each with
one rounding (acc = fma(weight, input, acc)): in each stripe of 128 words, the chunk of 4
from 128 s + 4 l on (within a word, its columns in order); the 32 lane sums go through
the warp butterfly; then the bias is added. Vectorised over rows, columns and lanes.

`linear_mma` does what linear_mma_int4 (cuda/linear_mma.cu) does on the CPU harness, float32
operation for operation: the weights rounded once to half, x rounded to half, each split's
products added in the kernel's k order (the mma stand-in's: slot by slot), the splits added in
increasing order, then the bias. On a GPU the tensor cores add a step's 16 products their own
way, so there it is the reference within a tolerance.

`linear_bulk_reference` is what linear_bulk_* approximate (float64 products and sums):
the bulk kernel's order depends on its tiles and on FMA contraction, so tests compare
it within a tolerance; `linear_tc_reference` the same for the tensor-core kernels
(cuda/linear_tc.cu), whose operands are rounded to half first.
"""
from __future__ import annotations

import numpy as np

from tinyloop.backends.reference.twins.arith import fma_f32, warp_sum
from tinyloop.backends.cuda.launch.linear import ROWS_SPAN_WORDS as SPAN, mma_eligible, mma_split_k
from tinyloop.backends.cuda.launch.packing import (
    COLUMNS_PER_WORD,
    LinearSegment,
    PackedLinear,
)

F = np.float32


def stored_weights(seg: LinearSegment) -> np.ndarray:
    """The segment's weights in stored column order, as the kernel decodes them:
    (out, words_per_row * CPW) float32. Padding bytes use the last group's scale and min."""
    if seg.kind == "f32":
        return np.asarray(seg.weights, F)
    if seg.kind == "f16":
        return np.asarray(seg.weights).astype(F)
    bits = int(seg.kind[3:])
    per_byte = 8 // bits
    packed = np.asarray(seg.weights)                                   # (out, bytes)
    codes = np.stack([(packed >> np.uint8(slot * bits)) & np.uint8((1 << bits) - 1)
                      for slot in range(per_byte)], axis=2)            # (out, bytes, per_byte)
    codes = codes.reshape(packed.shape[0], -1).astype(F)              # (out, columns)
    group = np.minimum(np.arange(codes.shape[1]) // seg.group_size, seg.groups - 1)   # (columns,)
    # float16 scales and mins widen exactly, as the kernel's __half2float
    scale = np.asarray(seg.scale).astype(F)[:, group]                  # (out, columns)
    minimum = np.asarray(seg.min).astype(F)[:, group]
    return codes * scale + minimum                                     # two float32 roundings


def stored_inputs(x: np.ndarray, seg: LinearSegment, in_features: int) -> np.ndarray:
    """(T, in) -> (T, columns): the input each stored column multiplies, 0 for padding."""
    columns = seg.words_per_row * COLUMNS_PER_WORD[seg.kind]
    j = np.arange(columns)
    source = np.full(columns, in_features)                             # (columns,) padding by default
    known = j < seg.stored_in
    source[known] = np.asarray(seg.perm)[j[known]] if seg.perm is not None else j[known]
    valid = source < in_features
    inputs = np.zeros((x.shape[0], columns), F)
    inputs[:, valid] = x[:, source[valid]]
    return inputs


def linear_rows_segment(x: np.ndarray, seg: LinearSegment, in_features: int,
                        columns_per_pass: int = 256) -> np.ndarray:
    """x: (T, in) float32 -> (T, seg out) float32, the bits linear_rows_<kind> writes.
    Output columns go `columns_per_pass` at a time, to bound the (T, columns, in) products."""
    inputs = stored_inputs(np.asarray(x, F), seg, in_features)         # (T, words * cpw)
    weights = stored_weights(seg)                                      # (out, words * cpw)
    out = np.concatenate([_warp_sums(inputs, weights[o:o + columns_per_pass], seg)
                          for o in range(0, seg.out_features, columns_per_pass)], axis=1)
    if seg.bias is not None:
        out = out + np.asarray(seg.bias, F)
    return out


def _warp_sums(inputs: np.ndarray, weights: np.ndarray, seg: LinearSegment) -> np.ndarray:
    """(T, columns) inputs, (n, columns) weights -> (T, n): lane sums in word order, each
    product added with one rounding (tl_fma), then the butterfly."""
    cpw = COLUMNS_PER_WORD[seg.kind]
    rows, n = inputs.shape[0], weights.shape[0]
    words = seg.words_per_row
    stripes = -(-words // (32 * SPAN))
    # the last stripe's words past the row's end are zeros here and never summed (as on the
    # device: an FMA's +0 would turn an accumulator's -0 into +0)
    w = np.zeros((n, stripes * 32 * SPAN, cpw), F)
    w[:, :words] = weights.reshape(n, words, cpw)
    x = np.zeros((rows, stripes * 32 * SPAN, cpw), F)
    x[:, :words] = inputs.reshape(rows, words, cpw)
    w = w.reshape(n, stripes, 32, SPAN, cpw)                           # word = (stripe * 32 + lane) * SPAN + j
    x = x.reshape(rows, stripes, 32, SPAN, cpw)
    lanes = np.zeros((rows, n, 32), F)                                 # (T, n, lane)
    for stripe in range(stripes):
        in_row = (stripe * 32 + np.arange(32)) * SPAN < words           # (lane,): the lane's chunk is stored
        for j in range(SPAN):
            for slot in range(cpw):
                summed = fma_f32(w[None, :, stripe, :, j, slot], x[:, None, stripe, :, j, slot], lanes)
                lanes = np.where(in_row, summed, lanes)
    return warp_sum(lanes)                                             # (T, n)


def linear_rows(x: np.ndarray, packed: PackedLinear) -> np.ndarray:
    """x: (T, in) float32 -> (T, out) float32, all segments, as the launcher fills `out`."""
    return np.concatenate([linear_rows_segment(x, seg, packed.in_features)
                           for seg in packed.segments], axis=1)


def dense_weight(packed: PackedLinear) -> np.ndarray:
    """The fused weight (out, in) float32 in input column order, from the packed form."""
    weight = np.zeros((packed.out_features, packed.in_features), F)
    for seg in packed.segments:
        stored = stored_weights(seg)[:, :seg.stored_in]               # (seg out, stored_in)
        source = np.asarray(seg.perm) if seg.perm is not None else np.arange(seg.stored_in)
        keep = source < packed.in_features
        rows = slice(seg.out_offset, seg.out_offset + seg.out_features)
        weight[rows, source[keep]] = stored[:, keep]
    return weight


def linear_tc_reference(x: np.ndarray, packed: PackedLinear) -> np.ndarray:
    """What linear_tc_* (cuda/linear_tc.cu) approximate: x and the dequantized weights each
    rounded to half, then the exact (float64) x @ W.T + bias. The kernel sums in float32 in
    an order the tensor cores choose, so tests compare it within a tolerance."""
    halves = np.asarray(x).astype(np.float16).astype(np.float64)
    weight = dense_weight(packed).astype(np.float16).astype(np.float64)
    return _add_bias(halves @ weight.T, packed)


def _add_bias(out: np.ndarray, packed: PackedLinear) -> np.ndarray:
    for seg in packed.segments:
        if seg.bias is not None:
            out[:, seg.out_offset:seg.out_offset + seg.out_features] += np.asarray(seg.bias, np.float64)
    return out


def linear_bulk_reference(x: np.ndarray, packed: PackedLinear) -> np.ndarray:
    """x: (T, in) -> (T, out) float64: the exact value of x @ W.T + bias for the packed W."""
    return _add_bias(np.asarray(x, np.float64) @ dense_weight(packed).astype(np.float64).T, packed)


def _mma_order(chunks: int) -> np.ndarray:
    """The stored columns of one split (relative to its first) in the order linear_mma_int4
    adds their products: chunk, word q of the lane's four, step (two a word), then the mma's
    16 slots in order; slot k belongs to lane c = (k % 8) // 2, register k // 8 (b0 or b1),
    half k % 2, which hold code 2 step + register + 4 half of the lane's word q."""
    order = []
    for ch in range(chunks):
        for q in range(4):
            for step in range(2):
                for k in range(16):
                    c, register, half = (k % 8) // 2, k // 8, k % 2
                    order.append(ch * 128 + 32 * c + 8 * q + 2 * step + register + 4 * half)
    return np.asarray(order)


def mma_weights(seg: LinearSegment) -> np.ndarray:
    """(out, stored columns) float32: half(code * scale + min), rounded once (float64 holds
    the product and sum exactly), as __hfma2 on the device and the harness's double path."""
    packed = np.asarray(seg.weights)                                   # (out, bytes)
    codes = np.stack([packed & np.uint8(15), packed >> np.uint8(4)], axis=2).reshape(packed.shape[0], -1)
    group = np.minimum(np.arange(codes.shape[1]) // seg.group_size, seg.groups - 1)
    scale = np.asarray(seg.scale).astype(np.float64)[:, group]
    minimum = np.asarray(seg.min).astype(np.float64)[:, group]
    return (codes.astype(np.float64) * scale + minimum).astype(np.float16).astype(F)


def linear_mma_segment(x: np.ndarray, seg: LinearSegment, in_features: int, split_k: int) -> np.ndarray:
    """x: (T, in) -> (T, seg out) float32, the bits linear_mma_int4 writes on the harness."""
    inputs = stored_inputs(np.asarray(x, F), seg, in_features).astype(np.float16).astype(F)   # (T, cols)
    weights = mma_weights(seg)                                         # (out, cols)
    columns = weights.shape[1]
    total = None
    for k0 in range(0, columns, split_k):
        chunks = -(-min(split_k, columns - k0) // 128)
        acc = np.zeros((inputs.shape[0], weights.shape[0]), F)         # (T, out)
        for col in k0 + _mma_order(chunks):
            if col < columns:                                          # past the row: +0, no change
                acc = acc + inputs[:, col, None] * weights[None, :, col]   # exact products of halves
        total = acc if total is None else total + acc
    if seg.bias is not None:
        total = total + np.asarray(seg.bias, F)
    return total


def linear_mma(x: np.ndarray, packed: PackedLinear) -> np.ndarray:
    """x: (T, in) -> (T, out) float32 as the launcher fills `out` with an MmaPath: the segments
    linear_mma_int4 takes through it, the others through linear_rows_*."""
    pieces = []
    for seg in packed.segments:
        if mma_eligible(seg):
            split_k = mma_split_k(seg.words_per_row * 8, seg.out_features)
            pieces.append(linear_mma_segment(x, seg, packed.in_features, split_k))
        else:
            pieces.append(linear_rows_segment(x, seg, packed.in_features))
    return np.concatenate(pieces, axis=1)
