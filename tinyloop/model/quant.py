"""Group-wise quantized weights: packed codes with a scale and a min per group.

A linear weight W of shape (out, in) is split along `in` into groups of `group_size`
columns. Each element is stored as an unsigned code q of `bits` bits and recovered as

    W[o, i] = q[o, i] * scale[o, i // group_size] + min[o, i // group_size]

GGUF's Q4_1 (d, m) and Q8_0 (d, no offset) and GPTQ's (q - zero) * scale all map to
this form without loss. Codes are packed little-end first: element i of a row lives
in byte i // (8 // bits) at bit offset (i % (8 // bits)) * bits.

With act-order, the columns were quantized in the order `perm`; the codes are stored
in that order (so groups stay contiguous) and `perm[j]` names the original column of
stored column j.

An input dimension that is not a multiple of the group size is padded to the next
multiple (the padding repeats the row's last values, so group ranges do not change);
the codes hold the padded width, `in_features` the real one, and dequantization drops
the padding. SmolLM2's 576-wide inputs with groups of 128, for example, store 640.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SUPPORTED_BITS = (2, 4, 8)


@dataclass
class QuantizedTensor:
    codes: np.ndarray          # (out, in * bits / 8) uint8
    scale: np.ndarray          # (out, in / group_size) float16 or float32
    min: np.ndarray            # (out, in / group_size) float16 or float32
    bits: int
    group_size: int
    method: str = "rtn"
    perm: np.ndarray | None = None   # (padded in,) int32 or None
    in_features: int | None = None   # the real input width when codes are padded

    @property
    def padded_in(self) -> int:
        return self.codes.shape[1] * 8 // self.bits

    @property
    def shape(self) -> tuple[int, int]:
        return (self.codes.shape[0], self.in_features or self.padded_in)

    def spec(self) -> dict:
        """The header entry that describes this tensor's quantization."""
        spec = {"bits": self.bits, "group_size": self.group_size, "method": self.method,
                "act_order": self.perm is not None, "shape": list(self.shape)}
        if self.shape[1] != self.padded_in:
            spec["padded_in"] = self.padded_in
        return spec


def check_layout(bits: int, group_size: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits}")
    if group_size < 1 or group_size % (8 // bits):
        raise ValueError(f"group_size must be a positive multiple of {8 // bits} for {bits}-bit codes, "
                         f"got {group_size}")


def padded_width(n_in: int, group_size: int) -> int:
    return -(-n_in // group_size) * group_size


def pad_columns(weight: np.ndarray, group_size: int) -> np.ndarray:
    """(out, in) -> (out, padded in), repeating each row's last value."""
    extra = padded_width(weight.shape[1], group_size) - weight.shape[1]
    return np.pad(weight, ((0, 0), (0, extra)), mode="edge") if extra else weight


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """(out, in) integer codes in [0, 2**bits) -> (out, in * bits / 8) uint8."""
    per_byte = 8 // bits
    codes = np.asarray(codes)
    if codes.size and (codes.min() < 0 or codes.max() >= (1 << bits)):
        raise ValueError(f"codes must lie in [0, {1 << bits}) for {bits}-bit packing")
    out_dim, in_dim = codes.shape
    if in_dim % per_byte:
        raise ValueError(f"row length {in_dim} is not a multiple of {per_byte} for {bits}-bit packing")
    grouped = codes.astype(np.uint8).reshape(out_dim, in_dim // per_byte, per_byte)
    packed = np.zeros((out_dim, in_dim // per_byte), np.uint8)
    for slot in range(per_byte):
        packed |= grouped[:, :, slot] << np.uint8(slot * bits)
    return packed


def unpack_codes(packed: np.ndarray, bits: int) -> np.ndarray:
    """(out, in * bits / 8) uint8 -> (out, in) uint8 codes."""
    per_byte = 8 // bits
    mask = np.uint8((1 << bits) - 1)
    out_dim, n_bytes = packed.shape
    codes = np.empty((out_dim, n_bytes, per_byte), np.uint8)
    for slot in range(per_byte):
        codes[:, :, slot] = (packed >> np.uint8(slot * bits)) & mask
    return codes.reshape(out_dim, n_bytes * per_byte)


def dequantize(tensor: QuantizedTensor, dtype=np.float32) -> np.ndarray:
    """The weight in original column order: (out, in) in `dtype`."""
    codes = unpack_codes(tensor.codes, tensor.bits)                      # (out, in)
    out_dim, in_dim = codes.shape
    groups = in_dim // tensor.group_size
    scale = tensor.scale.astype(dtype)[:, :, None]                       # (out, groups, 1)
    offset = tensor.min.astype(dtype)[:, :, None]
    weight = (codes.reshape(out_dim, groups, tensor.group_size).astype(dtype) * scale + offset)
    weight = weight.reshape(out_dim, in_dim)
    if tensor.perm is not None:
        restored = np.empty_like(weight)
        restored[:, tensor.perm] = weight
        weight = restored
    return weight[:, :tensor.shape[1]] if tensor.shape[1] != in_dim else weight


def quantize_rtn(weight: np.ndarray, bits: int, group_size: int,
                 scale_dtype=np.float16) -> QuantizedTensor:
    """Round-to-nearest asymmetric quantization of an (out, in) weight."""
    in_features = weight.shape[1]
    check_layout(bits, group_size)
    weight = pad_columns(np.asarray(weight, np.float32), group_size)
    out_dim, in_dim = weight.shape
    levels = (1 << bits) - 1
    grouped = weight.reshape(out_dim, in_dim // group_size, group_size)  # (out, groups, g)
    low = grouped.min(axis=2)
    high = grouped.max(axis=2)
    scale = ((high - low) / levels).astype(scale_dtype)
    offset = low.astype(scale_dtype)
    scale32 = scale.astype(np.float32)
    safe = np.where(scale32 == 0, 1.0, scale32)[:, :, None]
    codes = np.clip(np.rint((grouped - offset.astype(np.float32)[:, :, None]) / safe), 0, levels)
    codes = codes.reshape(out_dim, in_dim).astype(np.uint8)
    return QuantizedTensor(pack_codes(codes, bits), scale, offset, bits, group_size, "rtn",
                           in_features=in_features if in_features != in_dim else None)
