"""ggml block formats -> TinyLoop group-wise tensors, without loss.

    Q4_1  per 32 values: f16 d, f16 m, 16 bytes of nibbles     w = q * d + m
    Q4_0  per 32 values: f16 d, 16 bytes of nibbles            w = (q - 8) * d  = q * d + (-8 d)
    Q8_0  per 32 values: f16 d, 32 signed bytes                w = s * d        = (s + 128) * d + (-128 d)

In a 4-bit block, byte j holds value j in its low nibble and value j + 16 in its high
nibble. -8 d and -128 d are exact in f16 (a power-of-two multiple), and the float32
products and sums of the dequantization are exact, so the converted tensor
dequantizes to the very same numbers as ggml's formula.
"""
from __future__ import annotations

import numpy as np

from tinyloop.model.quant import QuantizedTensor, pack_codes

BLOCK = 32
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
PLAIN_BYTES = {"F32": 4, "F16": 2, "BF16": 2}
SUPPORTED = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1")


def tensor_nbytes(type_name: str, shape: tuple) -> int:
    count = int(np.prod(shape))
    if type_name in PLAIN_BYTES:
        return count * PLAIN_BYTES[type_name]
    return count // BLOCK * BLOCK_BYTES[type_name]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(..., 16) bytes -> (..., 32) codes in value order."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def decode(type_name: str, raw: np.ndarray, shape: tuple):
    """Raw tensor bytes -> an ndarray (F32/F16/BF16 kept as stored) or a QuantizedTensor."""
    if type_name == "F32":
        return raw.view(np.float32).reshape(shape)
    if type_name == "F16":
        return raw.view(np.float16).reshape(shape)
    if type_name == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    rows, row_len = (int(np.prod(shape[:-1])), shape[-1])
    if row_len % BLOCK:
        raise ValueError(f"{type_name} rows must be a multiple of {BLOCK} long, got {row_len}")
    blocks = raw.reshape(rows, row_len // BLOCK, BLOCK_BYTES[type_name])         # (rows, groups, bytes)
    scale = np.ascontiguousarray(blocks[:, :, 0:2]).view(np.float16)[:, :, 0]     # (rows, groups)
    if type_name == "Q4_1":
        offset = np.ascontiguousarray(blocks[:, :, 2:4]).view(np.float16)[:, :, 0]
        codes = _nibbles(blocks[:, :, 4:20])
        bits = 4
    elif type_name == "Q4_0":
        offset = (scale.astype(np.float32) * -8).astype(np.float16)
        codes = _nibbles(blocks[:, :, 2:18])
        bits = 4
    elif type_name == "Q8_0":
        offset = (scale.astype(np.float32) * -128).astype(np.float16)
        codes = (blocks[:, :, 2:34].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
        bits = 8
    else:
        raise ValueError(f"unsupported tensor type {type_name}")
    codes = codes.reshape(rows, row_len)
    return QuantizedTensor(pack_codes(codes, bits), np.ascontiguousarray(scale), np.ascontiguousarray(offset),
                           bits, BLOCK, f"gguf-{type_name.lower()}")


def reference_dequantize(type_name: str, raw: np.ndarray, shape: tuple) -> np.ndarray:
    """ggml's own formulas, written out directly (the tests' reference)."""
    rows, row_len = int(np.prod(shape[:-1])), shape[-1]
    blocks = raw.reshape(rows, row_len // BLOCK, BLOCK_BYTES[type_name])
    d = np.ascontiguousarray(blocks[:, :, 0:2]).view(np.float16).astype(np.float32)      # (rows, groups, 1)
    if type_name == "Q4_1":
        m = np.ascontiguousarray(blocks[:, :, 2:4]).view(np.float16).astype(np.float32)
        values = _nibbles(blocks[:, :, 4:20]).astype(np.float32) * d + m
    elif type_name == "Q4_0":
        values = (_nibbles(blocks[:, :, 2:18]).astype(np.float32) - 8) * d
    else:
        values = blocks[:, :, 2:34].view(np.int8).astype(np.float32) * d
    return values.reshape(shape)
