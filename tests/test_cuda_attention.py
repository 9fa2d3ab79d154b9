"""cuda/attention.cu through its launcher on the kernel_device fixture: bit for bit the twin
(every mode, head dims 16..128, GQA, decode / verify / 65 queries, windows over a ring
seam, a 65-node draft tree), within 1e-5 of the CPU backend's attention over the same
stored cache, row-invariant (a query alone gets the bits it gets in any batch), and a
tree node gets the bits of a plain decode of its path laid out contiguously.

Split context (cuda/README.md "Attention: split context"): contexts over many chunks of
CHUNK_BLOCKS blocks, windows starting mid-chunk, a ring seam inside a chunk, 4k keys, a
tree whose tail crosses a chunk edge; the bits do not depend on the grid's chunk count,
on how the launcher groups queries into launches, or on the scratch it is given."""
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from test_cuda_kv import F

from tinyloop.backends.reference import NumpyBackend
from tinyloop.backends.reference.twins import attention as twin
from tinyloop.backends.reference.twins import kv as twin_kv
from tinyloop.backends.cuda.launch import attention as launch
from tinyloop.backends.cuda.launch.kv import DeviceKV, DeviceView
from tinyloop.model.plan import Geometry, TreeRows, build_plan

MODES = ["fp16", "fp32", "int8", "int4", "int4-h"]
ATT_OPTIONS: tuple = ()    # compile options of the attention module kernel() launches


@pytest.fixture(params=[None, 4], ids=["S-shipped", "S4"])
def chunk_blocks(request, monkeypatch):
    """A chunk-edge test at the shipped S (ATT_CHUNK_BLOCKS) and at S = 4: several 64-key blocks
    a chunk (the online softmax across a chunk's blocks, a window start or a ring seam inside a
    chunk), the kernel compiled with -DATT_CHUNK_BLOCKS=4 and the twin and launcher set to match.
    -> S."""
    if request.param is None:
        return twin.CHUNK_BLOCKS
    monkeypatch.setattr(twin, "CHUNK_BLOCKS", request.param)
    monkeypatch.setattr(launch, "CHUNK_BLOCKS", request.param)
    monkeypatch.setattr(sys.modules[__name__], "ATT_OPTIONS", (f"-DATT_CHUNK_BLOCKS={request.param}",))
    return request.param


def host_cache(mode, n_kv, head_dim, rows, seed, n_slots=2):
    """A cache's storage in the device layout on the host: a pool with spare blocks (NaN in the
    float ones, 0xFF bytes in the codes: never read) seen through a shuffled block table,
    every row of every slot holding random keys and values stored by the kv twin (the kv
    kernels equal it: test_cuda_kv.py)."""
    rng = np.random.default_rng(seed)
    blocks = rows // 64
    table = (rng.permutation(n_slots * blocks + 3)[:n_slots * blocks] + 1).astype(np.int32).reshape(n_slots, blocks)
    pool = DeviceKV.allocate(mode, n_kv, 64 * (table.size + 4), head_dim)
    for array in pool.arrays():
        array.view(np.uint8)[...] = 0xFF
    kv = DeviceView(pool, table, table.copy(), lambda buffer, values: np.copyto(buffer, values))
    for slot in range(n_slots):
        keys, values = (rng.standard_normal((2, rows, n_kv, head_dim)) * [[[[1.5]]], [[[1.0]]]]).astype(F)
        twin_kv.kv_write(mode, kv.keys, kv.values, kv.table[slot], np.arange(rows), keys, values)
    return kv


def on_device(device, kv):
    pool = DeviceKV(kv.mode, kv.n_kv, kv.pool.rows, kv.head_dim,
                    *({n: device.asarray(a) for n, a in side.items()} for side in (kv.keys, kv.values)))

    def upload(buffer, values):
        buffer[...] = device.asarray(np.asarray(values, np.int32))
    return DeviceView(pool, kv.table, device.zeros(kv.table.shape, np.int32), upload)


def kernel(device, kv_dev, q, slot, positions, window=0, ring_blocks=0, shared_end=twin.NO_TREE,
           tail_rows=None, scale=0.125, scratch=None, fused=True, rotation=None, q_out=None):
    """The launcher with q as a column view of a wider array (a token stride that is not H hd).
    fused: pass 1 merges (the counters the backend passes; they must come back zero), else
    the two launches. rotation: RoPE rows to apply to q inside (q_out, a list, receives q as
    the launch left it)."""
    n_queries, n_heads, head_dim = q.shape
    wide = np.zeros((n_queries, n_heads * head_dim + 7), F)
    wide[:, 3:3 + n_heads * head_dim] = q.reshape(n_queries, -1)
    q_dev = device.asarray(wide)[:, 3:3 + n_heads * head_dim].reshape(q.shape)
    out = device.zeros(q.shape, F)
    tail_dev = None if tail_rows is None else device.asarray(np.ascontiguousarray(tail_rows, np.int32))
    tail_len = 0 if tail_rows is None else tail_rows.shape[1]
    chunks = launch.max_chunks(kv_dev.rows, window, ring_blocks, shared_end, tail_len)     # the cache's rows
    counters = device.zeros(max(1, n_queries * kv_dev.n_kv), np.uint32) if fused else None
    launch.attention(device.module("attention", ATT_OPTIONS), kv_dev, q_dev, slot, device.asarray(np.asarray(positions, np.int32)),
                     window, ring_blocks, device.asarray(np.array([shared_end], np.int32)), tail_dev, tail_len,
                     scale, out, chunks=chunks, **({} if scratch is None else {"scratch": scratch}),
                     counters=counters, rotation=None if rotation is None else device.asarray(rotation))
    if q_out is not None:
        q_out.append(device.to_host(q_dev))
    if fused:
        assert not device.to_host(counters).any(), "the fused merge left a counter set"
    return device.to_host(out)


def cpu_attention(kv, q, slot, plan, scale):
    """The NumPy reference backend's attention over the very same stored values and table."""
    cpu = NumpyBackend()
    storage = cpu.kv_view(cpu.kv_pool(kv.mode, kv.n_kv, kv.pool.rows, kv.head_dim), kv.table)
    cpu.kv_init_blocks(storage.pool, kv.table.ravel())           # as the pool does when it hands blocks out
    for mine, theirs in ((kv.keys, storage.keys), (kv.values, storage.values)):
        for name, array in mine.items():
            theirs[name][..., :array.shape[-1]] = array
    return cpu.attention(q, storage, slot, plan, scale)


def pool_rows(kv, slot, rows):
    rows = np.asarray(rows, np.int64)
    return kv.table[slot, rows // 64].astype(np.int64) * 64 + rows % 64


def bits_equal(a, b) -> bool:
    """The same bits, a NaN matching a NaN at the same place whatever its payload (a GPU gives
    the canonical 0x7fffffff where x86 and NumPy give 0xffc00000, as an H200 showed)."""
    a, b = np.asarray(a, F), np.asarray(b, F)
    nan = np.isnan(a)
    if a.shape != b.shape or not np.array_equal(nan, np.isnan(b)):
        return False
    return np.array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32))


CASES = [  # (head_dim, n_kv, group, n_queries, last position): several 64-key blocks each; the
    # tiles' stride (att_tile_stride) hd + 4 (64, 128, 16, 48), hd (20: 4 times an odd number), or
    # odd where hd is not a multiple of 4 (10: the sums a column at a time)
    (64, 1, 4, 1, 250), (128, 2, 2, 16, 200), (16, 4, 1, 65, 255), (48, 2, 3, 16, 140), (20, 2, 2, 16, 200),
    (10, 1, 3, 5, 130)]


@pytest.mark.parametrize("mode, head_dim, n_kv, group, n_queries, last",
                         [(mode, *case) for mode in MODES for case in CASES
                          if not (mode == "int4-h" and case[0] & (case[0] - 1))])   # int4-h: power-of-two hd
def test_attention_equals_twin_and_approximates_cpu(kernel_device, mode, head_dim, n_kv, group, n_queries, last):
    rows = 256
    kv = host_cache(mode, n_kv, head_dim, rows, seed=head_dim + n_queries)
    rng = np.random.default_rng(head_dim * n_queries)
    q = rng.standard_normal((n_queries, n_kv * group, head_dim)).astype(F)
    positions = np.arange(last - n_queries + 1, last + 1)
    scale = 1 / np.sqrt(head_dim)
    got = kernel(kernel_device, on_device(kernel_device, kv), q, 1, positions, scale=scale)
    assert bits_equal(got, twin.attention(mode, q, kv.keys, kv.values, kv.table[1], positions, scale=scale))
    plan = build_plan(positions, int(positions[0]), Geometry(rows, None, 0))
    np.testing.assert_allclose(got, cpu_attention(kv, q, 1, plan, scale), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode, leaves", [("fp16", 4), ("fp32", 4), ("int8", 4), ("int4", 8), ("int4-h", 8),
                                         ("fp16", 16), ("int4", 16)])
def test_the_value_trees_leaves_change_no_bit(kernel_device, monkeypatch, mode, leaves):
    """att_tree64 sums a 64-key block's values as trees of AttTreeLeaves keys (8, or 4 for the
    int4 caches) in nested loops of two halves (each loop's sum from -0); any leaf count is the
    same adjacent pairwise tree, so the kernel compiled with -DATT_TREE_LEAVES (every mode at
    that count) gives the shipped kernel's bits, the twin's: 16 queries over 4 blocks (the
    masked passes of their last block, the whole blocks before), a query alone at a block's
    last key (whole blocks only), and 16 queries under a 100-key window (masked at both ends:
    keys below the window in a tree past the block's first). On the CPU harness only: the tree
    is the source's, and on a GPU each leaf count is another NVRTC build of attention.cu
    (about 45 s here), three more than gpu_check.sh's 80-second kernels stage can hold."""
    if kernel_device.name == "cuda":
        pytest.skip("the tree's order is the source's, checked on the harness; a GPU build a leaf count")
    kv = host_cache(mode, 2, 32, 256, seed=leaves)
    rng = np.random.default_rng(leaves + 1)
    for n_queries, last, window in ((16, 200, 0), (1, 191, 0), (16, 220, 100)):
        q = rng.standard_normal((n_queries, 4, 32)).astype(F)
        positions = np.arange(last - n_queries + 1, last + 1)
        shipped = kernel(kernel_device, on_device(kernel_device, kv), q, 1, positions, window)
        monkeypatch.setattr(sys.modules[__name__], "ATT_OPTIONS", (f"-DATT_TREE_LEAVES={leaves}",))
        other = kernel(kernel_device, on_device(kernel_device, kv), q, 1, positions, window)
        monkeypatch.setattr(sys.modules[__name__], "ATT_OPTIONS", ())
        assert bits_equal(other, shipped)
        assert bits_equal(shipped, twin.attention(mode, q, kv.keys, kv.values, kv.table[1], positions, window, 0,
                                                  scale=0.125))


@pytest.mark.parametrize("mode", ["fp16", "int8", "int4-h"])
def test_window_across_the_ring_seam(kernel_device, mode):
    """A 256-row ring (4 blocks), window 100: queries at 300..315 read logical 201..315,
    stored at physical rows 201..255 then 0..59."""
    rows, window = 256, 100
    kv = host_cache(mode, 2, 32, rows, seed=7)
    q = np.random.default_rng(8).standard_normal((16, 4, 32)).astype(F)
    positions = np.arange(300, 316)
    got = kernel(kernel_device, on_device(kernel_device, kv), q, 0, positions, window, rows // 64)
    assert bits_equal(got, twin.attention(mode, q, kv.keys, kv.values, kv.table[0], positions, window, rows // 64,
                                          scale=0.125))
    plan = build_plan(positions, 300, Geometry(rows, rows, window))
    np.testing.assert_allclose(got, cpu_attention(kv, q, 0, plan, 0.125), rtol=1e-5, atol=1e-5)


def random_tree(rng, n_nodes, base):
    """A random tree in BFS order at virtual rows base + i: (path_rows (T, depth + 1), paths, positions)."""
    parents = [-1] + [int(rng.integers(max(0, i - 8), i)) for i in range(1, n_nodes)]   # deep enough to cross a block
    depth = [0] * n_nodes
    for i in range(1, n_nodes):
        depth[i] = depth[parents[i]] + 1
    paths = []
    for node in range(n_nodes):
        path, u = [], node
        while u != -1:
            path.append(base + u)
            u = parents[u]
        paths.append(path[::-1])
    path_rows = np.zeros((n_nodes, max(depth) + 1), np.int64)
    for i, path in enumerate(paths):
        path_rows[i, :len(path)] = path
    return path_rows, paths, np.array([base + len(p) - 1 for p in paths])


@pytest.mark.parametrize("mode, rows, base", [("fp32", 320, 180), ("int4", 320, 180), ("int4-h", 320, 180),
                                              ("fp16", 1152, 1020), ("int4-h", 1152, 1020)])
def test_tree_of_65_nodes(kernel_device, mode, rows, base, chunk_blocks):
    """The plan's tail rows (build_plan with TreeRows): kernel == twin, ~ CPU, and nodes equal
    a plain decode of their path laid out at rows base.. (bit for bit, kernel against kernel).
    base 1020 at S = 4: the shared blocks span chunks 0..3 and the tail (blocks 15, 16) crosses
    from chunk 3 into chunk 4 (at S = 1 every block is a chunk)."""
    head_dim = 32
    rng = np.random.default_rng(65)
    path_rows, paths, positions = random_tree(rng, 65, base)
    assert positions.max() // 64 > base // 64                  # paths cross into the next block
    kv = host_cache(mode, 2, head_dim, rows, seed=9)
    q = rng.standard_normal((65, 4, head_dim)).astype(F)
    plan = build_plan(positions, base, Geometry(rows, None, 0), tree=TreeRows(base, path_rows))
    a = plan.attention
    assert a.n_tail and a.tail_rows.shape == (65, a.n_tail * 64)
    got = kernel(kernel_device, on_device(kernel_device, kv), q, 1, positions, 0, 0, a.shared_end, a.tail_rows)
    assert bits_equal(got, twin.attention(mode, q, kv.keys, kv.values, kv.table[1], positions, 0, 0, a.shared_end,
                                          a.tail_rows, 0.125))
    np.testing.assert_allclose(got, cpu_attention(kv, q, 1, plan, 0.125), rtol=1e-5, atol=1e-5)

    deepest = int(np.argmax(positions))
    for node in sorted({0, 1, 33, 64, deepest}):
        path = paths[node]
        plain_pool = DeviceKV(kv.mode, kv.n_kv, kv.pool.rows, kv.head_dim,
                              *({n: x.copy() for n, x in side.items()} for side in (kv.keys, kv.values)))
        plain = DeviceView(plain_pool, kv.table, kv.table.copy(), lambda buffer, values: np.copyto(buffer, values))
        for array in plain_pool.arrays():
            for slot in range(kv.n_slots):
                array[:, pool_rows(kv, slot, np.arange(base, base + len(path)))] = array[:, pool_rows(kv, slot, path)]
        alone = kernel(kernel_device, on_device(kernel_device, plain), q[node:node + 1], 1, positions[node:node + 1])
        assert bits_equal(alone, got[node:node + 1]), f"node {node}"


@pytest.mark.parametrize("mode", ["fp32", "int4-h"])
def test_each_query_alone_gets_its_batch_bits(kernel_device, mode):
    """Row invariance: queries at scattered positions (0, block edges, far apart), with and
    without a window; each alone equals its row of the batch."""
    rows = 448
    kv = host_cache(mode, 2, 64, rows, seed=11)
    kv_dev = on_device(kernel_device, kv)
    rng = np.random.default_rng(12)
    positions = np.array([0, 63, 64, 440, 200, 1, 127, 128, 300, 5, 399, 255])
    q = rng.standard_normal((len(positions), 4, 64)).astype(F)
    for window in (0, 70):
        batch = kernel(kernel_device, kv_dev, q, 0, positions, window)
        assert bits_equal(batch, twin.attention(mode, q, kv.keys, kv.values, kv.table[0], positions, window, scale=0.125))
        for i in range(len(positions)):
            alone = kernel(kernel_device, kv_dev, q[i:i + 1], 0, positions[i:i + 1], window)
            assert bits_equal(alone, batch[i:i + 1]), (window, i)


def test_group_of_16_over_48k_shared(kernel_device):
    """G = 16 query heads per kv head at hd 128 needs 53.8 KB of shared memory (the launcher
    opts in past 48 KB on a GPU)."""
    assert launch.shared_bytes(16, 128) > 48 * 1024
    kv = host_cache("int8", 1, 128, 128, seed=13, n_slots=1)
    q = np.random.default_rng(14).standard_normal((2, 16, 128)).astype(F)
    positions = np.array([70, 100])
    got = kernel(kernel_device, on_device(kernel_device, kv), q, 0, positions)
    assert bits_equal(got, twin.attention("int8", q, kv.keys, kv.values, kv.table[0], positions, scale=0.125))


@pytest.mark.parametrize("mode", ["fp16", "int4"])
def test_long_context(kernel_device, mode):
    """4000 keys (63 blocks) for one decode query: nothing in shared memory grows with context."""
    rows = 4032
    kv = host_cache(mode, 1, 64, rows, seed=15, n_slots=1)
    q = np.random.default_rng(16).standard_normal((2, 2, 64)).astype(F)
    positions = np.array([3999, 4020])
    got = kernel(kernel_device, on_device(kernel_device, kv), q, 0, positions)
    assert bits_equal(got, twin.attention(mode, q, kv.keys, kv.values, kv.table[0], positions, scale=0.125))
    plan = build_plan(positions, 3999, Geometry(rows, None, 0))
    np.testing.assert_allclose(got, cpu_attention(kv, q, 0, plan, 0.125), rtol=1e-5, atol=1e-5)


# -- split context -----------------------------------------------------------------------------
def test_the_launchers_tile_stride_is_the_kernels(tmp_path):
    """launch/attention.py tile_stride sizes the dynamic shared memory and cuda/attention.cu
    att_tile_stride lays the tiles out in it: the kernel's function, compiled by the host
    compiler, equals the launcher's for every head size to 300 (a kernel stride past the
    launcher's would run past the shared memory, which the harness does not bound). And the
    rule's reasons: at least hd; where hd is a multiple of 4 a multiple of 4 too (16-byte loads)
    whose 8 consecutive rows (a quarter-warp's 16-byte loads) start in 8 distinct groups of 4
    banks; else odd (32 rows of a column in 32 banks)."""
    import subprocess
    from cudasim.build import CXX
    source = (Path(__file__).resolve().parents[1] / "cuda" / "attention.cu").read_text()
    body = re.search(r"__device__ __forceinline__ int att_tile_stride\(int hd\) (\{.*?\})\n", source).group(1)
    program = tmp_path / "stride.cpp"
    program.write_text("#include <cstdio>\nint att_tile_stride(int hd) " + body +
                       "\nint main() { for (int hd = 1; hd <= 300; ++hd) std::printf(\"%d\\n\", att_tile_stride(hd)); }\n")
    subprocess.run([CXX, "-o", str(tmp_path / "stride"), str(program)], check=True)
    kernel_strides = [int(v) for v in subprocess.run([str(tmp_path / "stride")], check=True, capture_output=True,
                                                     text=True).stdout.split()]
    assert kernel_strides == [launch.tile_stride(hd) for hd in range(1, 301)]
    for hd in range(1, 301):
        stride = launch.tile_stride(hd)
        assert stride >= hd
        if hd % 4:
            assert stride % 2 == 1
        else:
            assert stride % 4 == 0 and len({(r * stride) % 32 // 4 for r in range(8)}) == 8


def test_chunk_size_is_one_constant():
    """The kernel's ATT_CHUNK_BLOCKS, the twin's and the launcher's CHUNK_BLOCKS agree."""
    source = (Path(__file__).resolve().parents[1] / "cuda" / "attention.cu").read_text()
    defined = int(re.search(r"#define ATT_CHUNK_BLOCKS (\d+)", source).group(1))
    assert defined == twin.CHUNK_BLOCKS == launch.CHUNK_BLOCKS


def test_the_launchers_threads_are_the_kernels_bound():
    """The pass-1 kernels are declared __launch_bounds__(ATT_THREADS, ATT_MIN_BLOCKS) (4 on
    sm_80 .. sm_90: 128 registers, 4 blocks an SM); a launch of more threads than ATT_THREADS
    fails on a GPU, so the launcher's block is the kernel's bound."""
    source = (Path(__file__).resolve().parents[1] / "cuda" / "attention.cu").read_text()
    assert int(re.search(r"#define ATT_THREADS (\d+)", source).group(1)) == launch.ATT_THREADS
    assert re.search(r"#else\n#define ATT_MIN_BLOCKS 4\n#endif", source)
    bounded = re.findall(r"__global__ void __launch_bounds__\(ATT_THREADS, ATT_MIN_BLOCKS\) (attention_\w+)\(", source)
    assert sorted(bounded) == sorted(f"attention_{m.replace('-', '')}" for m in MODES)


def own_chunks(pos, window, S):
    lowest = max(pos - window + 1, 0) if window else 0
    return (pos // 64) // S - (lowest // 64) // S + 1


def test_max_chunks_bounds_every_query(chunk_blocks):
    """max_chunks is an upper bound every position can meet, and is attained (tight)."""
    S = chunk_blocks
    for rows in (64, 256, 448, 4032, 4096):
        worst = max(own_chunks(pos, 0, S) for pos in range(rows))
        assert launch.max_chunks(rows, 0, 0) == worst, rows
    for window in (1, 63, 64, 65, 100, 255, 256, 257, 300, 1000, 1100):
        worst = max(own_chunks(pos, window, S) for pos in range(3 * window + 2048))
        assert launch.max_chunks(1 << 20, window, 0) == worst, window        # no ring: rows do not bind
        assert launch.max_chunks(1 << 20, window, 8) == worst, window        # a ring: only the window binds
    assert launch.max_chunks(448, 1000, 0) == launch.max_chunks(448, 0, 0)    # the smaller bound wins
    assert launch.max_chunks(256, 0, 0, shared_end=4, tail_len=128) == (5 // S) + 1     # a tree tail past the rows
    with pytest.raises(ValueError):
        launch.max_chunks(256, 0, 4)


@pytest.mark.parametrize("mode", ["fp32", "int8", "int4-h"])
def test_many_chunks_row_invariant(kernel_device, mode, chunk_blocks):
    """Queries on both sides of chunk edges (at S = 4: 255 | 256, 511 | 512, 767 | 768), at
    block edges and far apart, with no window, a window starting mid-chunk (and mid-block) and
    one shorter than a chunk: == twin, ~ CPU, and each query alone == its row of the batch."""
    rows = 1024
    kv = host_cache(mode, 2, 32, rows, seed=21, n_slots=1)
    kv_dev = on_device(kernel_device, kv)
    positions = np.array([255, 256, 0, 511, 512, 1000, 767, 768, 63, 300, 1023, 700])
    q = np.random.default_rng(22).standard_normal((len(positions), 6, 32)).astype(F)
    for window in (0, 300, 200):              # 700 - 300 + 1 = 401: block 6, chunk 1, mid-block too
        batch = kernel(kernel_device, kv_dev, q, 0, positions, window)
        assert bits_equal(batch, twin.attention(mode, q, kv.keys, kv.values, kv.table[0], positions, window, scale=0.125))
        plan = build_plan(positions, 0, Geometry(rows, None, window))
        np.testing.assert_allclose(batch, cpu_attention(kv, q, 0, plan, 0.125), rtol=1e-5, atol=1e-5)
        for i in range(len(positions)):
            alone = kernel(kernel_device, kv_dev, q[i:i + 1], 0, positions[i:i + 1], window)
            assert bits_equal(alone, batch[i:i + 1]), (window, i)


@pytest.mark.parametrize("chunk_blocks", [4], indirect=True)     # a chunk of one block has no inside
@pytest.mark.parametrize("mode", ["fp16", "int4-h"])
def test_ring_seam_inside_a_chunk(kernel_device, mode, chunk_blocks):
    """A 320-row ring (5 blocks), window 300: queries at 500..515 read logical 201..515,
    blocks 3..8 = chunks 0 | 1 (4..7) | 2; the seam (logical block 5 at physical block 0)
    lies inside chunk 1. == twin, ~ CPU, each query alone == its batch row."""
    rows, window = 320, 300
    kv = host_cache(mode, 2, 32, rows, seed=23, n_slots=1)
    kv_dev = on_device(kernel_device, kv)
    q = np.random.default_rng(24).standard_normal((16, 4, 32)).astype(F)
    positions = np.arange(500, 516)
    seam, S = rows // 64, chunk_blocks                  # logical block 5 is stored at physical block 0
    assert 3 // S < seam // S < 8 // S and seam % S     # chunk 1, not its first block: inside the chunk
    batch = kernel(kernel_device, kv_dev, q, 0, positions, window, rows // 64)
    assert bits_equal(batch, twin.attention(mode, q, kv.keys, kv.values, kv.table[0], positions, window, rows // 64,
                                            scale=0.125))
    plan = build_plan(positions, 500, Geometry(rows, rows, window))
    np.testing.assert_allclose(batch, cpu_attention(kv, q, 0, plan, 0.125), rtol=1e-5, atol=1e-5)
    for i in (0, 7, 15):
        alone = kernel(kernel_device, kv_dev, q[i:i + 1], 0, positions[i:i + 1], window, rows // 64)
        assert bits_equal(alone, batch[i:i + 1]), i


@pytest.mark.parametrize("mode", ["fp16", "int8"])
def test_4k_context_decode_and_batch(kernel_device, mode, chunk_blocks):
    """4096 keys (64 blocks: 64 chunks at S = 1, 16 at S = 4): decode at the end of the cache and at chunk and block
    edges, with GQA over 2 kv heads; batch == twin, each alone == its batch row, ~ CPU."""
    rows = 4096
    kv = host_cache(mode, 2, 64, rows, seed=25, n_slots=1)
    kv_dev = on_device(kernel_device, kv)
    positions = np.array([4095, 1023, 1024, 2047, 3000, 4032])
    q = np.random.default_rng(26).standard_normal((len(positions), 6, 64)).astype(F)
    batch = kernel(kernel_device, kv_dev, q, 0, positions)
    assert bits_equal(batch, twin.attention(mode, q, kv.keys, kv.values, kv.table[0], positions, scale=0.125))
    plan = build_plan(positions, 0, Geometry(rows, None, 0))
    np.testing.assert_allclose(batch, cpu_attention(kv, q, 0, plan, 0.125), rtol=1e-5, atol=1e-5)
    for i in range(len(positions)):
        alone = kernel(kernel_device, kv_dev, q[i:i + 1], 0, positions[i:i + 1])
        assert bits_equal(alone, batch[i:i + 1]), i


def test_bits_do_not_depend_on_the_grid_or_the_scratch(kernel_device, monkeypatch, chunk_blocks):
    """The same queries with more chunks in the grid than any query has, with a scratch that
    holds 3 queries (6 launches for 16), and with a default allocation capped at one query:
    every bit equal. A scratch under one query's partials is refused."""
    rows = 512
    kv = host_cache("int4", 2, 32, rows, seed=27, n_slots=1)
    kv_dev = on_device(kernel_device, kv)
    positions = np.concatenate([np.arange(250, 262), [0, 511, 256, 63]])
    q = np.random.default_rng(28).standard_normal((16, 4, 32)).astype(F)
    want = kernel(kernel_device, kv_dev, q, 0, positions, 100)
    assert bits_equal(want, twin.attention("int4", q, kv.keys, kv.values, kv.table[0], positions, 100, scale=0.125))
    per_query = launch.partial_floats(4, 32, launch.max_chunks(rows, 100, 0))
    scratch = kernel_device.zeros((3 * per_query + 5,), F)
    assert bits_equal(kernel(kernel_device, kv_dev, q, 0, positions, 100, scratch=scratch), want)
    with pytest.raises(ValueError):
        kernel(kernel_device, kv_dev, q, 0, positions, 100, scratch=kernel_device.zeros((per_query - 1,), F))
    real = launch.max_chunks
    monkeypatch.setattr(launch, "max_chunks", lambda *args, **kw: real(*args, **kw) + 5)
    assert bits_equal(kernel(kernel_device, kv_dev, q, 0, positions, 100), want)
    monkeypatch.setattr(launch, "max_chunks", real)
    monkeypatch.setattr(launch, "SCRATCH_BUDGET", 4 * per_query)
    assert bits_equal(kernel(kernel_device, kv_dev, q, 0, positions, 100), want)


def test_more_chunks_than_the_grid_gives_nan(kernel_device, monkeypatch, chunk_blocks):
    """A query spanning more chunks than the launch was sized for gets NaN (never a read past
    its partials); the others are untouched."""
    rows = 512
    kv = host_cache("fp32", 1, 16, rows, seed=29, n_slots=1)
    kv_dev = on_device(kernel_device, kv)
    positions = np.array([30, 100, 50]) * chunk_blocks   # chunks: 1, 2, 1
    q = np.random.default_rng(30).standard_normal((3, 2, 16)).astype(F)
    want = twin.attention("fp32", q, kv.keys, kv.values, kv.table[0], positions, scale=0.125)
    monkeypatch.setattr(launch, "max_chunks", lambda *args, **kw: 1)
    got = kernel(kernel_device, kv_dev, q, 0, positions)
    assert np.isnan(got[1]).all()
    assert bits_equal(got[[0, 2]], want[[0, 2]])


def test_an_empty_chunk_is_skipped_in_the_merge(kernel_device, chunk_blocks):
    """Head 0's scores over keys 0..255 (chunk 0 at S = 4, chunks 0..3 at S = 1) overflow to
    -inf: those chunks are empty (m = -inf) and the merge must skip them, not take
    exp(-inf - -inf) = NaN. == twin, finite, and alone == in a batch."""
    rows = 640
    kv = host_cache("fp32", 2, 16, rows, seed=31, n_slots=1)
    kv.keys["data"][0, pool_rows(kv, 0, np.arange(4 * 64)), 0] = -1e20
    kv_dev = on_device(kernel_device, kv)
    positions = np.array([600, 300, 255])               # chunks 0..2, 0..1, and chunk 0 alone
    q = np.random.default_rng(32).standard_normal((3, 4, 16)).astype(F)
    q[:, 0] = 1e20                                      # head 0 of kv head 0: q . k = -inf over chunk 0
    batch = kernel(kernel_device, kv_dev, q, 0, positions)
    assert bits_equal(batch, twin.attention("fp32", q, kv.keys, kv.values, kv.table[0], positions, scale=0.125))
    assert np.isfinite(batch[:2]).all() and np.isnan(batch[2, 0]).all()     # 255: no key at all (0 / 0)
    for i in range(3):
        assert bits_equal(kernel(kernel_device, kv_dev, q[i:i + 1], 0, positions[i:i + 1]), batch[i:i + 1])


@pytest.mark.parametrize("tiles", [2, 1])
@pytest.mark.parametrize("mode", MODES)
def test_both_loaders_give_the_twins_bits(kernel_device, mode, tiles, monkeypatch):
    """att_stage's 16-byte loader (rows whose bytes are a multiple of 16 in aligned arrays) and
    the element loader it falls back to give the same tiles: each path, forced, equals the
    twin bit for bit, across a window starting mid-block and a tree tail (per-row pool rows).
    tiles = 1: a device whose shared memory cannot hold keys and values together (the values
    replace the keys after the scores), the same bits."""
    if tiles == 1:      # just under two tiles for one query: the launcher falls back to one
        monkeypatch.setattr(launch, "device_shared_limit", lambda out: launch.shared_bytes(2, 64, 1, 2) - 4)
        assert launch.layout(6, 2, 64, 0, 0, launch.device_shared_limit(None))[1] == 1
    head_dim, rows, base = 64, 256, 150
    kv = host_cache(mode, 2, head_dim, rows, seed=21)
    kv_dev = on_device(kernel_device, kv)
    assert launch.vector_loads(kv_dev)                       # the fast path is the one under test
    rng = np.random.default_rng(22)
    n_nodes = 6
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n_nodes)]
    depth = [0] * n_nodes
    for i in range(1, n_nodes):
        depth[i] = depth[parents[i]] + 1
    positions = np.array([base + d for d in depth])
    path_rows = np.zeros((n_nodes, n_nodes), np.int64)
    for i in range(n_nodes):                                 # node i's path: its ancestors' rows
        node, path = i, []
        while node >= 0:
            path.append(base + node)
            node = parents[node]
        path_rows[i, :len(path)] = path[::-1]
    plan = build_plan(positions, base, Geometry(rows, None, 0), tree=TreeRows(base, path_rows))
    a = plan.attention
    q = rng.standard_normal((n_nodes, 4, head_dim)).astype(F)
    expected = twin.attention(mode, q, kv.keys, kv.values, kv.table[0], positions, scale=0.125,
                              shared_end=a.shared_end, tail_rows=pool_rows(kv, 0, a.tail_rows))
    for vector in (True, False):
        monkeypatch.setattr(launch, "vector_loads", lambda kv, v=vector: v)
        got = kernel(kernel_device, kv_dev, q, 0, positions, shared_end=a.shared_end, tail_rows=a.tail_rows)
        assert bits_equal(got, expected), (mode, vector)
    windowed = np.array([200, 201, 255])
    expected = twin.attention(mode, q[:3], kv.keys, kv.values, kv.table[1], windowed, window=90, scale=0.125)
    for vector in (True, False):
        monkeypatch.setattr(launch, "vector_loads", lambda kv, v=vector: v)
        assert bits_equal(kernel(kernel_device, kv_dev, q[:3], 1, windowed, window=90), expected), (mode, vector)


def test_vector_loads_only_for_whole_aligned_pieces():
    """16-byte pieces need rows of a multiple of 16 bytes and 16-byte aligned arrays."""
    assert launch.vector_loads(host_cache("fp16", 1, 64, 64, seed=1, n_slots=1))
    assert launch.vector_loads(host_cache("int4", 1, 32, 64, seed=1, n_slots=1))         # 16-byte rows
    assert not launch.vector_loads(host_cache("int4", 1, 16, 64, seed=1, n_slots=1))     # 8-byte rows
    assert not launch.vector_loads(host_cache("fp16", 1, 12, 64, seed=1, n_slots=1))     # 24-byte rows
    kv = host_cache("fp16", 1, 64, 64, seed=1, n_slots=1)
    buffer = np.zeros(kv.keys["data"].nbytes + 16, np.uint8)
    shifted = buffer[8:8 + kv.keys["data"].nbytes].view(np.float16).reshape(kv.keys["data"].shape)
    kv.pool.keys["data"] = shifted                             # 8 bytes past a 16-byte boundary
    assert launch.address(shifted) % 16 == 8 and not launch.vector_loads(kv)


@pytest.mark.parametrize("mode", MODES)
def test_the_fused_merge_gives_the_two_launches_bits(kernel_device, mode):
    """Pass 1 merging in its last chunk block (the backend's path) and the separate
    attention_merge launch give the same bits, across chunk edges, a window starting mid-chunk
    and an int4-h rotation; both equal the twin."""
    kv = host_cache(mode, 2, 64, 640, seed=31)
    kv_dev = on_device(kernel_device, kv)
    q = np.random.default_rng(32).standard_normal((5, 4, 64)).astype(F)
    for window, positions in ((0, np.array([0, 255, 256, 511, 639])), (300, np.array([100, 301, 399, 520, 639]))):
        expected = twin.attention(mode, q, kv.keys, kv.values, kv.table[1], positions, window=window, scale=0.125)
        for fused in (True, False):
            got = kernel(kernel_device, kv_dev, q, 1, positions, window=window, fused=fused)
            assert bits_equal(got, expected), (mode, window, fused)


def test_queries_share_a_block_without_a_window():
    """A verify's or a tree's queries share pass-1 blocks (each block of keys and values staged
    once for up to 16 of them) when no window makes their chunks differ; the shared memory stays
    within the launcher's budget, and the bits are each query's alone (the tests above run
    every case through it: 65-node trees, 4k contexts, windows at one query a block)."""
    assert launch.layout(16, 1, 128, 0, 0) == (16, 2)                             # doc-407m's verify
    assert launch.layout(65, 3, 64, 0, 0) == (16, 2)                              # SmolLM2, a big tree
    assert launch.layout(16, 1, 128, 64, 2) == (1, 2)                             # a window: one each
    assert launch.layout(3, 1, 64, 0, 0) == (3, 2)
    assert launch.layout(16, 16, 128, 0, 0) == (1, 2)                             # G = 16: over the budget
    assert launch.shared_bytes(16, 128, 2) > launch.SHARED_BUDGET


def test_a_device_too_small_for_one_tile_is_a_clear_error():
    """Where even one tile and one query's state exceed the device's shared memory, the launcher
    says so with the sizes, before any launch."""
    need = launch.shared_bytes(16, 256, 1, 1)
    with pytest.raises(ValueError, match=f"attention needs {need} bytes of shared memory"):
        launch.layout(1, 16, 256, 0, 0, limit=need - 1)
    assert launch.layout(1, 16, 256, 0, 0, limit=need) == (1, 1)
    assert launch.layout(16, 1, 128, 0, 0, limit=99 * 1024) == (16, 2)      # sm_86/89: doc-407m still 16
    assert launch.layout(16, 1, 256, 0, 0, limit=99 * 1024)[1] == 1          # hd 256 there: one tile


@pytest.mark.parametrize("mode,batch,fused", [("fp16", None, True), ("int4-h", None, True), ("fp16", 5, True),
                                              ("fp16", 5, False)])
def test_a_fused_rope_gives_the_bits_of_rotated_queries(kernel_device, mode, batch, fused):
    """Attention with the forward's rotation equals attention over queries rotated first by
    rope_rows' twin, bit for bit (int4-h: RoPE, then the Hadamard rotation, as unfused); 16
    queries sharing blocks, several heads per kv head; q itself is left as it was. batch 5:
    scratch for 5 queries, so four launches, each with its slice of the rotation (merged in
    pass 1, or by the merge kernel)."""
    from tinyloop.backends.reference.twins.elementwise import rope_rows
    from test_cuda_kv import rotations
    rng = np.random.default_rng(43)
    kv = host_cache(mode, 2, 64, 256, seed=43)
    q = rng.standard_normal((16, 4, 64)).astype(F)
    positions = np.arange(200, 216)
    rotation = rotations(rng, 16, 64)
    dev = on_device(kernel_device, kv)
    left = []
    scratch = None if batch is None else kernel_device.empty(
        batch * launch.partial_floats(4, 64, launch.max_chunks(dev.rows, 0, 0)), np.float32)
    got = kernel(kernel_device, dev, q, 1, positions, rotation=rotation, q_out=left, scratch=scratch, fused=fused)
    want = kernel(kernel_device, dev, rope_rows(q, rotation), 1, positions)
    assert bits_equal(got, want)
    assert bits_equal(left[0], q)


def test_bench_gpu_times_attention_at_both_chunk_sizes(kernel_device):
    """scripts/bench_gpu.py's attention_chunk_sizes stage: one decode query's attention at S = 1
    (shipped) and S = 4 (compiled with -DATT_CHUNK_BLOCKS=4, the launcher set to match while it
    runs, then set back), reporting n_kv x chunks blocks for each."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import bench_gpu
    seen = []

    class Clock:
        def captured_calls(self, call, calls):
            call()
            seen.append(launch.CHUNK_BLOCKS)
            return 1e-6
    figures = bench_gpu.attention_chunk_figures(kernel_device.xp, lambda options: kernel_device.module("attention", options),
                                                Clock(), [200], 2, n_kv=2, group=2, head_dim=32)
    assert seen == [1, 4] and launch.CHUNK_BLOCKS == twin.CHUNK_BLOCKS == 1
    assert figures["200"] == {"S1_us": 1.0, "S1_blocks": 2 * 4, "S4_us": 1.0, "S4_blocks": 2 * 1}
