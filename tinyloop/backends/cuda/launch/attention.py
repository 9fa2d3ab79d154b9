"""Launch geometry for cuda/attention.cu (exact decode / verify / draft-tree attention).
The twin is tinyloop/backends/cpu/twins/attention.py."""
from __future__ import annotations

import numpy as np

from tinyloop.backends.cuda.launch.kv import DeviceKV
from tinyloop.limits import ATTENTION_BLOCK

ATT_THREADS = 128            # one block per (query, kv head): 4 warps
NO_TREE = 1 << 30            # shared_end when there is no draft tree
DEFAULT_SHARED_LIMIT = 48 * 1024
KERNELS = {"fp16": "attention_fp16", "fp32": "attention_fp32", "int8": "attention_int8",
           "int4": "attention_int4", "int4-h": "attention_int4h"}


def shared_bytes(group: int, head_dim: int) -> int:
    """Dynamic shared memory of one block: the group's queries (G, hd), a 64-row tile of keys
    or values with an odd row stride, scores (G, 64), sums (G hd + G), max, corr, skip (G each)."""
    return 4 * (2 * group * head_dim + ATTENTION_BLOCK * (head_dim | 1) + (ATTENTION_BLOCK + 4) * group)


def _allow_shared(function, nbytes: int) -> None:
    """Over 48 KiB a kernel must opt in (CUDA's MAX_DYNAMIC_SHARED_SIZE_BYTES; sm_90 allows
    227 KiB): CuPy's Function exposes it as a settable attribute."""
    if nbytes > DEFAULT_SHARED_LIMIT and getattr(function, "max_dynamic_shared_size_bytes", 0) < nbytes:
        try:
            function.max_dynamic_shared_size_bytes = nbytes
        except AttributeError:            # a launcher object without the attribute (the CPU harness)
            pass


def attention(module, kv: DeviceKV, q, slot: int, positions_dev, window: int, ring_blocks: int,
              shared_end: int, tail_rows_dev, tail_len: int, scale: float, out):
    """q: (T, H, hd) float32, heads packed, any token stride (a view of the fused qkv output);
    positions_dev (T,) int32 logical positions; window (0: none); ring_blocks (0: no ring);
    shared_end: first block read through tail_rows_dev (T, tail_len) int32 physical rows (a
    draft tree's paths; None and any shared_end without a tree); out (T, H, hd) float32
    contiguous <- attention over `slot` of kv. Grid (T, n_kv)."""
    n_queries, n_heads, head_dim = q.shape
    if head_dim != kv.head_dim or n_heads % kv.n_kv:
        raise ValueError(f"attention: q heads {n_heads} x {head_dim} against {kv.n_kv} kv heads x {kv.head_dim}")
    if q.dtype != np.float32 or q.strides[2] != 4 or (n_heads > 1 and q.strides[1] != 4 * head_dim):
        raise ValueError(f"attention expects (T, H, hd) float32 with heads packed, got {q.dtype} strides {q.strides}")
    if out.shape != q.shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        raise ValueError(f"attention: out must be contiguous float32 {q.shape}, got {out.dtype} {out.shape}")
    if positions_dev.shape != (n_queries,) or positions_dev.dtype != np.int32:
        raise ValueError(f"attention: positions must be ({n_queries},) int32, got {positions_dev.shape} "
                         f"{positions_dev.dtype}")
    has_tail = tail_rows_dev is not None
    if has_tail and (tail_rows_dev.shape != (n_queries, tail_len) or tail_rows_dev.dtype != np.int32
                     or not tail_rows_dev.flags.c_contiguous):
        raise ValueError(f"attention: tail_rows must be contiguous ({n_queries}, {tail_len}) int32, got "
                         f"{tail_rows_dev.shape} {tail_rows_dev.dtype}")
    if ring_blocks and ring_blocks * ATTENTION_BLOCK > kv.rows:
        raise ValueError(f"attention: a ring of {ring_blocks} blocks in {kv.rows} rows")
    if not n_queries:
        return out
    group = n_heads // kv.n_kv
    shared = shared_bytes(group, head_dim)
    function = module.get_function(KERNELS[kv.mode])
    _allow_shared(function, shared)
    function((n_queries, kv.n_kv), (ATT_THREADS,),
             (q, np.int32(q.strides[0] // 4), *kv.keys.values(), *kv.values.values(),
              np.int32(slot), np.int32(kv.n_kv), np.int32(kv.rows), np.int32(head_dim), np.int32(group),
              positions_dev, np.int32(window), np.int32(ring_blocks or 0),
              np.int32(shared_end if has_tail else NO_TREE), tail_rows_dev if has_tail else positions_dev,
              np.int32(tail_len if has_tail else 0), np.int32(has_tail), np.float32(scale), out),
             shared_mem=shared)
    return out
