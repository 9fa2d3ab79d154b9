"""Linear layers on the CPU: the weights as the file stores them, one kernel for every row.

`prepare_linear` turns a fused linear's parts (q|k|v, gate|up: float arrays or
QuantizedTensors, each (out, in)) into a PackedLinear. Parts that share a kind (bits and
group size, or float width) and an input order (act-order permutation) are fused into one
block; each block's weights are re-laid once into tiles of 16 outputs (kernels/linear.py),
the packed codes kept as bytes (a byte transpose: no dequantization, no requantization),
scales and mins widened to float32 (exact; widening float16 ones in the kernel measured
twice as slow a decode step), float16 weights kept as their 16-bit patterns (widened in
registers). So a Q4_1 model takes about 0.75 bytes a weight in memory, not 4. The re-laid copy replaces the
model file's pages in use: the file stays memory-mapped, and its weight pages are read once.

Every group size the format allows (a multiple of 8 / bits columns, so whole bytes) runs
on these kernels; there is no float fallback.

`linear` runs a block's kernel for every row count (kernels/linear.py gives the arithmetic
and why a row's bits depend only on that row).
"""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

from tinyloop.backends.cpu_numba.kernels.linear import KERNELS, group_sums, tiles_of, warm_up
from tinyloop.model.quant import QuantizedTensor, dequantize


@dataclass
class LinearBlock:
    kind: str                    # "q8" | "q4" | "q2" | "f32" | "f16"
    tiles: np.ndarray            # (n_tiles, bytes or K, 16) uint8 codes, float32 or uint16 (half bits)
    scale: np.ndarray | None     # (n_tiles, groups, 16) float32 (quantized kinds)
    mins: np.ndarray | None
    group_size: int              # columns per group (quantized kinds)
    source: np.ndarray | None    # (padded K,) input column of each stored column (in_features: a zero), or None
    n_out: int
    out_offset: int

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.tiles, self.scale, self.mins, self.source) if a is not None)


@dataclass
class PackedLinear:
    in_features: int
    out_features: int
    blocks: list                 # LinearBlock, in output order
    bias: np.ndarray | None      # (out,) float32

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.blocks) + (0 if self.bias is None else self.bias.nbytes)

    def dense(self) -> np.ndarray:
        """The fused weight (out, in) float32, as a float32 file would store it (the quantizer's
        calibration reads it; the forward never does): float kinds exactly, quantized kinds
        as q * scale + min."""
        weight = np.zeros((self.out_features, self.in_features), np.float32)
        for block in self.blocks:
            rows = _untiled(block.tiles, block.n_out)                        # (n, bytes or K)
            if block.scale is None:
                stored = rows.view(np.float16).astype(np.float32) if rows.dtype == np.uint16 else rows
                weight[block.out_offset:block.out_offset + block.n_out] = stored
                continue
            bits = int(block.kind[1:])
            scale, mins = (_untiled(a, block.n_out) for a in (block.scale, block.mins))
            scale, mins = (a.view(np.float16) if a.dtype == np.uint16 else a for a in (scale, mins))
            stored = dequantize(QuantizedTensor(rows, scale, mins, bits, block.group_size), np.float32)
            source = block.source if block.source is not None else np.arange(stored.shape[1])
            keep = source < self.in_features
            weight[block.out_offset:block.out_offset + block.n_out, source[keep]] = stored[:, keep]
        return weight


def _untiled(tiles: np.ndarray, n_out: int) -> np.ndarray:
    """tiles_of's inverse: (n_tiles, W, 16) -> (n_out, W)."""
    return np.ascontiguousarray(tiles.transpose(0, 2, 1).reshape(-1, tiles.shape[1])[:n_out])


def _kind(part) -> tuple:
    """What decides whether two parts fuse: their kind, group size and input order."""
    if isinstance(part, QuantizedTensor):
        perm = None if part.perm is None else np.asarray(part.perm).tobytes()
        return (f"q{part.bits}", part.group_size, part.padded_in, perm)
    return ("f16" if np.asarray(part).dtype == np.float16 else "f32", 0, part.shape[1], None)


def _block(parts: list, in_features: int, out_offset: int) -> LinearBlock:
    first = parts[0]
    kind = _kind(first)[0]
    n_out = sum(p.shape[0] for p in parts)
    if isinstance(first, QuantizedTensor):
        codes = np.concatenate([np.asarray(p.codes) for p in parts])                   # (N, bytes)
        scale = np.concatenate([np.asarray(p.scale, np.float32) for p in parts])       # (N, groups)
        mins = np.concatenate([np.asarray(p.min, np.float32) for p in parts])
        padded = first.padded_in
        stored = np.asarray(first.perm, np.int64) if first.perm is not None else np.arange(padded)
        source = None
        if first.perm is not None or padded != in_features:
            source = np.where(stored < in_features, stored, in_features)               # padding reads a zero
        return LinearBlock(kind, tiles_of(codes), tiles_of(scale), tiles_of(mins), first.group_size, source,
                           n_out, out_offset)
    if kind == "f16":
        weights = np.concatenate([np.asarray(p).view(np.uint16) for p in parts])
    else:
        weights = np.concatenate([np.asarray(p, np.float32) for p in parts])
    return LinearBlock(kind, tiles_of(weights), None, None, 0, None, n_out, out_offset)


def prepare_linear(parts, bias=None) -> PackedLinear:
    """parts: (out, in) float arrays or QuantizedTensors, fused along out; bias: (sum out,) or None."""
    widths = {p.shape[1] for p in parts}
    if len(widths) != 1:
        raise ValueError(f"fused parts disagree on the input width: {sorted(widths)}")
    in_features = widths.pop()
    blocks, run, offset = [], [], 0
    for part in parts:
        if run and _kind(part) != _kind(run[0]):
            blocks.append(_block(run, in_features, offset))
            offset += blocks[-1].n_out
            run = []
        run.append(part)
    blocks.append(_block(run, in_features, offset))
    out_features = offset + blocks[-1].n_out
    for block in blocks:
        _compiled(block.kind)
    return PackedLinear(in_features, out_features, blocks, None if bias is None else np.asarray(bias, np.float32))


_COMPILED: set = set()


def _compiled(kind: str) -> None:
    """The kind's kernel compiled (or loaded from numba's cache) now, at load, not in a request."""
    if kind not in _COMPILED:
        warm_up(kind)
        _COMPILED.add(kind)


# Below this many multiply-adds a call runs on the calling thread alone: waking the other
# threads costs microseconds, and on a busy machine a descheduled one stalls the call a whole
# time slice. Threads split outputs, never a sum, so a row's bits are the same either way.
SERIAL_WORK = 1 << 20


def linear(x: np.ndarray, packed: PackedLinear) -> np.ndarray:
    """x: (T, in) float32 -> (T, out) float32 = x @ W.T (+ bias), each row on its own."""
    if x.shape[0] * packed.in_features * packed.out_features >= SERIAL_WORK:
        return _linear(x, packed)
    # set from Python: numba cannot cache a kernel that sets its own thread count
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        return _linear(x, packed)
    finally:
        numba.set_num_threads(threads)


def _linear(x: np.ndarray, packed: PackedLinear) -> np.ndarray:
    x = np.ascontiguousarray(x, np.float32)
    out = np.empty((x.shape[0], packed.out_features), np.float32)
    widened = None
    for block in packed.blocks:
        if block.scale is None:
            KERNELS[block.kind](x, block.tiles, block.n_out, out, block.out_offset)
            continue
        xb = x
        if block.source is not None:                                    # act-order or padded columns
            if widened is None:
                widened = np.zeros((x.shape[0], packed.in_features + 1), np.float32)
                widened[:, :packed.in_features] = x
            xb = widened[:, block.source]
        KERNELS[block.kind](xb, group_sums(xb, block.group_size), block.tiles, block.scale, block.mins,
                            block.group_size * int(block.kind[1:]) // 8, block.n_out, out, block.out_offset)
    if packed.bias is not None:
        out += packed.bias
    return out
