"""The compiled CPU attention (kernels/attention.py) and rotation (kernels/rotation.py):
bit for bit their NumPy oracle (kernels/attention_oracle.py) over random shapes, every KV
mode, windows, ring wrap and draft-tree tails; and row-invariant: a query alone, inside
any batch, through the bulk (prefill) plan, under either thread split, tile size or
thread count, gets the same bits, and a tree node the bits of a sequential decode."""
import numba
import numpy as np
import pytest

from tinyloop.backends.cpu import CpuBackend
from tinyloop.backends.cpu.kernels import attention as kernel
from tinyloop.backends.cpu.kernels import attention_oracle as oracle
from tinyloop.backends.cpu.kernels.lanes import dot16_numpy
from tinyloop.backends.cpu.kernels.rotation import rotate
from tinyloop.backends.cpu.kvstore import KVStorage, PoolStorage, kernel_bits, kv_write
from tinyloop.kv.modes import group_size, hadamard
from tinyloop.model.plan import Geometry, TreeRows, build_plan

pytestmark = pytest.mark.slow      # the compiled kernels against their oracles, at length: -m slow

F = np.float32
MODES = ["fp32", "fp16", "int8", "int4", "int4-h"]


def paged(mode, n_slots, n_kv, rows, head_dim, rng=None):
    """A cache's storage over a pool with spare blocks, its block table shuffled (rng) or in
    order: the kernels must follow the table, wherever it puts a block."""
    blocks = rows // 64
    ids = np.arange(1, n_slots * blocks + 1) if rng is None else rng.permutation(n_slots * blocks + 3)[:n_slots * blocks] + 1
    table = ids.astype(np.int32).reshape(n_slots, blocks)
    return KVStorage(PoolStorage(mode, n_kv, 64 * (n_slots * blocks + 4), head_dim), table)


def filled(mode, n_kv, head_dim, rows, rng, n_slots=2):
    storage = paged(mode, n_slots, n_kv, rows, head_dim, rng)
    for slot in range(n_slots):
        keys = (rng.standard_normal((rows, n_kv, head_dim)) * 1.5).astype(F)
        values = rng.standard_normal((rows, n_kv, head_dim)).astype(F)
        kv_write(storage, slot, np.arange(rows), keys, values)
    return storage


def run(storage, q, slot, positions, window=0, ring_blocks=0, shared_end=kernel.NO_TREE, tail_rows=None,
        scale=0.3, **force):
    return kernel.attend(q, kernel_bits(storage.mode), group_size(storage.head_dim), storage.keys,
                         storage.values, storage.table[slot], positions, window, ring_blocks, shared_end, tail_rows, scale,
                         rotate=storage.mode == "int4-h", **force)


def run_oracle(storage, q, slot, positions, window=0, ring_blocks=0, shared_end=kernel.NO_TREE, tail_rows=None,
               scale=0.3):
    return oracle.attention(storage.mode, q, storage.keys, storage.values, storage.table[slot], positions, window, ring_blocks,
                            shared_end, tail_rows, scale)


def head_dims(mode):
    return [16, 32, 64, 128] if mode == "int4-h" else [8, 16, 32, 48, 64, 128]


# ---------------------------------------------------------------------------- kernel == oracle
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(4))
def test_kernel_equals_oracle_over_random_shapes(mode, seed):
    rng = np.random.default_rng(seed * 17 + MODES.index(mode))
    head_dim = int(rng.choice(head_dims(mode)))
    n_kv, group = int(rng.integers(1, 4)), int(rng.integers(1, 5))
    rows = 64 * int(rng.integers(2, 12))
    storage = filled(mode, n_kv, head_dim, rows, rng)
    n_queries = int(rng.integers(1, 20))
    positions = rng.integers(0, rows, n_queries)
    window = int(rng.choice([0, 0, rng.integers(1, rows)]))
    q = (rng.standard_normal((n_queries, n_kv * group, head_dim)) * 2).astype(F)
    want = run_oracle(storage, q, 1, positions, window)
    for split in (False, True):
        for tile in (1, 3, 16):
            got = run(storage, q, 1, positions, window, split=split, tile=tile)
            assert np.array_equal(got, want), (split, tile)


@pytest.mark.parametrize("mode", MODES)
def test_kernel_equals_oracle_over_a_ring_that_wraps(mode):
    """A ring of 5 blocks, queries far past it (logical blocks wrap onto physical ones)."""
    rng = np.random.default_rng(5)
    storage = filled(mode, 2, 64, 320, rng)
    positions = np.array([1000, 1001, 1063, 1064, 1100])
    q = rng.standard_normal((5, 4, 64)).astype(F)
    want = run_oracle(storage, q, 0, positions, window=200, ring_blocks=5)
    assert np.array_equal(run(storage, q, 0, positions, 200, 5, split=False), want)
    assert np.array_equal(run(storage, q, 0, positions, 200, 5, split=True), want)


def tree_plan(rng, rows, base, n_nodes):
    """A random draft tree after `base`: node i at virtual row base + i, its parent an earlier node."""
    parent = [-1] + [int(rng.integers(0, i)) for i in range(1, n_nodes)]
    depth = [0] * n_nodes
    for i in range(1, n_nodes):
        depth[i] = depth[parent[i]] + 1
    path_rows = np.zeros((n_nodes, max(depth) + 1), np.int64)
    for i in range(n_nodes):
        node = i
        while node >= 0:
            path_rows[i, depth[node]] = base + node
            node = parent[node]
    positions = base + np.array(depth)
    return positions, path_rows, build_plan(positions, base, Geometry(rows, None, 0), True,
                                            TreeRows(base, path_rows))


@pytest.mark.parametrize("mode", MODES)
def test_kernel_equals_oracle_on_a_draft_tree(mode):
    rng = np.random.default_rng(7)
    storage = filled(mode, 3, 64, 512, rng)
    positions, _, plan = tree_plan(rng, 512, 180, 40)
    a = plan.attention
    q = rng.standard_normal((len(positions), 9, 64)).astype(F)
    want = run_oracle(storage, q, 1, positions, 0, 0, a.shared_end, a.tail_rows)
    for split in (False, True):
        assert np.array_equal(run(storage, q, 1, positions, 0, 0, a.shared_end, a.tail_rows, split=split), want)


# ---------------------------------------------------------------------------- row invariance
@pytest.mark.parametrize("mode", MODES)
def test_a_query_gets_the_same_bits_alone_in_any_batch_and_through_the_prefill(mode):
    rng = np.random.default_rng(11)
    storage = filled(mode, 3, 64, 640, rng, n_slots=1)
    backend = CpuBackend()
    geometry = Geometry(640, None, 0)
    n = 300
    q = rng.standard_normal((n, 9, 64)).astype(F)
    positions = np.arange(n) + 37
    bulk = backend.attention(q, storage, 0, build_plan(positions, 37, geometry, exact=False), 0.125)
    exact = backend.attention(q, storage, 0, build_plan(positions, 37, geometry, exact=True), 0.125)
    assert np.array_equal(bulk, exact)
    for i in rng.choice(n, 12, replace=False):
        alone = backend.attention(q[i:i + 1], storage, 0, build_plan(positions[i:i + 1], 37 + i, geometry), 0.125)
        assert np.array_equal(alone[0], bulk[i]), i
    # a shuffled batch of some of the queries, with others beside them
    pick = rng.permutation(n)[:40]
    batch = run(storage, q[pick], 0, positions[pick], scale=0.125)
    assert np.array_equal(batch, bulk[pick])
    for split, tile in ((True, 1), (True, 16), (False, 1), (False, 7)):
        assert np.array_equal(run(storage, q[pick], 0, positions[pick], scale=0.125, split=split, tile=tile),
                              bulk[pick])


@pytest.mark.parametrize("mode", ["fp16", "int4"])
def test_windows_and_ring_prefill_equal_decoding_one_row_at_a_time(mode):
    rng = np.random.default_rng(13)
    rows, window = 384, 150
    storage = filled(mode, 2, 32, rows, rng, n_slots=1)
    geometry = Geometry(rows, rows, window)
    backend = CpuBackend()
    positions = np.arange(700, 900)
    q = rng.standard_normal((200, 6, 32)).astype(F)
    bulk = backend.attention(q, storage, 0, build_plan(positions, 700, geometry, exact=False), 0.2)
    for i in (0, 1, 63, 64, 100, 199):
        alone = backend.attention(q[i:i + 1], storage, 0, build_plan(positions[i:i + 1], 700 + i, geometry), 0.2)
        assert np.array_equal(alone[0], bulk[i]), i


@pytest.mark.parametrize("mode", MODES)
def test_a_tree_node_gets_the_bits_of_a_sequential_decode_of_its_path(mode):
    """Every node of a random tree == one query decoded over a cache holding its path contiguously."""
    rng = np.random.default_rng(17)
    rows, base = 512, 150
    storage = filled(mode, 2, 64, rows, rng, n_slots=1)
    positions, path_rows, plan = tree_plan(rng, rows, base, 30)
    q = rng.standard_normal((len(positions), 4, 64)).astype(F)
    backend = CpuBackend()
    tree = backend.attention(q, storage, 0, plan, 0.25)
    for i in range(len(positions)):
        linear = paged(mode, 1, 2, rows, 64)                        # its table in order: pool row = row + 64
        for side in ("keys", "values"):
            for name, array in getattr(storage, side).items():
                if name == "blocks":
                    continue
                target = getattr(linear, side)[name]
                everything = storage.pool_rows(0, np.arange(rows))
                target[:, linear.pool_rows(0, np.arange(rows))] = array[:, everything]
                path = path_rows[i, :positions[i] - base + 1]
                target[:, linear.pool_rows(0, np.arange(base, positions[i] + 1))] = array[:, storage.pool_rows(0, path)]
        alone = backend.attention(q[i:i + 1], linear, 0, build_plan(positions[i:i + 1], int(positions[i]),
                                                                     Geometry(rows, None, 0)), 0.25)
        assert np.array_equal(alone[0], tree[i]), i


def test_masked_rows_contribute_exactly_nothing_even_when_they_hold_nan():
    rng = np.random.default_rng(19)
    storage = filled("fp32", 2, 64, 256, rng, n_slots=1)
    q = rng.standard_normal((3, 4, 64)).astype(F)
    positions = np.array([70, 100, 130])
    clean = run(storage, q, 0, positions, window=40)
    for name in ("keys", "values"):
        data = getattr(storage, name)["data"]
        data[:, storage.pool_rows(0, np.arange(131, 256))] = np.nan
        data[:, storage.pool_rows(0, np.arange(30))] = np.inf
        unheld = sorted(set(range(data.shape[1] // 64)) - set(storage.table.ravel().tolist()))
        data[:, (np.array(unheld)[:, None] * 64 + np.arange(64)).ravel()] = np.nan   # the null block, the unheld
    assert np.array_equal(run(storage, q, 0, positions, window=40), clean)


def test_thread_count_does_not_change_a_bit():
    rng = np.random.default_rng(23)
    storage = filled("int8", 3, 64, 1024, rng, n_slots=1)
    q = rng.standard_normal((5, 9, 64)).astype(F)
    positions = np.array([1000, 3, 500, 640, 1023])
    before = numba.get_num_threads()
    try:
        results = []
        for threads in sorted({1, before}):
            numba.set_num_threads(threads)
            results += [run(storage, q, 0, positions, split=s) for s in (False, True)]
    finally:
        numba.set_num_threads(before)
    assert all(np.array_equal(r, results[0]) for r in results)


# ---------------------------------------------------------------------------- the pieces
def test_half_to_f32_is_exact_for_every_float16():
    from numba import njit

    @njit
    def widen(bits):
        out = np.empty(bits.shape[0], np.float32)
        for i in range(bits.shape[0]):
            out[i] = kernel.half_to_f32(bits[i])
        return out

    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    want = bits.view(np.float16).astype(F)
    got = widen(bits)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("n", [1, 7, 16, 32, 48, 64, 80, 128, 130])
def test_dot16_at_is_lanes_dot16(n):
    from numba import njit

    @njit
    def dots(a, b, n):
        lane = np.empty(16, np.float32)
        out = np.empty(a.shape[0] // n, np.float32)
        for i in range(out.shape[0]):
            out[i] = kernel.dot16_at(a, i * n, b, i * n, n, lane)
        return out

    rng = np.random.default_rng(n)
    a, b = (rng.standard_normal((20, n)).astype(F) for _ in range(2))
    assert np.array_equal(dots(a.ravel(), b.ravel(), n), dot16_numpy(a, b))


@pytest.mark.parametrize("head_dim", [2, 8, 16, 64, 128])
def test_rotation_kernel_equals_its_oracle_and_the_hadamard_product(head_dim):
    rng = np.random.default_rng(head_dim)
    x = rng.standard_normal((33, 3, head_dim)).astype(F)
    got = rotate(x)
    assert np.array_equal(got, oracle.fwht(x))
    assert np.array_equal(rotate(x[5:6]), got[5:6])
    assert np.allclose(got, x @ hadamard(head_dim), rtol=1e-5, atol=1e-5)
    assert np.allclose(rotate(got), x, rtol=1e-5, atol=1e-5)


def test_warm_up_compiles_without_error():
    kernel.warm_up()


# ---------------------------------------------------------------------------- KV write
# int4-h (Hadamard-rotated) exists only for power-of-two head dims: the pairs exclude (int4-h, 48)
KV_WRITE_CASES = [(mode, head_dim) for mode in MODES for head_dim in (8, 48, 64, 128)
                  if mode != "int4-h" or not head_dim & (head_dim - 1)]


@pytest.mark.parametrize("mode,head_dim", KV_WRITE_CASES)
@pytest.mark.parametrize("n_tokens", [1, 5, 70])
def test_kv_write_kernel_equals_the_numpy_stores(mode, head_dim, n_tokens):
    """kvstore.kv_write (compiled) == store_for(mode).store of the (FWHT-rotated) rows, every byte."""
    from tinyloop.backends.cpu.kvstore import store_for
    rng = np.random.default_rng(head_dim * 100 + n_tokens)
    got, want = (paged(mode, 2, 3, 128, head_dim, np.random.default_rng(5)) for _ in range(2))
    rows = rng.permutation(128)[:n_tokens]
    keys, values = ((rng.standard_normal((n_tokens, 3, head_dim)) * 4).astype(F) for _ in range(2))
    keys[0, 0, :] = 1.5                                       # a constant group: scale 0
    kv_write(got, 1, rows, keys, values)
    for side, x, ones in (("keys", keys, False), ("values", values, True)):
        store_for(mode, ones).store(getattr(want, side), want.pool_rows(1, rows), oracle.fwht(x) if mode == "int4-h" else x)
        for name, array in getattr(want, side).items():
            assert np.array_equal(getattr(got, side)[name].view(np.uint8), array.view(np.uint8)), (side, name)


def test_half_bits_rounds_as_numpy_does():
    from numba import njit

    from tinyloop.backends.cpu.kernels.kv import half_bits

    @njit
    def narrow(x):
        out = np.empty(x.shape[0], np.uint16)
        for i in range(x.shape[0]):
            out[i] = np.uint16(half_bits(x[i]))
        return out

    rng = np.random.default_rng(29)
    every = rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32)
    half_range = rng.integers(0x33000000, 0x47800000, 1 << 20, dtype=np.uint64).astype(np.uint32)
    ties = (np.arange(0x0000, 0x7C00, dtype=np.uint32) << 13) + 0x1000 + 0x38000000   # exact halfway cases
    for bits in (every, half_range, ties, np.array([0, 1 << 31, 0x7F800000, 0xFF800000, 0x477FF000, 0x33000000],
                                                    np.uint32)):
        x = bits.view(F)
        with np.errstate(over="ignore"):
            want = x.astype(np.float16)
        got = narrow(x).view(np.float16)
        finite = ~np.isnan(x)
        assert np.array_equal(got[finite].view(np.uint16), want[finite].view(np.uint16))
        assert np.all(np.isnan(got[~finite]))


def test_the_fp16_mode_stores_half_bits_in_two_bytes_a_value():
    """fp16 keeps IEEE half bits (uint16), half the NumPy backend's float32 arrays of half values,
    and the bytes per row the pool sizes caches by say so."""
    from tinyloop.backends.reference.kvstore import bytes_per_row as numpy_bytes_per_row
    from tinyloop.backends.cpu.kvstore import bytes_per_row
    rng = np.random.default_rng(31)
    storage = paged("fp16", 1, 2, 128, 64)
    x = rng.standard_normal((3, 2, 64)).astype(F)
    kv_write(storage, 0, np.array([5, 9, 100]), x, -x)
    assert storage.keys["data"].dtype == np.uint16 and storage.values["data"].shape == (2, 64 * 6, 64)
    assert np.array_equal(storage.keys["data"][:, storage.pool_rows(0, [5, 9, 100])].transpose(1, 0, 2),
                          x.astype(np.float16).view(np.uint16))
    assert bytes_per_row("fp16", 2, 64) == 2 * 2 * 64 * 2
    assert numpy_bytes_per_row("fp16", 2, 64) > 2 * bytes_per_row("fp16", 2, 64) - 64
    assert CpuBackend().kv_bytes_per_row("fp16", 2, 64) == bytes_per_row("fp16", 2, 64)


@pytest.mark.parametrize("mode", MODES)
def test_several_caches_in_one_call_give_each_query_its_bits_alone(mode):
    """attend_many over three caches' queries (a decode row, a window over a ring, a draft tree)
    in one pool == attend over each cache alone, bit for bit, whatever the split and tile."""
    rng = np.random.default_rng(41 + MODES.index(mode))
    n_kv, head_dim, rows = 2, 32, 320
    pool = PoolStorage(mode, n_kv, 64 * 16, head_dim)
    ids = rng.permutation(15) + 1
    caches = [KVStorage(pool, ids[5 * i:5 * i + 5].astype(np.int32)[None]) for i in range(3)]
    for cache in caches:
        keys, values = (rng.standard_normal((rows, n_kv, head_dim)).astype(F) for _ in range(2))
        kv_write(cache, 0, np.arange(rows), keys, values)
    positions, path_rows, plan = tree_plan(rng, rows, 150, 12)
    contexts = [kernel.Context(np.array([200]), cache_rows=rows),
                kernel.Context(np.arange(230, 250), window=70, ring_blocks=5, cache_rows=rows),
                kernel.Context(positions, shared_end=plan.attention.shared_end, tail_rows=plan.attention.tail_rows,
                               cache_rows=rows)]
    q = rng.standard_normal((sum(len(c.positions) for c in contexts), 4, head_dim)).astype(F)
    bits, group_len, rotate = kernel_bits(mode), group_size(head_dim), mode == "int4-h"
    alone, start = [], 0
    for cache, c in zip(caches, contexts):
        n = len(c.positions)
        alone.append(kernel.attend(q[start:start + n], bits, group_len, pool.keys, pool.values, cache.table[0],
                                   c.positions, c.window, c.ring_blocks, c.shared_end, c.tail_rows, 0.3, rotate))
        start += n
    alone = np.concatenate(alone)
    for split in (False, True):
        for tile in (1, 4, 16):
            together = kernel.attend_many(q, bits, group_len, pool.keys, pool.values, contexts,
                                          [c.table[0] for c in caches], 0.3, rotate, split=split, tile=tile)
            assert np.array_equal(together, alone), (split, tile)
