"""Launch geometry for cuda/linear.cu: one launch per weight segment of a PackedLinear.

`linear(module, x, packed, out, exact)` writes x @ W (+ bias) into the preallocated `out`.
exact=True (decode, verify) runs linear_rows_*: each row's bits do not depend on the
number of rows. exact=False (prefill) runs linear_bulk_* when there are enough rows for
its 64-row tiles to pay, else the rows kernel (as fast there, and exact anyway).

x is float32 or float16 (fp16 activations); the kernels widen either to float as they
stage it, so a float16 x gives the bits its float32 widening would. A bulk call with a
float16 x runs on tensor cores (cuda/linear_tc.cu: x and the weights in half, float32
sums) when the caller passes that module (`tc_module`: the backend does on sm_80 and later).

An exact call runs on tensor cores too when the caller passes an `MmaPath` (cuda/linear_mma.cu:
1-16 rows a tile, x and the weights in half, float32 sums; row-invariant, but not the bits of
linear_rows_*): for the segments it takes (int4, half scales, groups of 32, 64 or 128, no
permutation, 16-byte code rows; `mma_eligible`), the rest stay on the rows kernels.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from tinyloop.backends.cuda.launch.kv import KvFold
from tinyloop.backends.cuda.launch.memory import allow_shared, device_shared_limit, may_overlap
from tinyloop.backends.cuda.launch.packing import COLUMNS_PER_WORD, PackedLinear

ROWS_WARPS = 8                 # output columns per block (one warp each): LIN_WARPS in linear.cu
ROWS_THREADS = ROWS_WARPS * 32
ROWS_PER_BLOCK = 16            # rows per block when the column grid alone leaves SMs idle
ROWS_STAGE_FLOATS = 8192       # LIN_STAGE_FLOATS: inputs a rows block stages at once
ROWS_SPAN_WORDS = 4            # LIN_SPAN: words a rows lane loads at once (16 bytes), from 128 s + 4 lane
ROWS_STRIPE_WORDS = 32 * ROWS_SPAN_WORDS   # LIN_STRIPE: the words a warp's 32 lanes' chunks cover
ROWS_BLOCKS_PER_SM = 2         # __launch_bounds__(256, 2) on the rows kernels
FEW_COLUMN_BLOCKS = 512        # below this many column blocks (~4 per H200 SM), split rows too
BULK_TILE = 64                 # rows and columns per bulk block: BULK_ROWS, BULK_COLS (TC_ROWS, TC_COLS)
BULK_THREADS = 256
BULK_MIN_ROWS = 32             # fewer rows than this: the rows kernel is the faster one


ACTIVATIONS = {None: 0, "gelu": 1}

MMA_THREADS = 128              # MMA_THREADS in linear_mma.cu
MMA_BLOCK_COLS = 64            # output columns per block (MMA_BLOCK_COLS)
MMA_TILE_ROWS = 16             # rows per tile: the mma's m
MMA_CHUNK = 128                # stored columns per chunk (MMA_CHUNK)
MMA_MAX_CHUNKS = 4             # chunks per batch (MMA_MAX_CHUNKS)
MMA_TARGET_BLOCKS = 64        # column blocks of 64 x splits to reach: below it, split k (the paper
                               # model's best for both model shapes, scripts/cuda_estimates.py: 32
                               # leaves doc-407m's out and down projections at 46% of the bytes in
                               # flight they need; 96 takes three splits there, whose staging makes
                               # a 16-row verify issue-bound)
MMA_MAX_SPLITS = 4             # a weight's splits at most: as many as a block's warps can take
MMA_MAX_PARTS = 4              # splits a block's warps take at most (MMA_WARPS): its 4 warps then
                               # 16 columns, its splits added in shared memory, no round trip
MMA_PARTS_MAX_ROWS = 16        # more rows (several row tiles, so more blocks): one split a block,
                               # the partials added by the last block, the staging shared by 4 warps
MMA_XS_PART_BYTES = 8 * (MMA_MAX_CHUNKS * 16 * 8 + 4) * 4   # MMA_XS_WORDS: one part's staged batch
MMA_STATIC_SHARED = 256        # the kernel's static shared memory (144 B, cuda/RESOURCES.md), rounded up
MMA_NORM_FOLD_MAX_ROWS = 4     # the most rows a call on linear_mma folds the pre-norm into (the
                               # backend runs the norm kernel first for more): past 4 a warp sums a
                               # second row's statistics and the normed staging costs more than the
                               # launch it saves (scripts/cuda_estimates.py, doc-407m: a 4-row
                               # forward 708 us folded, 745 not; 5 rows 769 against 747); the
                               # bits are the same either way


# cuda/norm.cuh TL_NORM_RMS, TL_NORM_LAYER (+1 with a bias); cuda/linear.cu LIN_STAGE_SWIGLU
NORM_KINDS = {"rms": 1, "layer": 2, "swiglu": 8}


@dataclass
class NormFold:
    """A pre-norm fused into an exact call's staging (the rows kernels, and the tensor-core rows
    of an MmaPath, linear_mma.cu; in both each warp sums a row's statistics in the norm kernels'
    256-thread order): x is then the float32 residual stream h, and the kernel stages norm(h),
    the rms_norm / layer_norm kernels' own arithmetic (cuda/norm.cuh), rounded to half and back
    where `half` (the norm's output would be half: fp16 activations): the bits of the norm
    launch followed by this linear, one launch fewer. weight, bias: (in,) float32 on the device (bias None: none, or RMS).

    kind "swiglu" (weight and bias None, eps unused): the SwiGLU before a down projection
    instead of a norm. x is then the up projection's float32 output (T, 2 in) = [gate | up],
    and the kernel stages silu(gate) * up with the swiglu kernel's arithmetic (cuda/common.cuh
    tl_swiglu), rounded to half and back where `half`: the bits of the swiglu launch followed
    by this one. The rows kernels only: a call with an MmaPath refuses it."""
    kind: str
    weight: object
    bias: object
    eps: float
    half: bool = False


@dataclass
class MmaPath:
    """What an exact call needs to run linear_mma_int4: its module, `scratch(n)` -> n float32
    (the split partials; the backend keeps one growing buffer) and `counters(n)` -> n uint32
    zeros that every launch leaves zero. shared_limit: the shared memory a block may opt in to,
    which bounds the parts a block takes; None: the device's (memory.device_shared_limit: 227
    KiB on sm_90, 163 KiB on sm_80, 99 KiB on sm_86 and sm_89)."""
    module: object
    scratch: Callable[[int], object]
    counters: Callable[[int], object]
    shared_limit: int | None = None


def mma_eligible(seg) -> bool:
    """The segments linear_mma_int4 reads: int4 codes in 16-byte rows, half scales and mins,
    groups of 32, 64 or 128 columns (one group a lane's 32 columns, whole groups a chunk), no
    act-order permutation."""
    return (seg.kind == "int4" and seg.scale is not None and seg.scale.dtype == np.float16
            and seg.group_size in (32, 64, 128) and seg.perm is None and seg.words_per_row % 4 == 0)


def mma_split_k(stored_columns: int, n_out: int) -> int:
    """Stored columns per split: the column blocks alone when they reach MMA_TARGET_BLOCKS (one
    split: no sum), else as many splits as make up the difference, at most MMA_MAX_SPLITS and
    one per chunk. A function of the weight's shape alone (never of the rows or the device): it
    fixes the order of every sum."""
    column_blocks = _blocks(n_out, MMA_BLOCK_COLS)
    chunks = _blocks(stored_columns, MMA_CHUNK)
    splits = min(chunks, _blocks(MMA_TARGET_BLOCKS, column_blocks), MMA_MAX_SPLITS)
    return _blocks(chunks, splits) * MMA_CHUNK


def mma_parts(splits: int, n_rows: int, shared_limit: int | None = None) -> int:
    """The splits a block's warps take (the kernel's `parts`): all of a weight's splits (up to
    MMA_MAX_PARTS; 3 splits take 4 parts, one warp idle), added in shared memory, or one a block
    (splits of partials a round trip apart) for calls of many rows, and as many as the device's
    shared memory a block holds (shared_limit: 4 parts want 129 KiB, 2 parts 65 KiB). Whichever
    it is, the same additions in the same order: the bits do not depend on it, so it may depend
    on the rows and the device."""
    if splits == 1 or n_rows > MMA_PARTS_MAX_ROWS:
        return 1
    parts = 2 if splits == 2 else MMA_MAX_PARTS
    while parts > 1 and shared_limit is not None and mma_shared_bytes(parts) + MMA_STATIC_SHARED > shared_limit:
        parts //= 2
    return parts


def mma_shared_bytes(parts: int) -> int:
    """linear_mma_int4's dynamic shared memory: two batches' staging buffers per part."""
    return 2 * parts * MMA_XS_PART_BYTES


def rows_tile_words(cpw: int, rows: int) -> int:
    """linear_rows.cuh rows_tile_words: stored words of a chunk of `rows` rows staged at once,
    whole stripes."""
    return ROWS_STAGE_FLOATS // (rows * cpw) // ROWS_STRIPE_WORDS * ROWS_STRIPE_WORDS


def rows_resident(seg, n_rows: int) -> bool:
    """Whether linear.cu runs the call's chunks on its resident path (rows_resident: 1 or 2 rows
    whose stored words fit one tile), where a warp runs through several columns back to back."""
    return n_rows <= 2 and seg.words_per_row <= rows_tile_words(COLUMNS_PER_WORD[seg.kind], n_rows)


def linear(module, x, packed: PackedLinear, out, exact: bool, tc_module=None, residual=None, activation=None,
           mma: MmaPath | None = None, column_block_cap: int | None = None, norm: NormFold | None = None,
           kv: KvFold | None = None):
    """x: (T, in) float32 or float16 (row stride free); out: (T, out) float32, or float16 with an
    activation (row stride free) <- x @ W.T + bias (+ residual: (T, out) float32, row stride
    free, not overlapping out; the residual add fused into the kernels' epilogue, the bits of
    residual + (x @ W.T + bias)), then (activation "gelu") GELU, fused likewise: the bits of the
    gelu_tanh kernel on the float result, rounded to half where out is float16.
    tc_module: the linear_tc module, for bulk calls with a float16 x. mma: the tensor-core
    path for exact calls (MmaPath), for the segments it takes. column_block_cap: at most this
    many column blocks for a call on the rows kernels' resident path (the backend passes the
    blocks the device holds at once, ROWS_BLOCKS_PER_SM an SM): each warp then sums several
    columns back to back with the next one's weights in flight, and the block stages its
    inputs once for all of them. It changes no bit: which warp sums a column never does.
    norm: a NormFold (exact calls; x float32, the residual stream, or with kind "swiglu", on
    the rows kernels only, the up projection's (T, 2 in) output).
    kv: a KvFold (exact calls, a float32 out, no activation; the rows kernels and the tensor-core
    rows alike): the KV write of the keys and values among out's columns, done by the warps that
    finish them (the bits of kv.kv_write after this call, one launch fewer)."""
    for launch in _checked_launches(module, x, packed, out, exact, tc_module, residual, activation, mma,
                                    column_block_cap, norm, kv):
        launch.run()
    return out


def _checked_launches(module, x, packed, out, exact, tc_module, residual, activation, mma, column_block_cap, norm,
                      kv) -> list:
    """linear()'s checks (a ValueError before anything is launched), then its launches."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(k for k in ACTIVATIONS if k)} or None, "
                         f"got {activation!r}")
    if norm is not None and norm.kind not in NORM_KINDS:
        raise ValueError(f"norm kind must be one of {sorted(NORM_KINDS)}, got {norm.kind!r}")
    gated = norm is not None and norm.kind == "swiglu"      # x: [gate | up], twice the inputs
    x_width = 2 * packed.in_features if gated else packed.in_features
    if x.ndim != 2 or x.shape[1] != x_width:
        raise ValueError(f"x must have shape (T, {x_width}){' ([gate | up])' if gated else ''}, got {x.shape}")
    n_rows = x.shape[0]
    if norm is not None:
        if not exact or x.dtype != np.float32:
            raise ValueError("a fused norm runs on the exact path only (the rows kernels, or the tensor-core "
                             "rows): an exact call, a float32 x (the residual stream)")
        if gated and mma is not None:
            raise ValueError("the SwiGLU fold runs on the rows kernels only, not with tensor-core rows "
                             "(their calls keep the swiglu launch)")
        if norm.kind == "rms" and norm.bias is not None:
            raise ValueError("an RMS norm has no bias")
        if gated and (norm.weight is not None or norm.bias is not None):
            raise ValueError("the SwiGLU fold takes no norm weight or bias")
        if gated and not swiglu_fold_supported(packed):
            raise ValueError("the SwiGLU fold does not run on float32-scale weights (their rows kernels "
                             "keep the swiglu launch)")
    if out.ndim != 2 or out.shape != (n_rows, packed.out_features):
        raise ValueError(f"out must have shape ({n_rows}, {packed.out_features}), got {out.shape}")
    if kv is not None:
        _check_kv_fold(kv, exact, activation, out)
    x_half = x.dtype == np.float16
    y_half = activation is not None and out.dtype == np.float16      # an activation's output may be half
    x_stride = _row_stride(x, "x", np.float16 if x_half else np.float32)
    y_stride = _row_stride(out, "out", np.float16 if y_half else np.float32)
    residual_stride = 0
    if residual is not None:
        if residual.ndim != 2 or residual.shape != out.shape:
            raise ValueError(f"residual must have shape {out.shape}, got {residual.shape}")
        residual_stride = _row_stride(residual, "residual")
        if may_overlap(residual, out):
            raise ValueError("residual and out must not overlap (each output is written as it is summed)")
    if n_rows == 0:
        return []
    launches = _launches(module, x, packed, out, exact, tc_module, residual, activation, mma, column_block_cap,
                         norm, kv, x_half, y_half, x_stride, y_stride, residual_stride)
    for launch in launches:     # a device that refuses a launch's shared memory: refused before any runs
        launch.opt_in()
    return launches


@dataclass
class _Launch:
    module: object
    name: str
    grid: tuple
    block: tuple
    args: tuple
    rows_kernel: str = ""          # the segment's rows kernel kind ("int4"...), "" on another path
    shared: int = 0                # dynamic shared memory, bytes (over 48 KiB: opted in by opt_in)

    def opt_in(self) -> None:
        if self.shared:
            allow_shared(self.module.get_function(self.name), self.shared, self.name)

    def run(self) -> None:
        function = self.module.get_function(self.name)
        if self.shared:
            function(self.grid, self.block, self.args, shared_mem=self.shared)
        else:
            function(self.grid, self.block, self.args)


def _launches(module, x, packed, out, exact, tc_module, residual, activation, mma, column_block_cap, norm, kv,
              x_half, y_half, x_stride, y_stride, residual_stride) -> list:
    """The launches of a checked call, one a segment, in order (none yet made)."""
    n_rows = x.shape[0]
    bulk = not exact and n_rows >= BULK_MIN_ROWS
    tensor_cores = bulk and x_half and tc_module is not None
    for seg in packed.segments:     # every check before the first launch: a call stopped halfway
        if not bulk and not (mma is not None and mma_eligible(seg)):    # would leave a fold's counters
            check_group_lookup(seg)
    launches = []
    for seg in packed.segments:
        if seg.out_features == 0:
            continue
        on_mma = not bulk and mma is not None and mma_eligible(seg)
        if on_mma:
            split_k = mma_split_k(seg.words_per_row * 8, seg.out_features)
            splits = _blocks(seg.words_per_row * 8, split_k)
            parts = mma_parts(splits, n_rows,
                              device_shared_limit(out) if mma.shared_limit is None else mma.shared_limit)
            grid = (_blocks(seg.out_features, MMA_BLOCK_COLS // parts), _blocks(splits, parts),
                    _blocks(n_rows, MMA_TILE_ROWS))
            block, rows_per_block = (MMA_THREADS,), n_rows
            name = "linear_mma_int4"
        elif bulk:
            name = f"linear_{'tc' if tensor_cores else 'bulk'}_{seg.kernel}"
            grid = (_blocks(seg.out_features, BULK_TILE), _blocks(n_rows, BULK_TILE))
            block, rows_per_block = (BULK_THREADS,), n_rows
        else:
            name = f"linear_rows_{seg.kernel}"
            column_blocks = _blocks(seg.out_features, ROWS_WARPS)
            # Which rows share a block changes no row's bits: split rows only for parallelism.
            rows_per_block = ROWS_PER_BLOCK if column_blocks < FEW_COLUMN_BLOCKS else n_rows
            if column_block_cap and rows_resident(seg, n_rows):
                column_blocks = min(column_blocks, column_block_cap)
            grid = (column_blocks, _blocks(n_rows, rows_per_block))
            block = (ROWS_THREADS,)
        any_float = seg.weights                          # a valid pointer for unused arguments
        # scale and min go as stored (float16 or float32): the kernel's name says which
        args = (x, np.int32(x_half), np.int32(x_stride), np.int32(n_rows), np.int32(rows_per_block),
                seg.weights, np.int32(seg.words_per_row), np.int32(seg.out_features),
                any_float if seg.scale is None else seg.scale,
                any_float if seg.min is None else seg.min,
                np.int32(seg.groups), np.int32(seg.group_size),
                any_float if seg.perm is None else seg.perm, np.int32(seg.perm is not None),
                np.int32(seg.stored_in), np.int32(packed.in_features),
                any_float if seg.bias is None else seg.bias, np.int32(seg.bias is not None),
                any_float if residual is None else residual, np.int32(residual is not None),
                np.int32(residual_stride), out, np.int32(y_stride), np.int32(seg.out_offset),
                np.int32(ACTIVATIONS[activation]), np.int32(y_half), *_norm_args(norm, any_float),
                *(kv.args(any_float) if kv is not None else _no_kv_fold_args(any_float)))
        if on_mma:
            partials = mma.scratch(splits * n_rows * seg.out_features) if grid[1] > 1 else any_float
            args += (partials, mma.counters(grid[0] * grid[2]), np.int32(split_k), np.int32(parts))
            launches.append(_Launch(mma.module, name, grid, block, args, shared=mma_shared_bytes(parts)))
            continue
        launches.append(_Launch(tc_module if tensor_cores else module, name, grid, block, args,
                                "" if bulk else seg.kernel))
    return launches


PAIR_KERNELS = ("int4",)       # cuda/linear_pair.cu linear_rows_pair_*: int4 codes, half scales and mins
PAIR_COUNTERS = 3              # chain[0..2]: tickets, the first call's blocks done, the second's


@dataclass
class PairCall:
    """One exact call of linear_pair: linear()'s x, packed, out, residual, activation and norm."""
    x: object
    packed: PackedLinear
    out: object
    residual: object = None
    activation: str | None = None
    norm: NormFold | None = None


def pair_supported(first: PackedLinear, second: PackedLinear) -> bool:
    """Whether linear_pair runs these two weights as one launch: each one segment of a kind with
    a pair kernel (PAIR_KERNELS), both the same kind."""
    kinds = []
    for packed in (first, second):
        segments = [seg for seg in packed.segments if seg.out_features]
        if len(segments) != 1:
            return False
        kinds.append(segments[0].kernel)
    return kinds[0] == kinds[1] and kinds[0] in PAIR_KERNELS


def linear_pair(module, first: PairCall, second: PairCall, chain, column_block_cap: int | None = None):
    """linear(first), then linear(second), exact, on the rows kernels, in one launch (cuda/linear_pair.cu
    linear_rows_pair_*): the second call may read what the first writes (the MLP's norm-linear
    reading the residual stream the out projection's residual add leaves). Every output has the
    bits the two launches give it. module: the linear_pair module (compiled only where a pair
    runs). chain: PAIR_COUNTERS uint32 zeros on the device, which every launch leaves zero (one
    buffer for every pair: one stream orders them)."""
    if not pair_supported(first.packed, second.packed):
        raise ValueError(f"linear_pair runs two one-segment weights of one kind among {list(PAIR_KERNELS)}")
    if chain.dtype != np.uint32 or chain.ndim != 1 or chain.shape[0] < PAIR_COUNTERS:
        raise ValueError(f"chain must be {PAIR_COUNTERS} uint32 counters, got {chain.dtype} {chain.shape}")
    launches = [_checked_launches(module, c.x, c.packed, c.out, True, None, c.residual, c.activation, None,
                                  column_block_cap, c.norm, None) for c in (first, second)]
    if not all(launches):                # a call of no rows: the other alone
        for launch in launches[0] + launches[1]:
            launch.run()
        return first.out, second.out
    (a,), (b,) = launches
    blocks0, blocks1 = a.grid[0] * a.grid[1], b.grid[0] * b.grid[1]
    module.get_function(f"linear_rows_pair_{a.rows_kernel}")(
        (blocks0 + blocks1,), (ROWS_THREADS,),
        a.args + b.args + (np.int32(blocks0), np.int32(a.grid[0]), np.int32(b.grid[0]), chain))
    return first.out, second.out


def swiglu_fold_supported(packed: PackedLinear) -> bool:
    """Whether every segment's rows kernel stages swiglu(up) (cuda/linear.cu TakesSwiglu): not
    the float32-scale kinds, which have no registers left for it."""
    return not any(seg.kernel.endswith("_f32s") for seg in packed.segments)


def _norm_args(norm: NormFold | None, any_float) -> tuple:
    """The kernels' norm_weight, norm_bias, norm, norm_half, norm_eps."""
    if norm is None:
        return any_float, any_float, np.int32(0), np.int32(0), np.float32(0.0)
    kind = NORM_KINDS[norm.kind] + (norm.bias is not None)
    return (any_float if norm.weight is None else norm.weight, any_float if norm.bias is None else norm.bias,
            np.int32(kind), np.int32(norm.half), np.float32(norm.eps))


def _no_kv_fold_args(any_pointer) -> tuple:
    """The kernels' kv_* parameters when nothing is folded (kv_mode 0: the rest unread)."""
    return (np.int32(0), *[any_pointer] * 8, np.int32(0), np.int32(0), np.int32(0), any_pointer, np.int32(0),
            any_pointer, np.int32(0), np.int32(0), np.int32(0), any_pointer)


def _check_kv_fold(kv: KvFold, exact: bool, activation, out) -> None:
    if not exact or activation is not None or out.dtype != np.float32:
        raise ValueError("a folded KV write needs an exact call, no activation and a float32 out")
    span = kv.kv.n_kv * kv.kv.head_dim
    for name, offset in (("key", kv.k_offset), ("value", kv.v_offset)):
        if offset + span > out.shape[1]:
            raise ValueError(f"a folded KV write's {name} columns {offset}..{offset + span} pass the output's "
                             f"{out.shape[1]}")
    if kv.rows.shape[0] != out.shape[0]:
        raise ValueError(f"a folded KV write stores {kv.rows.shape[0]} rows of a {out.shape[0]}-row call")


def check_group_lookup(seg) -> None:
    """The rows kernels load a lane's 4 words at once (16 bytes: cuda/linear_rows.cuh), so a
    row is whole 16-byte lines (pack_linear pads it so); and they find a word's group as
    __umulhi(column, ceil(2^32 / group_size)) (cuda/linear_kinds.cuh group_magic), exact
    while stored columns x group_size < 2^32."""
    if seg.words_per_row % ROWS_SPAN_WORDS:
        raise ValueError(f"the rows kernels read weight rows of whole 16-byte lines, got {seg.words_per_row} "
                         f"words a row (pack_linear pads them)")
    if not seg.kind.startswith("int"):
        return
    columns = seg.words_per_row * COLUMNS_PER_WORD[seg.kind]
    if columns * seg.group_size >= 1 << 32:
        raise ValueError(f"a quantized segment's stored columns x group size must be < 2^32 for the "
                         f"rows kernels' group lookup, got {columns} x {seg.group_size}")


def _blocks(n: int, per_block: int) -> int:
    return -(-n // per_block)


def _row_stride(array, name: str, dtype=np.float32) -> int:
    """Row stride in elements of a (T, width) array of `dtype` whose rows are each contiguous."""
    if array.dtype != dtype:
        allowed = "float32 or float16" if name == "x" else "float32 (float16 only with an activation)"
        raise ValueError(f"{name} must be {allowed}, got {array.dtype}")
    size = array.dtype.itemsize
    if array.shape[1] > 1 and array.strides[1] != size:
        raise ValueError(f"{name}'s rows must be contiguous (column stride {size} bytes), "
                         f"got strides {array.strides}")
    if array.strides[0] % size or array.strides[0] < 0:
        raise ValueError(f"{name}'s row stride must be a non-negative whole number of elements, "
                         f"got {array.strides[0]} bytes")
    return array.strides[0] // size
