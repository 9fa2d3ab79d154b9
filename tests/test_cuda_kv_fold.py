"""The KV write folded into the qkv linear (cuda/linear.cu kv_fold_*, launch/kv.py KvFold) on the
kernel_device fixture: one rows launch that computes q|k|v and stores k and v in the cache
against the linear launch followed by kv_write (kv.cu), the model's order without the fold.
The oracle is that pair of launches (each tested against its twin in test_cuda_linear.py and
test_cuda_kv.py) and the twins themselves: every comparison is bit for bit, the pool's bytes,
the call's output (keys left rotated) and the counters (left zero for the next launch)."""
from types import SimpleNamespace

import numpy as np
import pytest
from test_cuda_batch import shared_pool, token_tables
from test_cuda_kv import device_kv, host_sides, rotations
from test_cuda_linear import assert_bits_equal, twin_rows, weight_part
from test_cuda_linear_mma import Scratch

from tinyloop.backends.cuda.launch import kv as kv_launch
from tinyloop.backends.cuda.launch import linear as launch
from tinyloop.backends.cuda.launch.packing import pack_linear
from tinyloop.backends.reference.twins import kv as twin_kv
from tinyloop.backends.reference.twins import linear as twin_linear
from tinyloop.backends.reference.twins.elementwise import rope_rows

MODES = ["fp16", "fp32", "int8", "int4", "int4-h"]


def qkv_parts(rng, n_q, n_kv, hd, n_in, kinds=("int4", "int4", "int4")):
    """q | k | v weight parts (a fused qkv); kinds per part (different kinds: separate segments,
    so separate launches share the counters)."""
    return [weight_part(kind, rng, n, n_in, group=32) for kind, n in zip(kinds, (n_q, n_kv * hd, n_kv * hd))]


def run(device, parts, x, kv, slot, rows, rotation, fold, cap=None, tables=None, norm=None, mma=False):
    """The qkv call on the device, then its KV write: folded into the linear (one launch per
    segment) or kv_write after it; mma: with the tensor-core rows (linear_mma.cu takes the int4
    segments). -> (host output, host pool sides, host counters)."""
    packed = pack_linear(parts, None, SimpleNamespace(asarray=device.asarray), keep_f16=True)
    n_rows = x.shape[0]
    n_q = packed.out_features - 2 * kv.n_kv * kv.head_dim
    k_offset, v_offset = n_q, n_q + kv.n_kv * kv.head_dim
    out = device.zeros((n_rows, packed.out_features), np.float32)
    rows_dev = device.asarray(np.asarray(rows, np.int32))
    rotation_dev = None if rotation is None else device.asarray(rotation)
    counters = device.zeros(n_rows * kv.n_kv + 3, np.uint32)
    norm_fold = None
    if norm is not None:
        norm_fold = launch.NormFold("rms", device.asarray(norm), None, 1e-5)
    path = Scratch(device).path() if mma else None
    if fold:
        kv_fold = kv_launch.kv_fold(kv, slot, rows_dev, k_offset, v_offset, counters, rotation_dev, tables)
        launch.linear(device.module("linear"), device.asarray(x), packed, out, True, column_block_cap=cap,
                      norm=norm_fold, kv=kv_fold, mma=path)
    else:
        launch.linear(device.module("linear"), device.asarray(x), packed, out, True, column_block_cap=cap,
                      norm=norm_fold, mma=path)
        width = kv.n_kv * kv.head_dim
        keys = out[:, k_offset:k_offset + width].reshape(n_rows, kv.n_kv, kv.head_dim)
        values = out[:, v_offset:v_offset + width].reshape(n_rows, kv.n_kv, kv.head_dim)
        kv_launch.kv_write(device.module("kv"), kv, slot, rows_dev, keys, values, rotation_dev, tables)
    return device.to_host(out), host_sides(device, kv), device.to_host(counters)


def assert_same_store(folded, apart):
    out, sides, counters = folded
    assert_bits_equal(out, apart[0])
    for got, want in zip(sides, apart[1]):
        for name in want:
            assert np.array_equal(got[name].view(np.uint8), want[name].view(np.uint8)), name
    assert not counters.any(), counters          # every launch leaves its counters zero


def fold_and_apart(device, mode, seed, n_rows, n_q, n_kv, hd, n_in, rope, **options):
    """A random qkv call (x scaled by 2, `n_rows` distinct pool rows of 128, RoPE rows where
    `rope`) run folded and apart on fresh pools of `mode` (run's options: cap, mma). -> (parts,
    x, rows, rotation, the last pool's view, [folded, apart])."""
    rng = np.random.default_rng(seed)
    parts = qkv_parts(rng, n_q, n_kv, hd, n_in)
    x = (rng.standard_normal((n_rows, n_in)) * 2).astype(np.float32)
    rows = rng.permutation(128)[:n_rows]
    rotation = rotations(rng, n_rows, hd) if rope else None
    results = []
    for fold in (True, False):
        kv = device_kv(device, mode, 2, n_kv, 128, hd)
        results.append(run(device, parts, x, kv, 1, rows, rotation, fold, **options))
    return parts, x, rows, rotation, kv, results


def assert_the_twins_store(folded, linear, mode, n_q, n_kv, hd, rows, rotation, kv):
    """The folded call's output and pool bytes are the twins': `linear` (the linear twin's
    output), RoPE's on its keys, then the KV store's at table row 1 of kv's pool."""
    n_rows = linear.shape[0]
    want = linear.copy()
    k_cols = slice(n_q, n_q + n_kv * hd)
    v_cols = slice(n_q + n_kv * hd, n_q + 2 * n_kv * hd)
    if rotation is not None:
        want[:, k_cols] = rope_rows(want[:, k_cols].reshape(n_rows, n_kv, hd), rotation).reshape(n_rows, -1)
    assert_bits_equal(folded[0], want)
    pool = kv_launch.DeviceKV.allocate(mode, n_kv, kv.pool.rows, hd)
    twin_kv.kv_write(mode, pool.keys, pool.values, kv.table[1], rows, want[:, k_cols].reshape(n_rows, n_kv, hd),
                     want[:, v_cols].reshape(n_rows, n_kv, hd))
    for got, side in zip(folded[1], (pool.keys, pool.values)):
        for name in side:
            assert np.array_equal(got[name].view(np.uint8), side[name].view(np.uint8)), name


CASES = [  # (rows, n_q, n_kv, hd, n_in, cap, rope): resident decode rows (a capped grid: a warp
    # runs through columns of several heads), 2 rows, the tiled path (5 and 16 rows: 8-row chunks
    # then 4, 2, 1), rows split over blocks (17 and 40 rows: 16 a block), a head of one 48-wide
    # group, heads of 128 (the warp's whole scratch) and of 96 (three groups), grids of one block
    # (the last, 80 heads: a warp completes more rows than its list holds, and stores them in turns)
    (1, 64, 2, 64, 96, None, True), (1, 128, 4, 32, 200, 3, True), (2, 48, 3, 32, 64, 2, False),
    (5, 64, 2, 64, 300, None, True), (16, 32, 2, 16, 64, None, True), (3, 48, 1, 48, 40, None, False),
    (17, 64, 2, 64, 96, None, True), (40, 32, 2, 32, 48, None, False), (1, 128, 2, 128, 64, 2, True),
    (2, 96, 1, 96, 64, 1, True), (1, 600, 4, 64, 64, 1, True), (1, 8, 80, 8, 16, 1, True)]


@pytest.mark.parametrize("n_rows, n_q, n_kv, hd, n_in, cap, rope, mode",
                         [case + (mode,) for case in CASES for mode in MODES
                          if mode != "int4-h" or not case[3] & (case[3] - 1)])    # int4-h: power-of-two heads
def test_a_folded_kv_write_gives_the_bits_of_the_linear_then_kv_write(kernel_device, mode, n_rows, n_q, n_kv, hd,
                                                                       n_in, cap, rope):
    parts, x, rows, rotation, kv, results = fold_and_apart(kernel_device, mode, n_rows * 100 + hd + n_q, n_rows,
                                                           n_q, n_kv, hd, n_in, rope, cap=cap)
    assert_same_store(*results)
    assert_the_twins_store(results[0], twin_rows(parts, None, x), mode, n_q, n_kv, hd, rows, rotation, kv)


MMA_CASES = [  # (rows, n_q, n_kv, hd, n_in, rope) on the tensor-core rows: 3 splits of k on a block's 4
    # warps (300 inputs), one split (64, 40, 16 inputs), two row tiles whose 3 splits the last block
    # adds (17 rows, 600 inputs), 4 splits (512), heads of 8, 16, 48 and 128 (the warp's whole
    # scratch), 80 heads (a block's 64 columns span 8 heads' keys)
    (1, 64, 2, 64, 300, True), (5, 64, 2, 64, 300, True), (16, 32, 2, 16, 64, True), (17, 64, 2, 64, 600, True),
    (3, 48, 1, 48, 40, False), (1, 8, 80, 8, 16, True), (1, 128, 2, 128, 512, True)]


@pytest.mark.parametrize("n_rows, n_q, n_kv, hd, n_in, rope, mode",   # each case fp16 and one mode in turn
                         [case + (mode,) for i, case in enumerate(MMA_CASES) for mode in dict.fromkeys(["fp16", MODES[(i + 1) % 5]])
                          if mode != "int4-h" or not case[3] & (case[3] - 1)])    # int4-h: power-of-two heads
def test_a_folded_kv_write_on_tensor_core_rows_gives_the_bits_of_the_linear_then_kv_write(
        kernel_device, mode, n_rows, n_q, n_kv, hd, n_in, rope):
    """linear_mma_int4 with the KV write folded in (the blocks that store a head's columns count
    them, the one that completes a row stores it) against linear_mma then kv_write: the output,
    the pool's bytes and the counters (left zero), bit for bit; and on the harness against the
    twins (twins/linear.py linear_mma, RoPE, the KV store). The store's arithmetic per mode
    is the rows kernels' fold's (kv_store.cuh, every mode above); here each case runs fp16 and
    one mode in turn (int4-h on the 17-row case)."""
    parts, x, rows, rotation, kv, results = fold_and_apart(kernel_device, mode, n_rows * 100 + hd + n_q + n_in,
                                                           n_rows, n_q, n_kv, hd, n_in, rope, mma=True)
    packed = pack_linear(parts, None, np, keep_f16=True)
    assert all(launch.mma_eligible(seg) for seg in packed.segments)
    assert_same_store(*results)
    if not kernel_device.is_gpu:            # (on a GPU the tensor cores add their own way)
        assert_the_twins_store(results[0], twin_linear.linear_mma(x, packed), mode, n_q, n_kv, hd, rows, rotation, kv)


@pytest.mark.parametrize("mma", [False, True])
@pytest.mark.parametrize("mode", ["fp16", "int4-h"])
def test_segments_of_other_kinds_share_the_counters(kernel_device, mode, mma):
    """q, k and v as int8, f16 and int4 parts: three segments, three launches; a head's keys are
    counted in one launch and its values in the next, so the row is stored by the launch that
    completes it. A fused norm rides along (the model's qkv call takes both). mma: the int4
    values on linear_mma, the rest on the rows kernels, one set of counters."""
    rng = np.random.default_rng(8)
    n_kv, hd, n_in = 2, 32, 64
    parts = qkv_parts(rng, 64, n_kv, hd, n_in, kinds=("int8", "f16", "int4"))
    x = (rng.standard_normal((3, n_in)) * 4).astype(np.float32)
    norm = rng.standard_normal(n_in).astype(np.float32)
    rotation = rotations(rng, 3, hd)
    results = []
    for fold in (True, False):
        kv = device_kv(kernel_device, mode, 2, n_kv, 128, hd)
        results.append(run(kernel_device, parts, x, kv, 0, [5, 64, 70], rotation, fold, norm=norm, mma=mma))
    assert_same_store(*results)


@pytest.mark.parametrize("mode", ["fp32", "int4"])
def test_a_fold_through_token_tables_stores_each_parts_rows(kernel_device, mode):
    """Three caches' rows in one call (a batched step): the fold stores each token through its
    own table row, as kv_write with the same TokenTables does."""
    from test_cuda_batch import HEAD_DIM, N_KV
    rng = np.random.default_rng(12)
    sizes, slots, widths = [3, 1, 4], [2, 0, 1], [2, 3, 1]
    token_parts = np.repeat(np.arange(3), sizes)
    rows = np.concatenate([rng.choice(64 * w, n, replace=False) for w, n in zip(widths, sizes)])
    parts = qkv_parts(rng, 32, N_KV, HEAD_DIM, 48)
    x = rng.standard_normal((sum(sizes), 48)).astype(np.float32)
    rotation = rotations(rng, sum(sizes), HEAD_DIM)
    results = []
    for fold in (True, False):
        _, views = shared_pool(kernel_device, mode, widths)
        tables, _ = token_tables(kernel_device, [v.table for v in views], slots, token_parts)
        results.append(run(kernel_device, parts, x, views[0], 0, rows, rotation, fold, tables=tables))
    assert_same_store(*results)


def test_a_fold_is_refused_where_it_cannot_run(kernel_device):
    """Only an exact call with a float32 output and no activation takes a fold, with its key
    and value columns inside the output and a row per output row; the fold itself wants distinct
    key and value columns, enough counters and a head the warp's scratch holds."""
    rng = np.random.default_rng(3)
    parts = qkv_parts(rng, 16, 1, 16, 32)
    packed = pack_linear(parts, None, np, keep_f16=True)
    kv = device_kv(kernel_device, "fp16", 1, 1, 64, 16)
    rows = np.zeros(2, np.int32)
    counters = np.zeros(2, np.uint32)
    fold = kv_launch.kv_fold(kv, 0, rows, 16, 32, counters)
    x, out = np.ones((2, 32), np.float32), np.zeros((2, 48), np.float32)
    cases = [(dict(exact=False), "needs an exact call"),
             (dict(activation="gelu"), "needs an exact call"),
             (dict(out=np.zeros((2, 48), np.float16), activation="gelu"), "needs an exact call"),
             (dict(kv=kv_launch.kv_fold(kv, 0, rows, 16, 40, counters)), "value columns 40..56"),
             (dict(kv=kv_launch.kv_fold(kv, 0, np.zeros(3, np.int32), 16, 32, np.zeros(3, np.uint32))),
              "stores 3 rows")]
    for change, message in cases:
        call = dict(exact=True, activation=None, out=out, kv=fold) | change
        with pytest.raises(ValueError, match=message):
            launch.linear(None, x, packed, call["out"], call["exact"], activation=call["activation"], kv=call["kv"])
    with pytest.raises(ValueError, match="must not overlap"):
        kv_launch.kv_fold(kv, 0, rows, 16, 24, counters)
    with pytest.raises(ValueError, match="counters"):
        kv_launch.kv_fold(kv, 0, rows, 16, 32, np.zeros(1, np.uint32))
    big = device_kv(kernel_device, "fp16", 1, 1, 64, 256)
    with pytest.raises(ValueError, match="head_dim 256"):
        kv_launch.kv_fold(big, 0, rows, 0, 256, counters)


@pytest.mark.parametrize("n_rows, mma", [(1, False), (5, False), (40, False), (1, True), (17, True)])
def test_repeated_folds_leave_the_same_bytes_and_zero_counters(kernel_device, n_rows, mma):
    """The same fold launched again and again on one set of counters (what every layer of every
    step does): each launch stores the bytes the linear then kv_write store, and leaves the
    counters zero for the next. On a GPU, where blocks run at once and a missing fence would
    show as a row stored before all its columns were written, it runs 200 times at doc-407m's
    head shape; on the harness 3 times. mma: on the tensor-core rows."""
    on_gpu = kernel_device.name == "cuda"
    rng = np.random.default_rng(n_rows)
    # on the tensor-core rows a narrow qkv, split in k: 3 splits on one block's parts (1 row),
    # added by the last block (17 rows)
    if mma:
        n_kv, hd, n_in = (2, 128, 2048) if on_gpu else (2, 32, 640)
    else:
        n_kv, hd, n_in = (8, 128, 512) if on_gpu else (2, 32, 64)
    parts = qkv_parts(rng, 4 * n_kv * hd, n_kv, hd, n_in)
    x = rng.standard_normal((n_rows, n_in)).astype(np.float32)
    rows = rng.permutation(128)[:n_rows]
    rotation = rotations(rng, n_rows, hd)
    apart = run(kernel_device, parts, x, device_kv(kernel_device, "int4", 2, n_kv, 128, hd), 1, rows, rotation,
                False, mma=mma)
    path = Scratch(kernel_device).path() if mma else None
    packed = pack_linear(parts, None, SimpleNamespace(asarray=kernel_device.asarray), keep_f16=True)
    kv = device_kv(kernel_device, "int4", 2, n_kv, 128, hd)
    counters = kernel_device.zeros(n_rows * n_kv, np.uint32)
    x_dev, rows_dev = kernel_device.asarray(x), kernel_device.asarray(np.asarray(rows, np.int32))
    rotation_dev = kernel_device.asarray(rotation)
    for repeat in range(200 if on_gpu else 3):
        for side in (kv.keys, kv.values):
            for array in side.values():
                array[...] = 0
        out = kernel_device.zeros((n_rows, packed.out_features), np.float32)
        fold = kv_launch.kv_fold(kv, 1, rows_dev, 4 * n_kv * hd, 5 * n_kv * hd, counters, rotation_dev)
        launch.linear(kernel_device.module("linear"), x_dev, packed, out, True, kv=fold, mma=path)
        assert_same_store((kernel_device.to_host(out), host_sides(kernel_device, kv),
                           kernel_device.to_host(counters)), apart)
