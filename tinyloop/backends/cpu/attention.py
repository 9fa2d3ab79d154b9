"""Causal attention of new queries over a request's keys and values, on the CPU.

One compiled kernel (kernels/attention.py) serves every path and every KV mode: it
reads the backend's own storage (kvstore.py) where the forward's plan says the keys
are (model/plan.py: positions, window, ring, a draft tree's per-query path rows), and
each query's output bits depend only on its own q, the keys and values it may see in
the order of their logical positions, and its position. The prefill (a bulk plan)
therefore gives every row the bits a decode of that row alone gives, and a tree node
the bits a sequential decode of its path gives. A query at logical position p attends
to logical positions 0..p (or the last `window` of them).
"""
from __future__ import annotations

import numpy as np

from tinyloop.backends.cpu.kernels.attention import NO_TREE, TILE, Context, PreparedAttention
from tinyloop.backends.cpu.kvstore import kernel_bits
from tinyloop.kv.modes import group_size
from tinyloop.limits import ATTENTION_BLOCK
from tinyloop.model.plan import Geometry, TreeRows, build_plan


def context_of(storage, plan) -> Context:
    """What the attention kernel needs to know of one cache's queries in a forward, from its plan."""
    geometry = plan.geometry
    window = geometry.window if geometry is not None else 0
    ring_blocks = geometry.ring // ATTENTION_BLOCK if geometry is not None and geometry.ring else 0
    shared_end, tail_rows = NO_TREE, None
    if plan.exact and plan.attention is not None and plan.attention.n_tail:
        shared_end, tail_rows = plan.attention.shared_end, plan.attention.tail_rows
    return Context(plan.positions, window, ring_blocks, shared_end, tail_rows, storage.rows)


def _prepared(holder: dict, storages: list, plans: list, q, scale: float) -> PreparedAttention:
    """The PreparedAttention of these caches' queries, worked out by the forward's first layer
    and kept in `holder` (a plan's or a batched forward's dict) for the others."""
    key = ("numba attention", tuple(id(s) for s in storages), q.shape, float(scale))
    kept = holder.get(key)
    if kept is None:
        first = storages[0]
        if any(s.pool is not first.pool for s in storages):
            raise ValueError("attention over caches of different KV pools in one call")
        contexts = [context_of(s, plan) for s, plan in zip(storages, plans)]
        prepared = PreparedAttention(contexts, kernel_bits(first.mode), group_size(first.head_dim), first.keys,
                                     first.values, scale, first.mode == "int4-h", q.shape[2], q.shape[1], None, TILE)
        kept = holder[key] = (storages, prepared)         # storages held: their ids stay their own
    return kept[1]


def attention(q: np.ndarray, storage, slot: int, plan, scale: float) -> np.ndarray:
    """q (T, H, hd) over slot `slot` of a KVStorage, as the ForwardPlan says -> (T, H, hd) float32.

    The plan's exact and bulk forms read the same keys; only a draft tree (exact plans)
    adds per-query path rows. What depends on the plan and the store only (checks, operands,
    the driver) is worked out by the forward's first layer and kept on the plan for the rest."""
    return _prepared(plan.prepared, [storage], [plan], q, scale).run(q, [storage.table[slot]])


def attention_parts(q: np.ndarray, parts: list, scale: float, holder: dict) -> np.ndarray:
    """Several caches' queries in one kernel call: parts [(storage, slot, plan)] own q's rows in
    order, each its plan's queries. Each query's bits are those of attention() over its own
    cache alone. holder: where the prepared call is kept for the forward's other layers."""
    storages = [storage for storage, _, _ in parts]
    prepared = _prepared(holder, storages, [plan for _, _, plan in parts], q, scale)
    return prepared.run(q, [storage.table[slot] for storage, slot, _ in parts])


def attention_over(q: np.ndarray, keys: np.ndarray, values: np.ndarray, positions, scale: float,
                   tree: TreeRows | None = None, window: int = 0, exact: bool = True) -> np.ndarray:
    """Attention over plain (n_kv, rows, hd) float32 key and value arrays in any memory
    layout, physical row = virtual row: the kernel on an fp32 store holding them, for
    tests and tools. exact=False plans the bulk (prefill) path, which gives the same bits."""
    from tinyloop.backends.cpu.kvstore import KVStorage, PoolStorage

    n_kv, rows, head_dim = keys.shape
    padded = -(-rows // ATTENTION_BLOCK) * ATTENTION_BLOCK
    storage = KVStorage(PoolStorage("fp32", n_kv, padded, head_dim),
                        np.arange(padded // ATTENTION_BLOCK, dtype=np.int32)[None])
    storage.keys["data"][:, :rows] = keys
    storage.values["data"][:, :rows, :head_dim] = values
    plan = build_plan(positions, int(np.min(positions)), Geometry(padded, None, window), exact, tree)
    return attention(q, storage, 0, plan, scale)
