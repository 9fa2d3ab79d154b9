"""Linear layers on the CPU: the weights as the file stores them, one kernel for every row.

`prepare_linear` turns a fused linear's parts (q|k|v, gate|up: float arrays or
QuantizedTensors, each (out, in)) into a PackedLinear. Parts that share a kind (bits and
group size, or float width) and an input order (act-order permutation) are fused into one
block; each block's weights are re-laid once, the packed codes kept as codes (a byte
shuffle: no dequantization, no requantization), scales and mins widened to float32 (exact),
float16 weights kept as their 16-bit patterns (widened in registers). So a Q4_1 model takes
about 0.7 bytes a weight in memory, not 4. The re-laid copy replaces the model file's pages
in use: the file stays memory-mapped, and its weight pages are read once.

Two kernels, chosen per block by its kind, the same for every row count:
- quantized weights whose group size is a multiple of 4 (every GGUF, RTN and GPTQ layout in
  use): integer dot products on int8 activations (kernels/linear_int.py, laid out by
  int_layout.py);
- float weights, and quantized ones of other group sizes (2 or 6 columns, say): float
  products summed in order over 16-output tiles (kernels/linear.py).
Each kernel's docstring gives its arithmetic and why a row's bits depend only on that row.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinyloop.backends.cpu.int_layout import IntWeights, codes_of, int_weights
from tinyloop.backends.cpu.kernels import linear_int, on_a_passing_thread
from tinyloop.backends.cpu.kernels.linear import KERNELS, SERIAL_KERNELS, group_sums, tiles_of, warm_up
from tinyloop.model.quant import QuantizedTensor, dequantize


@dataclass
class LinearBlock:
    kind: str                    # "q8" | "q4" | "q2" | "f32" | "f16"
    tiles: np.ndarray | None     # float kernel: (n_tiles, bytes or K, 16) uint8 codes, float32 or uint16 (half bits)
    scale: np.ndarray | None     # float kernel: (n_tiles, groups, 16) float32 (quantized kinds)
    mins: np.ndarray | None
    group_size: int              # columns per group (quantized kinds)
    source: np.ndarray | None    # (padded K,) input column of each stored column (in_features: a zero), or None
    n_out: int
    out_offset: int
    integer: IntWeights | None = None   # the integer kernel's weights (then tiles, scale, mins are None)
    segment: int = 0             # the integer kernel's segment (kernels/linear_int.py)
    wide_offset: int = 0         # where the kernel writes the block's columns in the call's output

    @property
    def nbytes(self) -> int:
        arrays = [self.tiles, self.scale, self.mins, self.source]
        if self.integer is not None:
            arrays += [self.integer.codes, self.integer.scale, self.integer.mins]
        return sum(a.nbytes for a in arrays if a is not None)

    @property
    def wide_width(self) -> int:
        """Columns the kernel writes: whole 8-output tiles for the integer kernel."""
        return self.integer.codes.shape[0] * linear_int.TILE if self.integer is not None else self.n_out


@dataclass
class PackedLinear:
    in_features: int
    out_features: int
    blocks: list                 # LinearBlock, in output order
    bias: np.ndarray | None      # (out,) float32
    wide_width: int = 0          # columns of the kernels' output (blocks at 8-aligned offsets)
    gather: np.ndarray | None = None   # (out,) the kernels' output column of each output, or None if they match
    fused: bool = False          # every block integer, columns in place: bias and residual in the epilogue

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.blocks) + (0 if self.bias is None else self.bias.nbytes)

    def dense(self) -> np.ndarray:
        """The fused weight (out, in) float32, as a float32 file would store it (the quantizer's
        calibration reads it; the forward never does): float kinds exactly, quantized kinds
        as q * scale + min."""
        weight = np.zeros((self.out_features, self.in_features), np.float32)
        for block in self.blocks:
            if block.integer is not None:
                weight[block.out_offset:block.out_offset + block.n_out] = _int_dense(block, self.in_features)
                continue
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


def _int_dense(block: LinearBlock, in_features: int) -> np.ndarray:
    """The integer kernel's weights as w = c * scale + min' in input column order: (n_out, in)."""
    padded = len(block.source) if block.source is not None else in_features
    codes = codes_of(block.integer, int(block.kind[1:]), padded // 4)[:block.n_out].astype(np.float32)  # (n, Kp)
    groups = block.integer.scale.shape[1]
    scale, mins = (_untiled(a, block.n_out) for a in (block.integer.scale, block.integer.mins))  # (n, groups)
    scale, mins = (a.view(np.float16).astype(np.float32) if a.dtype == np.uint16 else a for a in (scale, mins))
    stored = codes.reshape(block.n_out, groups, -1) * scale[:, :, None] + mins[:, :, None]
    stored = stored.reshape(block.n_out, -1)
    source = block.source if block.source is not None else np.arange(stored.shape[1])
    keep = source < in_features
    weight = np.zeros((block.n_out, in_features), np.float32)
    weight[:, source[keep]] = stored[:, keep]
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
        segment = linear_int.segment_of(first.group_size)
        if segment:
            stored = [np.concatenate([np.asarray(getattr(p, name)) for p in parts]) for name in ("scale", "min")]
            return LinearBlock(kind, None, None, None, first.group_size, source, n_out, out_offset,
                               int_weights(codes, *stored, first.bits), segment)
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
    wide = 0
    for block in blocks:
        _compiled("int" if block.integer is not None else block.kind)
        block.wide_offset = wide
        wide = -(-(wide + block.wide_width) // linear_int.TILE) * linear_int.TILE
    gather = np.concatenate([np.arange(b.wide_offset, b.wide_offset + b.n_out) for b in blocks])
    if wide == out_features and np.array_equal(gather, np.arange(out_features)):
        gather = None
    fused = gather is None and all(b.integer is not None for b in blocks)
    return PackedLinear(in_features, out_features, blocks, None if bias is None else np.asarray(bias, np.float32),
                        wide, gather, fused)


_COMPILED: set = set()


def _compiled(kind: str) -> None:
    """The kind's kernel compiled (or loaded from numba's cache) now, at load, not in a request."""
    if kind not in _COMPILED:
        if kind == "int":
            on_a_passing_thread(linear_int.warm_up)
        else:
            on_a_passing_thread(warm_up, kind)
        _COMPILED.add(kind)


# Below this many multiply-adds a call runs on the calling thread alone: waking the other
# threads costs microseconds, and on a busy machine a descheduled one stalls the call a whole
# time slice. Threads split outputs, never a sum, so a row's bits are the same either way.
SERIAL_WORK = 1 << 20


def _float_kernel(threaded: bool, kind: str, *args) -> None:
    """A float-activation kernel (kernels/linear.py), threaded or, for small calls, on this thread."""
    (KERNELS if threaded else SERIAL_KERNELS)[kind](*args)


def linear(x: np.ndarray, packed: PackedLinear, residual: np.ndarray | None = None) -> np.ndarray:
    """x: (T, in) float32 -> (T, out) float32 = x @ W.T (+ bias) (+ residual), each row on its own."""
    x = np.ascontiguousarray(x, np.float32)
    # the kernels index without bounds checks: refuse shapes that would read outside the operands
    if x.ndim != 2 or x.shape[1] != packed.in_features:
        raise ValueError(f"linear input {x.shape} for {packed.in_features} input features")
    if residual is not None and residual.shape != (x.shape[0], packed.out_features):
        raise ValueError(f"residual {residual.shape} for an output of {(x.shape[0], packed.out_features)}")
    threaded = x.shape[0] * packed.in_features * packed.out_features >= SERIAL_WORK
    out = np.empty((x.shape[0], packed.wide_width), np.float32)
    if packed.fused and len(packed.blocks) == 1 and packed.blocks[0].source is None:   # the common case: one call
        block, w = packed.blocks[0], packed.blocks[0].integer
        linear_int.quantized_linear(x, block.segment, w.codes, w.scale, w.mins, int(block.kind[1:]), block.group_size,
                                    w.offset, out, 0, linear_int.NONE_1D if packed.bias is None else packed.bias,
                                    linear_int.NONE_2D if residual is None else np.ascontiguousarray(residual,
                                                                                                     np.float32),
                                    threaded)
        return out
    if packed.fused:
        bias = linear_int.NONE_1D if packed.bias is None else packed.bias
        extra = linear_int.NONE_2D if residual is None else np.ascontiguousarray(residual, np.float32)
    widened = None
    quantized = {}                       # (source, segment) -> quantize_rows: blocks that share x share it
    for block in packed.blocks:
        if block.tiles is not None and block.scale is None:             # float weights
            _float_kernel(threaded, block.kind, x, block.tiles, block.n_out, out, block.wide_offset)
            continue
        xb = x
        if block.source is not None:                                    # act-order or padded columns
            if widened is None:
                widened = np.zeros((x.shape[0], packed.in_features + 1), np.float32)
                widened[:, :packed.in_features] = x
            xb = widened[:, block.source]
        if block.integer is None:
            _float_kernel(threaded, block.kind, xb, group_sums(xb, block.group_size), block.tiles,
                          block.scale, block.mins, block.group_size * int(block.kind[1:]) // 8, block.n_out, out,
                          block.wide_offset)
            continue
        key = (None if block.source is None else id(block.source), block.segment)
        if key not in quantized:
            quantized[key] = linear_int.quantize_rows(np.ascontiguousarray(xb), block.segment)
        w = block.integer
        kernel = linear_int.linear_int if threaded else linear_int.linear_int_serial
        kernel(*quantized[key], w.codes, w.scale, w.mins, int(block.kind[1:]), block.segment, block.group_size,
               w.offset, out, block.wide_offset, *((bias, extra) if packed.fused else
                                                   (linear_int.NONE_1D, linear_int.NONE_2D)))
    if packed.fused:
        return out
    if packed.gather is not None:
        out = out[:, packed.gather]
    if packed.bias is not None:
        out += packed.bias
    return out if residual is None else residual + out
