"""One layer's attention on the CPU: the compiled kernel (kernels/attention.py) against the
NumPy/OpenBLAS path it replaced (a frozen copy below, `legacy_*`), in one process, side by side.

SmolLM2 shapes by default (9 query heads, 3 KV heads, head_dim 64): decode at context 64,
1k and 4k, a 16-query verify at 4k, a 512-query prefill chunk; every KV mode with --modes.
Prints milliseconds (best of --repeat, the two interleaved) and old / new.

    .venv/bin/python scripts/bench_cpu_attention.py [--modes fp16,int4] [--threads 2] [--repeat 20]
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tinyloop.backends.cpu.attention import attention as new_attention  # noqa: E402
from tinyloop.backends.cpu.kernels.attention import warm_up  # noqa: E402
from tinyloop.backends.cpu.kvstore import KVStorage, kv_write  # noqa: E402
from tinyloop.limits import ATTENTION_BLOCK  # noqa: E402
from tinyloop.model.plan import Geometry, build_plan  # noqa: E402

NEG_INF = np.float32(-np.inf)


# ------------------------------------------------ the NumPy/OpenBLAS path before the kernels (frozen)
def legacy_exact(q, shared_keys, shared_values, mask, scale):
    n_queries, n_heads, head_dim = q.shape
    n_kv = shared_keys.shape[0]
    group = n_heads // n_kv
    q_groups = np.ascontiguousarray(np.multiply(q.reshape(n_queries, n_kv, group, head_dim).transpose(1, 0, 2, 3),
                                                np.float32(scale)))[:, :, None]
    scores = q_groups @ np.ascontiguousarray(shared_keys)[:, None].swapaxes(-1, -2)
    if isinstance(mask.blocks, slice):
        np.copyto(scores[:, :, mask.blocks], NEG_INF, where=mask.hidden)
    elif mask.blocks.size:
        scores[:, :, mask.blocks] = np.where(mask.hidden, NEG_INF, scores[:, :, mask.blocks])
    row_max = scores.max(axis=4, keepdims=True)
    if scores.shape[2] > 1:
        row_max = row_max.max(axis=2, keepdims=True)
    scores -= row_max
    probs = np.exp(scores, scores)
    per_block = probs @ np.ascontiguousarray(shared_values)[:, None]
    totals = per_block[:, :, 0] if per_block.shape[2] == 1 else np.add.reduce(per_block, axis=2)
    out = totals[..., :head_dim] / totals[..., head_dim:]
    return out.transpose(1, 0, 2, 3).reshape(n_queries, n_heads, head_dim)


def legacy_bulk(q, chunks, read, scale):
    n_queries, n_heads, head_dim = q.shape
    out = np.empty_like(q)
    for chunk in chunks:
        keys, values = read(chunk.rows)
        n_kv = keys.shape[0]
        group = n_heads // n_kv
        t = chunk.stop - chunk.start
        q_chunk = q[chunk.start:chunk.stop].reshape(t, n_kv, group, head_dim).transpose(1, 2, 0, 3)
        scores = q_chunk @ keys[:, None].swapaxes(-1, -2)
        scores *= np.float32(scale)
        scores = np.where(chunk.visible, scores, NEG_INF)
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        chunk_out = probs @ values[:, None, :, :head_dim]
        out[chunk.start:chunk.stop] = chunk_out.transpose(2, 0, 1, 3).reshape(t, n_heads, head_dim)
    return out


def legacy_attention(q, storage, slot, plan, scale):
    """The old CpuBackend.attention (no draft tree, no int4-h: the benchmark's cases)."""
    sides = ((storage.key_store, storage.keys), (storage.value_store, storage.values))
    if plan.exact:
        a = plan.attention
        shared = [store.blocks(arrays, slot, a.shared_blocks) for store, arrays in sides]
        return legacy_exact(q, *shared, a.mask, scale)

    def read(rows):
        out = []
        for store, arrays in sides:
            if rows.start % ATTENTION_BLOCK == 0 and rows.stop % ATTENTION_BLOCK == 0:
                blocks = store.blocks(arrays, slot, slice(rows.start // ATTENTION_BLOCK, rows.stop // ATTENTION_BLOCK))
                out.append(blocks.reshape(blocks.shape[0], -1, blocks.shape[-1]))
            else:
                out.append(store.rows(arrays, slot, np.arange(rows.start, rows.stop)))
        return out
    return legacy_bulk(q, plan.bulk, read, scale)


# ------------------------------------------------------------------------------------ the run
def best(f, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--modes", default="fp16,int8,int4")
    parser.add_argument("--threads", type=int, default=0, help="numba threads (0: numba's default)")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    args = parser.parse_args(argv)
    import numba
    if args.threads:
        numba.set_num_threads(args.threads)
    warm_up()
    rng = np.random.default_rng(0)
    rows = 4608
    cases = [("decode ctx 64", 64, 1), ("decode ctx 1k", 1024, 1), ("decode ctx 4k", 4096, 1),
             ("verify 16 @ 4k", 4096, 16), ("prefill 512 (0..512)", 512, 512),
             ("prefill 512 @ 3.5k..4k", 4096, 512)]
    print(f"threads {numba.get_num_threads()}; H={args.heads} n_kv={args.kv_heads} hd={args.head_dim}; "
          f"best of {args.repeat}, ms")
    print(f"{'mode':6} {'case':24} {'numpy':>9} {'kernel':>9} {'old/new':>8}  max|diff|")
    for mode in args.modes.split(","):
        storage = KVStorage(mode, 1, args.kv_heads, rows, args.head_dim)
        kv_write(storage, 0, slice(0, rows), rng.standard_normal((rows, args.kv_heads, args.head_dim)).astype(np.float32),
                 rng.standard_normal((rows, args.kv_heads, args.head_dim)).astype(np.float32))
        for name, context, n_queries in cases:
            positions = np.arange(context - n_queries, context)
            q = rng.standard_normal((n_queries, args.heads, args.head_dim)).astype(np.float32)
            exact = n_queries <= 16
            plan = build_plan(positions, int(positions[0]), Geometry(rows, None, 0), exact=exact)
            scale = 1 / math.sqrt(args.head_dim)
            old_out = legacy_attention(q, storage, 0, plan, scale)
            new_out = new_attention(q, storage, 0, plan, scale)
            old = new = float("inf")
            for _ in range(2):                               # interleaved
                old = min(old, best(lambda: legacy_attention(q, storage, 0, plan, scale), args.repeat // 2 or 1))
                new = min(new, best(lambda: new_attention(q, storage, 0, plan, scale), args.repeat // 2 or 1))
            print(f"{mode:6} {name:24} {old:9.3f} {new:9.3f} {old / new:8.2f}  {np.abs(old_out - new_out).max():.1e}")


if __name__ == "__main__":
    main()
