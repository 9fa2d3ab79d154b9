"""Launch geometry for cuda/kv.cu; DeviceKV: the KV pool on the device; DeviceView: one
cache's storage, the pool through its block table.

Arrays are device arrays (CuPy, or the CPU harness's NumPy arrays). Layouts: cuda/README.md
("KV storage per side"). The twin is tinyloop/backends/reference/twins/kv.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tinyloop.kv.modes import CODE_BITS, check_mode, group_size, packed_bytes_per_row
from tinyloop.limits import ATTENTION_BLOCK

KV_THREADS = 128             # kv_write_*: one block per (token, kv head, side), threads stride hd
COPY_THREADS = 128           # rows_gather / rows_scatter: one block per (row, plane), threads stride the row
KERNELS = {"fp16": "kv_write_fp16", "fp32": "kv_write_fp32", "int8": "kv_write_int8",
           "int4": "kv_write_int4", "int4-h": "kv_write_int4h"}
# cuda/kv_store.cuh TL_KV_*: how a KV write folded into the qkv linear names the cache's mode
KV_MODE_CODES = {"fp32": 1, "fp16": 2, "int8": 3, "int4": 4, "int4-h": 5}
KV_FOLD_MAX_HD = 128         # kv_store.cuh KV_FOLD_MAX_HD: the fold's per-warp scratch holds a row this long


@dataclass
class DeviceKV:
    """The KV pool's keys and values on the device (kv/pool.py): `rows` pool rows (whole
    64-row blocks) of n_kv heads, per side a dict: float modes {"data": (n_kv, rows, hd)
    float16 / float32}; int modes {"codes": (n_kv, rows, hd * bits / 8) uint8, "scale",
    "min": (n_kv, rows, groups) float16}. Dict order is the kernels' argument order."""
    mode: str
    n_kv: int
    rows: int
    head_dim: int
    keys: dict
    values: dict

    @classmethod
    def allocate(cls, mode: str, n_kv: int, rows: int, head_dim: int, xp=np):
        check_mode(mode)
        if rows % ATTENTION_BLOCK:
            raise ValueError(f"KV rows must be a multiple of {ATTENTION_BLOCK}, got {rows}")
        if mode == "int4-h" and head_dim & (head_dim - 1):
            raise ValueError(f"the int4-h KV cache needs a power-of-two head_dim, got {head_dim}")
        lead = (n_kv, rows)

        def side():
            if mode in CODE_BITS:
                groups = head_dim // group_size(head_dim)
                return {"codes": xp.zeros(lead + (head_dim * CODE_BITS[mode] // 8,), np.uint8),
                        "scale": xp.zeros(lead + (groups,), np.float16),
                        "min": xp.zeros(lead + (groups,), np.float16)}
            return {"data": xp.zeros(lead + (head_dim,), np.float16 if mode == "fp16" else np.float32)}

        return cls(mode, n_kv, rows, head_dim, side(), side())

    @property
    def bytes_per_row(self) -> int:
        """Bytes one token's keys and values take per slot (the packed layout kv/modes.py counts)."""
        return packed_bytes_per_row(self.mode, self.n_kv, self.head_dim)

    @property
    def nbytes(self) -> int:
        return int(sum(a.nbytes for a in self.arrays()))

    def arrays(self) -> list:
        """Every stored array once: keys' then values', in argument order."""
        return [*self.keys.values(), *self.values.values()]

    def scratch_bytes(self, n_rows: int) -> int:
        """Scratch copy_rows needs to move n_rows pool rows of the largest array."""
        return max(_planes(a) * n_rows * _row_bytes(a) for a in self.arrays())


class DeviceView:
    """One cache's storage: the pool through its block table, (n_slots, blocks) int32, kept on
    the host by the cache (kv/cache.py) and copied to a device array of the same shape, allocated
    once, so the kernels of a captured graph read the current table from a fixed address.
    Physical row r of slot s is pool row table[s, r // 64] * 64 + r % 64."""

    def __init__(self, pool: DeviceKV, table: np.ndarray, device_table, upload):
        """device_table: a (n_slots, blocks) int32 device array; upload(buffer, host values): a
        copy ordered with the stream graphs replay on (device.upload_ints)."""
        self.pool, self.table, self.device_table, self._upload = pool, table, device_table, upload
        self.sync()

    def sync(self) -> None:
        """The host table onto the device (after the cache allocated or adopted blocks)."""
        self._upload(self.device_table, self.table)

    def blocks(self, slot: int):
        """Slot `slot`'s row of the device table: the kernels' `blocks` argument."""
        if not 0 <= slot < self.n_slots:
            raise ValueError(f"slot {slot} outside 0..{self.n_slots - 1}")
        return self.device_table[slot]

    def pool_rows(self, rows) -> np.ndarray:
        """Physical rows (n,) -> every slot's pool rows, (n_slots * n,) int32, slot-major."""
        rows = np.asarray(rows, np.int64)
        pool = self.table[:, rows // ATTENTION_BLOCK].astype(np.int64) * ATTENTION_BLOCK + rows % ATTENTION_BLOCK
        return pool.reshape(-1).astype(np.int32)

    mode = property(lambda self: self.pool.mode)
    n_kv = property(lambda self: self.pool.n_kv)
    head_dim = property(lambda self: self.pool.head_dim)
    keys = property(lambda self: self.pool.keys)
    values = property(lambda self: self.pool.values)
    n_slots = property(lambda self: self.table.shape[0])
    rows = property(lambda self: self.table.shape[1] * ATTENTION_BLOCK)      # physical rows per slot


@dataclass
class TokenTables:
    """Several caches' block tables in one launch (a batched step: cuda/kv.cu, attention.cu
    per_token_tables): token t's block table row starts at table[offsets[t]], so the tokens of
    different caches, at different slots, are written and read by one launch."""
    table: object       # (n,) int32 device array: every part's table rows, stacked
    offsets: object     # (T,) int32 device array: where each token's row starts in `table`

    def check(self, n_tokens: int) -> None:
        for name, array in (("table", self.table), ("offsets", self.offsets)):
            if array.dtype != np.int32 or array.ndim != 1 or not array.flags.c_contiguous:
                raise ValueError(f"token tables: {name} must be a contiguous int32 vector, got {array.dtype} "
                                 f"{array.shape}")
        if self.offsets.shape != (n_tokens,):
            raise ValueError(f"token tables: {self.offsets.shape[0]} offsets for {n_tokens} tokens")


def _planes(array) -> int:
    return array.shape[0]


def _row_bytes(array) -> int:
    return math.prod(array.shape[2:]) * array.dtype.itemsize


def _token_stride(x, n_kv: int, head_dim: int) -> int:
    """x: (T, n_kv, hd) float32, heads packed, any token stride (a view of the fused qkv
    output) -> the token stride in floats."""
    # a head axis of one has no stride to keep (CuPy gives it the token stride, NumPy hd floats)
    if (x.dtype != np.float32 or x.ndim != 3 or x.shape[1:] != (n_kv, head_dim) or x.strides[2] != 4
            or (n_kv > 1 and x.strides[1] != 4 * head_dim)):
        raise ValueError(f"expected (T, {n_kv}, {head_dim}) float32 with heads packed, got {x.dtype} "
                         f"shape {x.shape} strides {x.strides}")
    return x.strides[0] // 4


def kv_write(module, kv: DeviceView, slot: int, rows_dev, keys, values, rotation=None,
             tables: TokenTables | None = None) -> None:
    """keys, values: (T, n_kv, hd) float32 -> quantized and stored at physical rows rows_dev (T,)
    int32 of `slot` (through its block table row), both sides in one launch: grid (T, n_kv, 2).
    rotation: None (keys already rotated), or the forward's RoPE rows (T, hd/2) complex64: the
    keys are rotated as they are stored, and left rotated in `keys` (rope_rows' bits: the
    launch that RoPE fusion saves).
    tables: several caches' tokens (a batched step): each token's block table row from
    `tables` (slot and kv's table unused; kv gives the pool); a row's bits are the same."""
    n_tokens = keys.shape[0]
    if values.shape[0] != n_tokens or rows_dev.shape != (n_tokens,) or rows_dev.dtype != np.int32:
        raise ValueError(f"kv_write: {n_tokens} keys, {values.shape[0]} values, rows {rows_dev.shape} "
                         f"{rows_dev.dtype} (expected int32)")
    check_rotation(rotation, n_tokens, kv.head_dim)
    if tables is None:
        blocks = kv.blocks(slot)
    else:
        tables.check(n_tokens)
        blocks = tables.table
    if not n_tokens:
        return
    head_dim = kv.head_dim
    k_stride = _token_stride(keys, kv.n_kv, head_dim)
    v_stride = _token_stride(values, kv.n_kv, head_dim)
    groups = head_dim // group_size(head_dim)
    shared = 4 * (head_dim + (2 * groups if kv.mode in CODE_BITS else 0))     # the row, group scale and min
    module.get_function(KERNELS[kv.mode])(
        (n_tokens, kv.n_kv, 2), (KV_THREADS,),
        (keys, values, np.int32(k_stride), np.int32(v_stride), *kv.keys.values(), *kv.values.values(),
         blocks, rows_dev, np.int32(kv.n_kv), np.int32(kv.pool.rows), np.int32(head_dim),
         rows_dev if rotation is None else rotation, np.int32(rotation is not None),
         rows_dev if tables is None else tables.offsets, np.int32(tables is not None)),
        shared_mem=shared)


@dataclass
class KvFold:
    """kv_write folded into the exact qkv linear that computes the keys and values (cuda/linear.cu's
    rows kernels and cuda/linear_mma.cu, launch/linear.py `kv=`): the call's output columns [k_offset, k_offset + n_kv hd) are the keys
    and [v_offset, ...) the values, stored at physical rows `rows` (T,) int32 through `blocks`
    (a slot's table row, or with `table_offsets` several caches' rows: TokenTables), rotated by
    `rotation` (RoPE rows, or None) as kv_write would: the same bits, one launch fewer.
    counters: (>= T * n_kv,) uint32 zeros, which every launch leaves zero."""
    kv: DeviceView
    rows: object
    blocks: object
    rotation: object
    table_offsets: object
    k_offset: int
    v_offset: int
    counters: object

    def args(self, any_pointer) -> tuple:
        """linear.cu's kv_* parameters, in order."""
        pool_arrays = lambda side: [*side.values()] + [any_pointer] * (3 - len(side))
        return (np.int32(KV_MODE_CODES[self.kv.mode]), *pool_arrays(self.kv.keys), *pool_arrays(self.kv.values),
                self.blocks, self.rows, np.int32(self.kv.n_kv), np.int32(self.kv.pool.rows),
                np.int32(self.kv.head_dim), self.rows if self.rotation is None else self.rotation,
                np.int32(self.rotation is not None),
                self.rows if self.table_offsets is None else self.table_offsets,
                np.int32(self.table_offsets is not None), np.int32(self.k_offset), np.int32(self.v_offset),
                self.counters)


def kv_fold(kv: DeviceView, slot: int, rows_dev, k_offset: int, v_offset: int, counters, rotation=None,
            tables: TokenTables | None = None) -> KvFold:
    """The KvFold of kv_write(kv, slot, rows_dev, keys, values, rotation, tables) where keys and
    values are columns [k_offset, + n_kv hd) and [v_offset, + n_kv hd) of the linear's output:
    the same checks, the same arguments."""
    n_tokens = rows_dev.shape[0]
    if rows_dev.ndim != 1 or rows_dev.dtype != np.int32:
        raise ValueError(f"kv fold: rows must be an int32 vector, got {rows_dev.dtype} {rows_dev.shape}")
    if kv.head_dim > KV_FOLD_MAX_HD:
        raise ValueError(f"kv fold: head_dim {kv.head_dim} is over the fold's {KV_FOLD_MAX_HD}")
    span = kv.n_kv * kv.head_dim
    if min(k_offset, v_offset) < 0 or abs(k_offset - v_offset) < span:
        raise ValueError(f"kv fold: key columns from {k_offset} and value columns from {v_offset} must not "
                         f"overlap ({span} each)")
    if counters.dtype != np.uint32 or counters.ndim != 1 or counters.shape[0] < n_tokens * kv.n_kv:
        raise ValueError(f"kv fold: counters must be at least {n_tokens * kv.n_kv} uint32, got "
                         f"{counters.dtype} {counters.shape}")
    check_rotation(rotation, n_tokens, kv.head_dim)
    if tables is None:
        blocks, offsets = kv.blocks(slot), None
    else:
        tables.check(n_tokens)
        blocks, offsets = tables.table, tables.offsets
    return KvFold(kv, rows_dev, blocks, rotation, offsets, k_offset, v_offset, counters)


def check_rotation(rotation, n_tokens: int, head_dim: int) -> None:
    """A fused RoPE's rows: (T, hd/2) complex64, contiguous (read as (T, hd) float pairs)."""
    if rotation is None:
        return
    if rotation.dtype != np.complex64 or rotation.shape != (n_tokens, head_dim // 2) \
            or not rotation.flags.c_contiguous:
        raise ValueError(f"rotation must be contiguous ({n_tokens}, {head_dim // 2}) complex64, got "
                         f"{rotation.dtype} {rotation.shape}")


def copy_rows(module, arrays, source_dev, target_dev, scratch) -> None:
    """Pool rows source[i] -> target[i] (int32 device arrays, targets distinct) of every kv head
    of each pool array (n_kv, rows, ...), contiguous: per array a gather into scratch (uint8,
    at least DeviceKV.scratch_bytes(n)) and a scatter, so targets may overlap sources (NumPy's
    a[:, target] = a[:, source])."""
    n = source_dev.shape[0]
    if target_dev.shape != (n,) or source_dev.dtype != np.int32 or target_dev.dtype != np.int32:
        raise ValueError(f"copy_rows: source {source_dev.shape} {source_dev.dtype}, target "
                         f"{target_dev.shape} {target_dev.dtype} (expected equal int32 vectors)")
    if not n:
        return
    gather, scatter = module.get_function("rows_gather"), module.get_function("rows_scatter")
    for array in arrays:
        if not array.flags.c_contiguous:
            raise ValueError(f"copy_rows needs contiguous arrays, got strides {array.strides}")
        planes, row_bytes = _planes(array), _row_bytes(array)
        if scratch.nbytes < planes * n * row_bytes:
            raise ValueError(f"copy_rows: scratch holds {scratch.nbytes} bytes, needs {planes * n * row_bytes}")
        grid = (n, planes)
        args = (np.int32(n), np.int32(array.shape[1]), np.int32(row_bytes))
        gather(grid, (COPY_THREADS,), (array, scratch, source_dev, *args))
        scatter(grid, (COPY_THREADS,), (array, scratch, target_dev, *args))
