"""The integer kernels' weight layout (kernels/linear_int.py), made once at load from the
codes as the file stores them: a byte shuffle, no dequantization and no requantization.

A block's codes (N outputs, Kp stored columns, 2/4/8 bits) become tiles of 8 outputs; per
tile, quads of 4 columns, 32 codes each, lane L holding output L // 4, column 4 * quad + L % 4;
1, 2 or 4 quads packed to 32 bytes (kernels/linear_int.py gives the bit order).
Scales and mins become (n_tiles, n_groups, 8), one 8-lane load per tile and group: kept as
half bits (uint16, widened exactly in the kernel) when the file stores them as float16 and
the folded min' is a half too (GGUF's Q4_0, Q4_1, Q8_0: 2 bytes a group each instead of 4),
else float32.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinyloop.backends.cpu.kernels.linear_int import PER_PACK, TILE
from tinyloop.model.quant import unpack_codes


@dataclass
class IntWeights:
    codes: np.ndarray         # (n_tiles, n_packs, 32) uint8: ceil(Kp / 4 / PER_PACK[bits]) packs a tile
    scale: np.ndarray         # (n_tiles, n_groups, 8) float32, or uint16 half bits
    mins: np.ndarray          # (n_tiles, n_groups, 8) the same type: min' (the kernel's offset folded in)
    offset: int               # z the kernel subtracts as z * sum(xq) (2 and 4 bits; 0 for 8 bits)


def code_offset(bits: int, scale: np.ndarray, mins: np.ndarray) -> int:
    """z: 128 for 8 bits (the codes are stored signed); for 2 and 4 bits 2**(bits - 1) when
    every min is exactly -z * scale (GGUF's Q4_0), else 0."""
    if bits == 8:
        return 128
    z = 1 << (bits - 1)
    return z if np.array_equal(mins, np.float32(-z) * scale) else 0


def lanes_of(codes: np.ndarray) -> np.ndarray:
    """(N, Kp) integer codes -> (n_tiles, Kp / 4, 32): lane L of quad j of tile t holds the
    code of output 8 t + L // 4, column 4 j + L % 4; missing outputs are code 0."""
    n, width = codes.shape
    padded = -(-n // TILE) * TILE
    grown = np.zeros((padded, width), codes.dtype)
    grown[:n] = codes
    tiles = grown.reshape(padded // TILE, TILE, width // 4, 4).transpose(0, 2, 1, 3)    # (t, quad, out, col)
    return np.ascontiguousarray(tiles.reshape(padded // TILE, width // 4, 32))


def pack_lanes(lanes: np.ndarray, bits: int) -> np.ndarray:
    """(n_tiles, n_quads, 32) lane codes -> (n_tiles, n_packs, 32) uint8, the bytes the kernel
    loads: PER_PACK[bits] consecutive quads per pack (the last padded with code 0)."""
    per = PER_PACK[bits]
    if bits == 8:
        return lanes.astype(np.int8).view(np.uint8)
    n_tiles, n_quads, _ = lanes.shape
    grown = np.zeros((n_tiles, -(-n_quads // per) * per, 32), np.uint8)
    grown[:, :n_quads] = lanes
    grouped = grown.reshape(n_tiles, -1, per, 32)                          # (tile, pack, field, lane)
    packed = np.zeros((n_tiles, grouped.shape[1], 32), np.uint8)
    for field in range(per):                                               # quad i of a pack at bits i * bits
        packed |= grouped[:, :, field] << np.uint8(field * bits)
    return packed


def tiled_groups(per_output: np.ndarray) -> np.ndarray:
    """(N, n_groups) -> (n_tiles, n_groups, 8) of the same dtype; missing outputs are 0."""
    n, groups = per_output.shape
    padded = -(-n // TILE) * TILE
    grown = np.zeros((padded, groups), per_output.dtype)
    grown[:n] = per_output
    return np.ascontiguousarray(grown.reshape(padded // TILE, TILE, groups).transpose(0, 2, 1))


def int_weights(packed_codes: np.ndarray, stored_scale: np.ndarray, stored_mins: np.ndarray, bits: int) -> IntWeights:
    """packed_codes: (N, Kp * bits / 8) uint8 as stored; stored_scale, stored_mins: (N, n_groups)
    float16 or float32, as stored."""
    scale, mins = (np.asarray(a).astype(np.float32) for a in (stored_scale, stored_mins))
    z = code_offset(bits, scale, mins)
    codes = unpack_codes(packed_codes, bits).astype(np.int16)                          # (N, Kp)
    if bits == 8:
        codes = codes - 128                                                             # signed c = q - 128
        folded = (mins + np.float32(z) * scale).astype(np.float32)                     # min' = min + 128 scale
    else:
        folded = (mins + np.float32(z) * scale).astype(np.float32) if z else mins       # unsigned q, z subtracted
    halves = (np.asarray(stored_scale).dtype == np.float16 and np.asarray(stored_mins).dtype == np.float16
              and np.array_equal(folded.astype(np.float16).astype(np.float32), folded))
    if halves:                    # exact: every value is a half
        scale, folded = (a.astype(np.float16).view(np.uint16) for a in (scale, folded))
    return IntWeights(pack_lanes(lanes_of(codes), bits), tiled_groups(scale), tiled_groups(folded),
                      0 if bits == 8 else z)


def codes_of(weights: IntWeights, bits: int, n_quads: int) -> np.ndarray:
    """The layout's inverse: (N padded to 8, 4 n_quads) int16 codes c (signed for 8 bits,
    q - z for 2 and 4), for PackedLinear.dense (the quantizer's calibration reads it)."""
    b = weights.codes
    if bits == 8:
        lanes = b.view(np.int8).astype(np.int16)
    else:
        mask = (1 << bits) - 1
        fields = [(b >> np.uint8(field * bits)) & mask for field in range(PER_PACK[bits])]
        lanes = np.stack(fields, axis=2).reshape(b.shape[0], -1, 32).astype(np.int16)   # (tile, quad, lane)
    lanes = lanes[:, :n_quads]
    n_tiles = lanes.shape[0]
    codes = lanes.reshape(n_tiles, n_quads, TILE, 4).transpose(0, 2, 1, 3).reshape(n_tiles * TILE, n_quads * 4)
    return codes - weights.offset
