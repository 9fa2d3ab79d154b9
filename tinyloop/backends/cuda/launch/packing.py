"""Linear weights as the kernels of cuda/linear.cu read them: packed, never dequantized.

`pack_linear` takes what `Backend.prepare_linear` receives (parts fused along `out`,
each an (out, in) float array or a QuantizedTensor, and an optional fused bias) and keeps
them in the contract's layout (cuda/README.md):

- quantized parts: codes (out, row_bytes) uint8, packed as tinyloop/model/quant.py packs
  them, each row padded with zero bytes to whole 16-byte lines; scale and min
  (out, groups) float16 when the tensor stores both as float16 (GGUF, RTN, GPTQ run
  here: half the bytes of float32, and decode reads every one of them), else float32
  (the stored values widened exactly: GPTQ imports, a float16/float32 mix); the act-order
  permutation (padded_in,) int32 or None;
- dense parts: (out, in padded to 4) float32, or (out, in padded to 8) float16 when
  `keep_f16` and the part is float16 (an f16 checkpoint stays half the size).

Consecutive parts with the same layout (kind, bits, group size, stored width, no
permutation) become one segment; a part with an act-order permutation, or a different
layout, is a segment of its own. A segment's scales and mins share one dtype: float16
only when every part's are (a mixed run is widened, exactly, rather than split into two
launches). One kernel launch per segment fills the columns
`out_offset .. out_offset + out_features` of the fused output.

Only `xp.asarray` is used, so xp may be numpy (the twin, the CPU harness) or cupy.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinyloop.model.quant import SUPPORTED_BITS, QuantizedTensor, check_layout

COLUMNS_PER_WORD = {"int2": 16, "int4": 8, "int8": 4, "f16": 2, "f32": 1}


@dataclass
class LinearSegment:
    kind: str                  # "int2" | "int4" | "int8" | "f16" | "f32" (kernel: the name's suffix)
    weights: object            # quantized: (out, words * 4) uint8; dense: (out, stored_in) float32/float16
    scale: object | None       # (out, groups) float16 or float32, quantized only
    min: object | None         # (out, groups), the dtype of scale, quantized only
    group_size: int            # quantized only (0 for dense)
    perm: object | None        # (stored_in,) int32: stored column j feeds input column perm[j]
    stored_in: int             # stored columns with a meaning: padded_in, or in padded to 4 / 8
    out_offset: int            # first column of the fused output this segment fills
    bias: object | None        # (out,) float32, this segment's slice of the fused bias

    @property
    def out_features(self) -> int:
        return self.weights.shape[0]

    @property
    def words_per_row(self) -> int:
        return self.weights.shape[1] * self.weights.dtype.itemsize // 4

    @property
    def kernel(self) -> str:
        """The kernel name's suffix: the kind, + "_f32s" for float32 scales and mins."""
        wide = self.scale is not None and self.scale.dtype == np.float32
        return self.kind + "_f32s" if wide else self.kind

    @property
    def groups(self) -> int:
        return 0 if self.scale is None else self.scale.shape[1]

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in (self.weights, self.scale, self.min, self.perm, self.bias)
                   if a is not None)


@dataclass
class _HostPart:
    """One part, checked and laid out on the host, before segments are formed."""
    kind: str
    weights: np.ndarray            # (out, words * 4) uint8, or (out, stored_in) float32/float16
    scale: np.ndarray | None       # (out, groups) float16 or float32
    min: np.ndarray | None         # the dtype of scale
    group_size: int
    perm: np.ndarray | None        # (stored_in,) int32
    stored_in: int
    in_features: int
    layout: tuple                  # parts with equal layouts (and no perm) share a segment


@dataclass
class PackedLinear:
    segments: list[LinearSegment]
    in_features: int           # width of the input rows
    out_features: int          # width of the fused output
    nbytes: int                # device bytes kept (weights, scales, mins, perms, biases)


def pack_linear(parts, bias=None, xp=np, keep_f16: bool = False) -> PackedLinear:
    """parts: list of (out_k, in) float arrays or QuantizedTensors; bias: (sum out_k,) or None."""
    if not isinstance(parts, (list, tuple)) or not parts:
        raise ValueError("a linear needs at least one weight part (a list of (out, in) arrays "
                         "or QuantizedTensors)")
    hosts = [_host_part(p, i, keep_f16) for i, p in enumerate(parts)]
    in_features = hosts[0].in_features
    for i, h in enumerate(hosts):
        if h.in_features != in_features:
            raise ValueError(f"parts of a fused linear must share the input width: part 0 has "
                             f"{in_features}, part {i} has {h.in_features}")
    out_features = sum(h.weights.shape[0] for h in hosts)
    if bias is not None:
        bias = np.asarray(bias, np.float32)
        if bias.shape != (out_features,):
            raise ValueError(f"bias must have shape ({out_features},) (the fused output width), "
                             f"got {bias.shape}")

    segments, offset = [], 0
    for run in _runs(hosts):
        first = run[0]
        weights = np.concatenate([h.weights for h in run])
        n_out = weights.shape[0]
        quantized = first.scale is not None
        if quantized:
            dtype = np.result_type(*(h.scale for h in run))          # float16 only if all are
            scale = np.concatenate([h.scale for h in run], dtype=dtype)
            minimum = np.concatenate([h.min for h in run], dtype=dtype)
        segments.append(LinearSegment(
            kind=first.kind,
            weights=xp.asarray(np.ascontiguousarray(weights)),
            scale=xp.asarray(scale) if quantized else None,
            min=xp.asarray(minimum) if quantized else None,
            group_size=first.group_size,
            perm=None if first.perm is None else xp.asarray(first.perm),
            stored_in=first.stored_in,
            out_offset=offset,
            bias=None if bias is None else xp.asarray(np.ascontiguousarray(bias[offset:offset + n_out]))))
        offset += n_out
    return PackedLinear(segments, in_features, out_features, sum(s.nbytes for s in segments))


def _runs(hosts: list[_HostPart]) -> list[list[_HostPart]]:
    """Consecutive parts that share a layout and have no permutation, grouped."""
    runs = []
    for h in hosts:
        if runs and h.perm is None and runs[-1][-1].perm is None and runs[-1][-1].layout == h.layout:
            runs[-1].append(h)
        else:
            runs.append([h])
    return runs


def _host_part(part, index: int, keep_f16: bool) -> _HostPart:
    if isinstance(part, QuantizedTensor):
        return _quantized_part(part, index)
    weight = np.asarray(part)
    if weight.ndim != 2 or weight.dtype.kind != "f":
        raise ValueError(f"part {index}: a dense weight must be a 2-D float array (out, in), "
                         f"got {weight.dtype} of shape {weight.shape}")
    kind = "f16" if keep_f16 and weight.dtype == np.float16 else "f32"
    dtype = np.float16 if kind == "f16" else np.float32
    n_out, n_in = weight.shape
    stored_in = -(-n_in // 8) * 8 if kind == "f16" else -(-n_in // 4) * 4   # whole 16-byte rows
    stored = np.zeros((n_out, stored_in), dtype)
    stored[:, :n_in] = weight
    return _HostPart(kind, stored, None, None, 0, None, stored_in, n_in, layout=(kind, n_in))


def _quantized_part(tensor: QuantizedTensor, index: int) -> _HostPart:
    bits, group = tensor.bits, tensor.group_size
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"part {index}: bits must be one of {SUPPORTED_BITS}, got {bits}")
    try:
        check_layout(bits, group)
    except ValueError as error:
        raise ValueError(f"part {index}: {error}") from None
    codes = np.asarray(tensor.codes)
    if codes.ndim != 2 or codes.dtype != np.uint8:
        raise ValueError(f"part {index}: codes must be a 2-D uint8 array (out, in * bits / 8), "
                         f"got {codes.dtype} of shape {codes.shape}")
    n_out, row_bytes = codes.shape
    padded_in = tensor.padded_in
    if padded_in % group:
        raise ValueError(f"part {index}: the stored width {padded_in} is not a multiple of the "
                         f"group size {group}")
    groups = padded_in // group
    scale, minimum = np.asarray(tensor.scale), np.asarray(tensor.min)
    for name, value in (("scale", scale), ("min", minimum)):
        if value.shape != (n_out, groups):
            raise ValueError(f"part {index}: {name} must have shape ({n_out}, {groups}) "
                             f"(out, stored width / group size), got {value.shape}")
    in_features = tensor.shape[1]
    if not 0 < in_features <= padded_in:
        raise ValueError(f"part {index}: in_features must be in [1, {padded_in}] (the stored "
                         f"width), got {in_features}")
    perm = None
    if tensor.perm is not None:
        perm = np.asarray(tensor.perm)
        if perm.shape != (padded_in,) or perm.dtype.kind not in "iu" \
                or not np.array_equal(np.sort(perm), np.arange(padded_in)):
            raise ValueError(f"part {index}: perm must be a permutation of range({padded_in}) "
                             f"(the stored width), got {perm.dtype} of shape {perm.shape}")
        perm = perm.astype(np.int32)
    # zero bytes pad rows to whole 16-byte lines: each row starts 16-byte aligned, as the
    # 128-bit loads of linear_mma.cu and of the rows kernels (a lane's 4 words) need
    lines = -(-row_bytes // 16)
    stored = np.zeros((n_out, lines * 16), np.uint8)
    stored[:, :row_bytes] = codes
    kind = f"int{bits}"
    # the kernels read scale and min in one dtype: float16 when both are, else both widened
    dtype = np.float16 if scale.dtype == minimum.dtype == np.float16 else np.float32
    return _HostPart(kind, stored, scale.astype(dtype), minimum.astype(dtype), group, perm,
                     padded_in, in_features, layout=(kind, group, padded_in, in_features))
