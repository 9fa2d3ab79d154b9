"""Launch geometry for cuda/attention.cu (exact decode / verify / draft-tree attention).
The twin is tinyloop/backends/reference/twins/attention.py.

The context of every query is split into fixed chunks of CHUNK_BLOCKS 64-key blocks
(cuda/README.md "Attention: split context"): pass 1 (attention_<mode>, grid (ceil(T / qb),
n_kv, max_chunks), qb queries a block) writes one partial per chunk into a scratch buffer,
and either its last chunk block per query merges them (given counters: one launch) or pass 2
(attention_merge, grid (T, n_kv)) does, in chunk order. max_chunks comes from the cache's
geometry (rows, window, ring, tree tail), never from the positions, which live on the device
(and change under a replayed CUDA graph)."""
from __future__ import annotations

import numpy as np

from tinyloop.backends.cuda.launch.kv import DeviceView, TokenTables, check_rotation
from tinyloop.backends.cuda.launch.memory import allow_shared, device_shared_limit
from tinyloop.limits import ATTENTION_BLOCK

ATT_THREADS = 128            # one block per (queries, kv head, chunk): 4 warps
NO_TREE = 1 << 30            # shared_end when there is no draft tree
CHUNK_BLOCKS = 1             # S: 64-key blocks per chunk (cuda/attention.cu ATT_CHUNK_BLOCKS, the twin's)
SCRATCH_BUDGET = 128 << 20   # bytes of partials one call allocates at most when not given a scratch
MAX_GRID_Z = 65535
KERNELS = {"fp16": "attention_fp16", "fp32": "attention_fp32", "int8": "attention_int8",
           "int4": "attention_int4", "int4-h": "attention_int4h"}
MERGE_KERNEL = "attention_merge"


QUERIES_PER_BLOCK = 16        # a verify's or a tree's queries served by one pass-1 block (no window)
SHARED_BUDGET = 96 * 1024     # the most dynamic shared memory the launcher gives a block for more queries


def tile_stride(head_dim: int) -> int:
    """The key and value tiles' row stride in floats (cuda/attention.cu att_tile_stride): where
    head_dim is a multiple of 4, head_dim or head_dim + 4, whichever is 4 times an odd number (the
    sums' 16-byte loads of 8 consecutive rows then fall on 8 distinct groups of 4 banks); else
    head_dim | 1 (odd: a warp reading one column hits 32 banks)."""
    if head_dim % 4:
        return head_dim | 1
    return head_dim if head_dim // 4 % 2 else head_dim + 4


def shared_bytes(group: int, head_dim: int, queries: int = 1, tiles: int = 2) -> int:
    """Dynamic shared memory of one pass-1 block serving `queries` queries: a 64-row tile of keys
    and one of values (tiles = 2; 1: the values replace the keys) at tile_stride, then
    per query its G heads' rotated queries (G, hd), scores (G, 64), sums (G hd + G), max, corr
    and skip (G each), and 5 ints; 2 ints."""
    per_query = 2 * group * head_dim + (ATTENTION_BLOCK + 4) * group + 5
    return 4 * (tiles * ATTENTION_BLOCK * tile_stride(head_dim) + queries * per_query + 2)


def layout(n_queries: int, group: int, head_dim: int, window: int, ring_blocks: int,
           limit: int = 227 * 1024) -> tuple[int, int]:
    """(queries a pass-1 block serves, tiles). Two tiles (keys and values staged together)
    where one query's block fits the device's `limit`, else one. Without a window (every
    query's chunk z is the same 64 S keys) up to QUERIES_PER_BLOCK queries a block within
    min(SHARED_BUDGET, limit), so a verify's or a tree's queries read each block of keys and
    values once; with a window, 1 (each query's chunks start at its own first block). Neither
    changes a bit: each query's sums are its own, and each element is staged the same way."""
    tiles = 2 if shared_bytes(group, head_dim, 1, 2) <= limit else 1
    if shared_bytes(group, head_dim, 1, tiles) > limit:
        raise ValueError(f"attention needs {shared_bytes(group, head_dim, 1, tiles)} bytes of shared memory per "
                         f"block (query group {group}, head_dim {head_dim}); the device allows {limit}")
    if window or ring_blocks:
        return 1, tiles
    n = max(1, min(n_queries, QUERIES_PER_BLOCK))
    while n > 1 and shared_bytes(group, head_dim, n, tiles) > min(SHARED_BUDGET, limit):
        n -= 1
    return n, tiles



ROW_BYTES = {"fp32": lambda hd: 4 * hd, "fp16": lambda hd: 2 * hd, "int8": lambda hd: hd,
             "int4": lambda hd: hd // 2, "int4-h": lambda hd: hd // 2}


def address(array) -> int:
    """A device array's first byte: CuPy's pointer, or (the CPU harness) NumPy's."""
    data = getattr(array, "data", None)
    return int(data.ptr) if hasattr(data, "ptr") else int(array.ctypes.data)


def vector_loads(kv: DeviceView) -> bool:
    """Whether the kernel may load the stored rows in 16-byte pieces (att_stage): every row a
    multiple of 16 bytes and every code or data array 16-byte aligned (an allocator's arrays
    are; a view or a harness array need not be)."""
    if ROW_BYTES[kv.mode](kv.head_dim) % 16:
        return False
    data = [a for side in (kv.keys, kv.values) for name, a in side.items() if name in ("data", "codes")]
    return all(address(a) % 16 == 0 for a in data)


def merge_shared_bytes(group: int, head_dim: int) -> int:
    """Dynamic shared memory of one pass-2 block: the group's outputs (G, hd)."""
    return 4 * group * head_dim


def max_chunks(rows: int, window: int, ring_blocks: int, shared_end: int = NO_TREE, tail_len: int = 0) -> int:
    """The most chunks one query can span in a cache of `rows` physical rows: with a window,
    (window + 62) // 64 + 1 blocks at most, so (blocks + S - 2) // S + 1 chunks; without a
    ring, positions stay below the rows (or below the tree tail's end), so (last block) // S + 1.
    A ring without a window bounds nothing (and is no cache TinyLoop builds)."""
    bounds = []
    if window:
        blocks = (window + ATTENTION_BLOCK - 2) // ATTENTION_BLOCK + 1
        bounds.append((blocks + CHUNK_BLOCKS - 2) // CHUNK_BLOCKS + 1)
    if not ring_blocks:
        last = (rows - 1) // ATTENTION_BLOCK
        if tail_len:
            last = max(last, shared_end + -(-tail_len // ATTENTION_BLOCK) - 1)
        bounds.append(last // CHUNK_BLOCKS + 1)
    if not bounds:
        raise ValueError("attention: a ring without a window leaves the context unbounded")
    return max(1, min(bounds))


def partial_floats(n_heads: int, head_dim: int, chunks: int) -> int:
    """Floats of scratch per query: n_kv * chunks partials of G (hd + 2) floats = H (hd + 2) chunks."""
    return n_heads * (head_dim + 2) * chunks


def scratch_floats(n_queries: int, n_heads: int, head_dim: int, chunks: int) -> int:
    """Floats of scratch for n_queries queries in one launch pair."""
    return n_queries * partial_floats(n_heads, head_dim, chunks)


def _array_module(out):
    if isinstance(out, np.ndarray):
        return np
    import cupy
    return cupy


def attention(module, kv: DeviceView, q, slot: int, positions_dev, window: int, ring_blocks: int,
              shared_end_dev, tail_rows_dev, tail_len: int, scale: float, out, *, scratch=None, chunks=None,
              counters=None, rotation=None, tables: TokenTables | None = None):
    """q: (T, H, hd) float32, heads packed, any token stride (a view of the fused qkv output);
    positions_dev (T,) int32 logical positions; window (0: none); ring_blocks (0: no ring);
    shared_end_dev (1,) int32 on the device: first block read through tail_rows_dev (T, tail_len)
    int32 physical rows (a draft tree's paths; None without a tree, and shared_end_dev is then
    not read). Both live on the device so that a captured verify graph reads each round's tree;
    tail_len may exceed the tree's tail (padding past a query's blocks is never read).
    out (T, H, hd) float32 contiguous <- attention over `slot` of kv (through its block table row).

    chunks: the grid's z, max_chunks(...) of the geometry; None: max_chunks(rows, window,
    ring_blocks), which bounds every tree whose tail stays inside the cache's rows.

    scratch: contiguous float32 device array for the chunk partials (any shape; None:
    allocated here, at most SCRATCH_BUDGET bytes). It holds n queries' partials,
    n = size // partial_floats(H, hd, max_chunks(...)) >= 1, and the call runs the queries n
    at a time: 2 ceil(T / n) launches, each pass 1 (n, n_kv, max_chunks) then pass 2 (n, n_kv).

    counters: a uint32 device array of at least n x n_kv zeros (the scratch's n), left zero by
    every launch: pass 1 merges too (the last chunk block of each query and kv head merges), so
    one launch per n queries. None: the two launches.
    rotation: None (q already rotated), or the forward's RoPE rows (T, hd/2) complex64: each
    query is rotated as it is loaded (rope_rows' bits; q itself is left as it was).

    tables: several caches' queries in one launch (a batched step): each query's block table row
    from `tables` (slot and kv's table unused; kv gives the pool), one query a block; pass
    `chunks` for the widest table.

    Row-invariant: how the queries are grouped, or which launch merges, changes no bit of any one
    of them."""
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
    check_rotation(rotation, n_queries, head_dim)
    if tables is not None:
        tables.check(n_queries)
    if ring_blocks and ring_blocks * ATTENTION_BLOCK > kv.rows:
        raise ValueError(f"attention: a ring of {ring_blocks} blocks in {kv.rows} rows")
    if has_tail and (shared_end_dev is None or shared_end_dev.shape != (1,) or shared_end_dev.dtype != np.int32):
        raise ValueError("attention: a tree tail needs shared_end as a (1,) int32 device array")
    if chunks is None:
        chunks = max_chunks(kv.rows, window, ring_blocks)
    if chunks > MAX_GRID_Z:
        raise ValueError(f"attention: {chunks} chunks exceed the grid's {MAX_GRID_Z}")
    per_query = partial_floats(n_heads, head_dim, chunks)
    if scratch is None:
        batch = max(1, min(n_queries, SCRATCH_BUDGET // (4 * per_query)))
        if n_queries:
            scratch = _array_module(out).empty(batch * per_query, np.float32)
    else:
        if scratch.dtype != np.float32 or not scratch.flags.c_contiguous:
            raise ValueError(f"attention: scratch must be contiguous float32, got {scratch.dtype}")
        if scratch.size < per_query:
            raise ValueError(f"attention: scratch of {scratch.size} floats is under one query's "
                             f"{per_query} ({n_heads} heads x {head_dim + 2} x {chunks} chunks)")
        batch = scratch.size // per_query
    if counters is not None:
        if counters.dtype != np.uint32 or not counters.flags.c_contiguous or counters.size < batch * kv.n_kv:
            raise ValueError(f"attention: counters must be contiguous uint32 of at least {batch * kv.n_kv}, "
                             f"got {counters.dtype} {counters.shape}")
    if not n_queries:
        return out
    group = n_heads // kv.n_kv
    blocks = kv.blocks(slot) if tables is None else tables.table
    # per-token tables: a block's queries may be of different caches, so one query a block
    qb, tiles = layout(1 if tables is not None else min(batch, n_queries), group, head_dim, window, ring_blocks,
                       device_shared_limit(out))
    shared = shared_bytes(group, head_dim, qb, tiles)
    vector = vector_loads(kv)
    function = module.get_function(KERNELS[kv.mode])
    allow_shared(function, shared, "attention")
    merge = module.get_function(MERGE_KERNEL)
    merge_shared = merge_shared_bytes(group, head_dim)
    allow_shared(merge, merge_shared, "attention_merge")
    q_stride = np.int32(q.strides[0] // 4)
    for start in range(0, n_queries, batch):
        stop = min(start + batch, n_queries)
        positions = positions_dev[start:stop]
        function((-(-(stop - start) // qb), kv.n_kv, chunks), (ATT_THREADS,),
                 (q[start:stop], q_stride, *kv.keys.values(), *kv.values.values(),
                  blocks, np.int32(kv.n_kv), np.int32(kv.pool.rows), np.int32(head_dim), np.int32(group),
                  positions, np.int32(window), np.int32(ring_blocks or 0),
                  shared_end_dev if has_tail else positions,      # not read without a tail
                  tail_rows_dev[start:stop] if has_tail else positions,
                  np.int32(tail_len if has_tail else 0), np.int32(has_tail), np.float32(scale),
                  scratch, np.int32(chunks), np.int32(vector),
                  scratch if counters is None else counters,             # not read without a merge
                  np.int32(counters is not None), out[start:stop], np.int32(stop - start), np.int32(qb),
                  np.int32(tiles), positions if rotation is None else rotation[start:stop],
                  np.int32(rotation is not None), positions if tables is None else tables.offsets[start:stop],
                  np.int32(tables is not None)),
                 shared_mem=shared)
        if counters is not None:
            continue
        merge((stop - start, kv.n_kv), (ATT_THREADS,),
              (scratch, np.int32(kv.n_kv), np.int32(head_dim), np.int32(group), np.int32(chunks), positions,
               np.int32(window), np.int32(kv.mode == "int4-h"), out[start:stop]),
              shared_mem=merge_shared)
    return out
