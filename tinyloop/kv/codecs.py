"""How keys and values are stored in the KV cache, one codec per cache mode.

A codec stores rows (one token's keys or values: (n_kv, hd) float32) into its
arrays and reads float32 back. Every operation is per row and elementwise, so what a
row reads back never depends on which other rows were written with it: the cache
modes keep the forward pass batch-invariant, and speculative decoding exact.

Quantized modes use groups along the head dimension, per token and per head: each
group of GROUP values (32, or the whole head if hd is not a multiple of 32) gets an
f16 scale and min, codes are unsigned, value = code * scale + min. Per-token groups
are the only grouping that can be finished when a token is written: per-channel key
grouping (over tokens) would need a full-precision residual buffer that is
re-quantized later, which breaks write-once rows, rollback and ring buffers.
"""
from __future__ import annotations

import numpy as np

from tinyloop.backends.cpu.layout import canonical
from tinyloop.model.quant import pack_codes, unpack_codes

GROUP = 32


def group_size(head_dim: int) -> int:
    return GROUP if head_dim % GROUP == 0 else head_dim


class FloatCodec:
    def __init__(self, dtype):
        self.dtype = np.dtype(dtype)

    def bytes_per_row(self, n_kv: int, head_dim: int) -> int:
        return n_kv * head_dim * self.dtype.itemsize

    def allocate(self, n_slots, n_kv, rows, head_dim, xp=np) -> dict:
        return {"data": xp.zeros((n_slots, n_kv, rows, head_dim), self.dtype)}

    def store(self, arrays: dict, slot: int, rows, x) -> None:
        """x: (T, n_kv, hd) float32 written at physical rows (slice or (T,) array)."""
        arrays["data"][slot][:, rows] = x.transpose(1, 0, 2)

    def load(self, arrays: dict, slot: int, rows):
        """-> (n_kv, *rows shape, hd) float32."""
        # one copy into the layout attention multiplies in (ops/layout.py), whatever rows did
        return canonical(arrays["data"][slot][:, rows])


class IntCodec:
    def __init__(self, bits: int):
        self.bits = bits
        self.levels = (1 << bits) - 1

    def bytes_per_row(self, n_kv: int, head_dim: int) -> int:
        groups = head_dim // group_size(head_dim)
        return n_kv * (head_dim * self.bits // 8 + groups * 4)       # codes + f16 scale + f16 min

    def allocate(self, n_slots, n_kv, rows, head_dim, xp=np) -> dict:
        groups = head_dim // group_size(head_dim)
        return {"codes": xp.zeros((n_slots, n_kv, rows, head_dim * self.bits // 8), np.uint8),
                "scale": xp.zeros((n_slots, n_kv, rows, groups), np.float16),
                "min": xp.zeros((n_slots, n_kv, rows, groups), np.float16)}

    def quantize(self, x: np.ndarray):
        """x: (..., hd) float32 -> codes (..., hd) uint8, scale, min (..., groups) float16."""
        head_dim = x.shape[-1]
        g = group_size(head_dim)
        grouped = x.reshape(*x.shape[:-1], head_dim // g, g)                     # (..., groups, g)
        low = grouped.min(axis=-1)
        scale = ((grouped.max(axis=-1) - low) / np.float32(self.levels)).astype(np.float16)
        offset = low.astype(np.float16)
        # codes from the stored (f16) scale and min, so the error bound is half a step
        scale32 = scale.astype(np.float32)[..., None]
        safe = np.where(scale32 == 0, np.float32(1), scale32)
        codes = np.clip(np.rint((grouped - offset.astype(np.float32)[..., None]) / safe), 0, self.levels)
        return codes.astype(np.uint8).reshape(x.shape), scale, offset

    def dequantize(self, codes, scale, offset) -> np.ndarray:
        """codes (..., hd) uint8 with (..., groups) scale/min -> (..., hd) float32."""
        head_dim = codes.shape[-1]
        g = group_size(head_dim)
        grouped = codes.reshape(*codes.shape[:-1], head_dim // g, g).astype(np.float32)
        values = grouped * scale.astype(np.float32)[..., None] + offset.astype(np.float32)[..., None]
        return values.reshape(codes.shape)

    def store(self, arrays: dict, slot: int, rows, x) -> None:
        codes, scale, offset = self.quantize(x.transpose(1, 0, 2))               # (n_kv, T, ...)
        n_kv, count, head_dim = codes.shape
        packed = pack_codes(codes.reshape(n_kv * count, head_dim), self.bits).reshape(n_kv, count, -1)
        arrays["codes"][slot][:, rows] = packed
        arrays["scale"][slot][:, rows] = scale
        arrays["min"][slot][:, rows] = offset

    def load(self, arrays: dict, slot: int, rows):
        packed = arrays["codes"][slot][:, rows]                                  # (n_kv, *rows, bytes)
        lead = packed.shape[:-1]
        head_dim = packed.shape[-1] * 8 // self.bits
        codes = unpack_codes(packed.reshape(-1, packed.shape[-1]), self.bits).reshape(*lead, head_dim)
        return self.dequantize(codes, arrays["scale"][slot][:, rows], arrays["min"][slot][:, rows])


def hadamard(head_dim: int) -> np.ndarray:
    """The orthonormal Sylvester-Hadamard matrix of order head_dim (a power of two)."""
    if head_dim & (head_dim - 1):
        raise ValueError(f"the Hadamard rotation needs a power-of-two head_dim, got {head_dim}")
    matrix = np.ones((1, 1))
    while matrix.shape[0] < head_dim:
        matrix = np.block([[matrix, matrix], [matrix, -matrix]])
    return (matrix / np.sqrt(head_dim)).astype(np.float32)


KV_MODES = ("fp16", "int8", "int4", "int4-h", "fp32")


def codec_for(mode: str):
    return {"fp32": FloatCodec(np.float32), "fp16": FloatCodec(np.float16), "int8": IntCodec(8),
            "int4": IntCodec(4), "int4-h": IntCodec(4)}[mode]
