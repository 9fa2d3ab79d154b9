"""Tree attention computes, for every node, the bits a sequential decode of its path computes."""
import numpy as np
import pytest

from tinyloop.backends.reference.attention import attention_over
from tinyloop.model.plan import TreeRows

pytestmark = pytest.mark.exactness


@pytest.mark.exactness(sample=3)
@pytest.mark.parametrize("seed", range(20))
def test_tree_node_equals_sequential_decode_of_its_path(seed):
    rng = np.random.default_rng(seed)
    n_kv, group, hd = int(rng.choice([1, 2])), int(rng.choice([1, 3])), 16
    base = int(rng.integers(1, 200))
    n_nodes = int(rng.integers(2, 40))
    # A random tree in BFS order: node 0 is the root; each later node's parent comes earlier.
    parents = [-1] + [int(rng.integers(0, i)) for i in range(1, n_nodes)]
    depth = [0] * n_nodes
    for i in range(1, n_nodes):
        depth[i] = depth[parents[i]] + 1
    order = np.argsort(depth, kind="stable")          # BFS: shallower nodes first
    capacity = 320
    keys = rng.standard_normal((n_kv, capacity, hd)).astype(np.float32)
    values = rng.standard_normal((n_kv, capacity, hd)).astype(np.float32)
    row_of = {int(node): base + i for i, node in enumerate(order)}     # physical rows
    paths = []
    for node in order:
        path, u = [], int(node)
        while u != -1:
            path.append(row_of[u])
            u = parents[u]
        paths.append(path[::-1])
    max_depth = max(depth)
    path_rows = np.zeros((n_nodes, max_depth + 1), np.int64)
    for i, path in enumerate(paths):
        path_rows[i, :len(path)] = path
    positions = np.array([base + len(p) - 1 for p in paths])
    q = rng.standard_normal((n_nodes, n_kv * group, hd)).astype(np.float32)

    got = attention_over(q, keys, values, positions, 0.25, TreeRows(base, path_rows))
    for i, path in enumerate(paths):
        seq_keys, seq_values = keys.copy(), values.copy()
        seq_keys[:, base:base + len(path)] = keys[:, path]
        seq_values[:, base:base + len(path)] = values[:, path]
        expected = attention_over(q[i:i + 1], seq_keys, seq_values, positions[i:i + 1], 0.25)
        assert np.array_equal(got[i:i + 1], expected), f"node {i}"


def test_contiguous_tree_equals_plain_attention():
    """A chain laid out as a tree: the path gather must give the plain slice's bits. With
    head_dim 8 and two KV heads the gather used to leave rows 16 floats apart, which
    OpenBLAS's SkylakeX kernels sum in another order than rows 8 apart."""
    rng = np.random.default_rng(5)
    keys = rng.standard_normal((2, 192, 8)).astype(np.float32)
    values = rng.standard_normal((2, 192, 8)).astype(np.float32)
    q = rng.standard_normal((10, 4, 8)).astype(np.float32)
    positions = np.arange(100, 110)
    path_rows = np.array([[100 + j if j <= i else 0 for j in range(10)] for i in range(10)])
    plain = attention_over(q, keys, values, positions, 0.3)
    tree = attention_over(q, keys, values, positions, 0.3, TreeRows(100, path_rows))
    assert np.array_equal(plain, tree)
