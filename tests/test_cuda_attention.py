"""cuda/attention.cu through its launcher on the kernel_device fixture: bit for bit the twin
(every mode, head dims 16..128, GQA, decode / verify / 65 queries, windows over a ring
seam, a 65-node draft tree), within 1e-5 of the CPU backend's attention over the same
stored cache, row-invariant (a query alone gets the bits it gets in any batch), and a
tree node gets the bits of a plain decode of its path laid out contiguously."""
import numpy as np
import pytest
from test_cuda_kv import F

from tinyloop.backends.cpu import CpuBackend
from tinyloop.backends.cpu.twins import attention as twin
from tinyloop.backends.cpu.twins import kv as twin_kv
from tinyloop.backends.cuda.launch import attention as launch
from tinyloop.backends.cuda.launch.kv import DeviceKV
from tinyloop.model.plan import Geometry, TreeRows, build_plan

MODES = ["fp16", "fp32", "int8", "int4", "int4-h"]


def host_cache(mode, n_kv, head_dim, rows, seed, n_slots=2):
    """Host arrays in the device layout, every row of every slot holding random keys and
    values stored by the kv twin (the kv kernels equal it: test_cuda_kv.py)."""
    rng = np.random.default_rng(seed)
    kv = DeviceKV.allocate(mode, n_slots, n_kv, rows, head_dim)
    for slot in range(n_slots):
        keys, values = (rng.standard_normal((2, rows, n_kv, head_dim)) * [[[[1.5]]], [[[1.0]]]]).astype(F)
        twin_kv.kv_write(mode, kv.keys, kv.values, slot, np.arange(rows), keys, values)
    return kv


def on_device(device, kv):
    return DeviceKV(kv.mode, kv.n_slots, kv.n_kv, kv.rows, kv.head_dim,
                    *({n: device.asarray(a) for n, a in side.items()} for side in (kv.keys, kv.values)))


def kernel(device, kv_dev, q, slot, positions, window=0, ring_blocks=0, shared_end=twin.NO_TREE,
           tail_rows=None, scale=0.125):
    """The launcher with q as a column view of a wider array (a token stride that is not H hd)."""
    n_queries, n_heads, head_dim = q.shape
    wide = np.zeros((n_queries, n_heads * head_dim + 7), F)
    wide[:, 3:3 + n_heads * head_dim] = q.reshape(n_queries, -1)
    q_dev = device.asarray(wide)[:, 3:3 + n_heads * head_dim].reshape(q.shape)
    out = device.zeros(q.shape, F)
    tail_dev = None if tail_rows is None else device.asarray(np.ascontiguousarray(tail_rows, np.int32))
    launch.attention(device.module("attention"), kv_dev, q_dev, slot, device.asarray(np.asarray(positions, np.int32)),
                     window, ring_blocks, shared_end, tail_dev, 0 if tail_rows is None else tail_rows.shape[1],
                     scale, out)
    return device.to_host(out)


def cpu_attention(kv, q, slot, plan, scale):
    """The CPU backend's attention over the very same stored values."""
    storage = CpuBackend().kv_storage(kv.mode, kv.n_slots, kv.n_kv, kv.rows, kv.head_dim)
    for mine, theirs in ((kv.keys, storage.keys), (kv.values, storage.values)):
        for name, array in mine.items():
            theirs[name][..., :array.shape[-1]] = array
    return CpuBackend().attention(q, storage, slot, plan, scale)


def bits_equal(a, b) -> bool:
    return np.array_equal(np.asarray(a, F).view(np.uint32), np.asarray(b, F).view(np.uint32))


CASES = [  # (head_dim, n_kv, group, n_queries, last position): several 64-key blocks each
    (64, 1, 4, 1, 250), (128, 2, 2, 16, 200), (16, 4, 1, 65, 255), (48, 2, 3, 16, 140)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("head_dim, n_kv, group, n_queries, last", CASES)
def test_attention_equals_twin_and_approximates_cpu(kernel_device, mode, head_dim, n_kv, group, n_queries, last):
    if mode == "int4-h" and head_dim & (head_dim - 1):
        pytest.skip("int4-h needs a power-of-two head_dim")
    rows = 256
    kv = host_cache(mode, n_kv, head_dim, rows, seed=head_dim + n_queries)
    rng = np.random.default_rng(head_dim * n_queries)
    q = rng.standard_normal((n_queries, n_kv * group, head_dim)).astype(F)
    positions = np.arange(last - n_queries + 1, last + 1)
    scale = 1 / np.sqrt(head_dim)
    got = kernel(kernel_device, on_device(kernel_device, kv), q, 1, positions, scale=scale)
    assert bits_equal(got, twin.attention(mode, q, kv.keys, kv.values, 1, positions, scale=scale))
    plan = build_plan(positions, int(positions[0]), Geometry(rows, None, 0))
    np.testing.assert_allclose(got, cpu_attention(kv, q, 1, plan, scale), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["fp16", "int8", "int4-h"])
def test_window_across_the_ring_seam(kernel_device, mode):
    """A 256-row ring (4 blocks), window 100: queries at 300..315 read logical 201..315,
    stored at physical rows 201..255 then 0..59."""
    rows, window = 256, 100
    kv = host_cache(mode, 2, 32, rows, seed=7)
    q = np.random.default_rng(8).standard_normal((16, 4, 32)).astype(F)
    positions = np.arange(300, 316)
    got = kernel(kernel_device, on_device(kernel_device, kv), q, 0, positions, window, rows // 64)
    assert bits_equal(got, twin.attention(mode, q, kv.keys, kv.values, 0, positions, window, rows // 64,
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


@pytest.mark.parametrize("mode", ["fp32", "int4", "int4-h"])
def test_tree_of_65_nodes(kernel_device, mode):
    """The plan's tail rows (build_plan with TreeRows): kernel == twin, ~ CPU, and nodes equal
    a plain decode of their path laid out at rows base.. (bit for bit, kernel against kernel)."""
    rows, base, head_dim = 320, 180, 32
    rng = np.random.default_rng(65)
    path_rows, paths, positions = random_tree(rng, 65, base)
    assert positions.max() // 64 > base // 64                  # paths cross into the next block
    kv = host_cache(mode, 2, head_dim, rows, seed=9)
    q = rng.standard_normal((65, 4, head_dim)).astype(F)
    plan = build_plan(positions, base, Geometry(rows, None, 0), tree=TreeRows(base, path_rows))
    a = plan.attention
    assert a.n_tail and a.tail_rows.shape == (65, a.n_tail * 64)
    got = kernel(kernel_device, on_device(kernel_device, kv), q, 1, positions, 0, 0, a.shared_end, a.tail_rows)
    assert bits_equal(got, twin.attention(mode, q, kv.keys, kv.values, 1, positions, 0, 0, a.shared_end,
                                          a.tail_rows, 0.125))
    np.testing.assert_allclose(got, cpu_attention(kv, q, 1, plan, 0.125), rtol=1e-5, atol=1e-5)

    deepest = int(np.argmax(positions))
    for node in sorted({0, 1, 33, 64, deepest}):
        path = paths[node]
        plain = DeviceKV(kv.mode, kv.n_slots, kv.n_kv, kv.rows, kv.head_dim,
                         *({n: x.copy() for n, x in side.items()} for side in (kv.keys, kv.values)))
        for array in plain.arrays():
            array[:, :, base:base + len(path)] = array[:, :, path]
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
        assert bits_equal(batch, twin.attention(mode, q, kv.keys, kv.values, 0, positions, window, scale=0.125))
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
    assert bits_equal(got, twin.attention("int8", q, kv.keys, kv.values, 0, positions, scale=0.125))


@pytest.mark.parametrize("mode", ["fp16", "int4"])
def test_long_context(kernel_device, mode):
    """4000 keys (63 blocks) for one decode query: nothing in shared memory grows with context."""
    rows = 4032
    kv = host_cache(mode, 1, 64, rows, seed=15, n_slots=1)
    q = np.random.default_rng(16).standard_normal((2, 2, 64)).astype(F)
    positions = np.array([3999, 4020])
    got = kernel(kernel_device, on_device(kernel_device, kv), q, 0, positions)
    assert bits_equal(got, twin.attention(mode, q, kv.keys, kv.values, 0, positions, scale=0.125))
    plan = build_plan(positions, 3999, Geometry(rows, None, 0))
    np.testing.assert_allclose(got, cpu_attention(kv, q, 0, plan, 0.125), rtol=1e-5, atol=1e-5)
