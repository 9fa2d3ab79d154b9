"""One arithmetic per row, whatever the memory layout: the exact path's products give the
same bits whether their operands arrive contiguous, strided, transposed, gathered or
offset in memory (ops/__init__.py states the invariant). Also pins the properties of
BLAS and NumPy the invariant rests on, so a library or CPU that breaks one of them
fails here, by name. Run under every OpenBLAS core type by scripts/exactness_matrix.py.
"""
import numpy as np
import pytest

from tinyloop.backends.reference.attention import attention_over, sequential_sum
from tinyloop.backends.reference.linear import linear
from tinyloop.backends.reference.norms import layer_norm, rms_norm
from tinyloop.model.plan import TreeRows

pytestmark = pytest.mark.exactness


def offset_copy(x: np.ndarray, offset_floats: int) -> np.ndarray:
    """x copied into a buffer at a chosen distance (in floats) from a 64-byte boundary."""
    buffer = np.empty(x.size + 32, np.float32)
    start = (-buffer.ctypes.data % 64) // 4 + offset_floats
    out = buffer[start:start + x.size].reshape(x.shape)
    out[...] = x
    return out


def layouts(x: np.ndarray) -> dict:
    """The same (n_kv, rows, hd) values in the layouts a cache reader can hand back."""
    n_kv, rows, hd = x.shape
    padded = np.zeros((n_kv, rows, hd + 8), np.float32)          # rows hd + 8 floats apart
    padded[..., :hd] = x
    kv_inner = np.ascontiguousarray(x.transpose(1, 0, 2)).transpose(1, 0, 2)   # row stride n_kv * hd
    return {
        "contiguous": np.ascontiguousarray(x),
        "row stride hd+8": padded[..., :hd],
        "kv heads innermost": kv_inner,
        "gathered": x[:, np.arange(rows)],
        "fortran": np.asfortranarray(x),
        "offset by 1 float": offset_copy(x, 1),
        "offset by 4 floats": offset_copy(x, 4),
    }


@pytest.mark.parametrize("head_dim", [8, 16, 32, 64, 128])
@pytest.mark.parametrize("n_kv", [1, 2, 4])
def test_attention_bits_do_not_depend_on_the_cache_layout(head_dim, n_kv):
    rng = np.random.default_rng(head_dim * 10 + n_kv)
    group, capacity = 2, 256
    keys = rng.standard_normal((n_kv, capacity, head_dim)).astype(np.float32)
    values = rng.standard_normal((n_kv, capacity, head_dim)).astype(np.float32)
    q = rng.standard_normal((7, n_kv * group, head_dim)).astype(np.float32)
    positions = np.arange(150, 157)
    path_rows = np.array([[150 + j if j <= i else 0 for j in range(7)] for i in range(7)])
    key_layouts, value_layouts = layouts(keys), layouts(values)
    for tree in (None, TreeRows(150, path_rows)):
        for window in (0, 90):
            expected = attention_over(q, keys, values, positions, 0.3, tree, window)
            for name in key_layouts:
                got = attention_over(q, key_layouts[name], value_layouts[name], positions, 0.3, tree, window)
                assert np.array_equal(got, expected), (name, tree is not None, window)


@pytest.mark.parametrize("shape", [(16, 48), (64, 192), (576, 1728), (1536, 576)])
def test_linear_rows_do_not_depend_on_layout_or_batch(shape):
    n_in, n_out = shape
    rng = np.random.default_rng(n_in)
    weight = rng.standard_normal(shape).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32)
    x = rng.standard_normal((65, n_in)).astype(np.float32)
    expected = np.concatenate([linear(x[t:t + 1], weight, bias) for t in range(len(x))])
    wide = np.zeros((65, n_in + 5), np.float32)
    wide[:, 3:3 + n_in] = x
    for name, variant in (("batch", x), ("column slice", wide[:, 3:3 + n_in]), ("fortran", np.asfortranarray(x)),
                          ("offset", offset_copy(x, 3)), ("first 33 rows", x[:33])):
        got = linear(variant, weight, bias)
        assert np.array_equal(got, expected[:len(variant)]), name


@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_norm_rows_do_not_depend_on_layout_or_batch(norm):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((40, 576)).astype(np.float32)
    weight, bias = rng.standard_normal((2, 576)).astype(np.float32)
    apply = (lambda a: rms_norm(a, weight, 1e-5)) if norm == "rms" else (lambda a: layer_norm(a, weight, bias, 1e-5))
    expected = np.concatenate([apply(x[t:t + 1]) for t in range(len(x))])
    for name, variant in (("batch", x), ("fortran", np.asfortranarray(x)), ("every other row", np.repeat(x, 2, 0)[::2]),
                          ("offset", offset_copy(x, 5))):
        assert np.array_equal(apply(variant), expected), name


# --------------------------------------------------------------------- what the invariant rests on
@pytest.mark.parametrize("rows, n_in, n_out, transposed", [
    (1, 8, 64, True), (3, 16, 64, True), (1, 64, 64, True), (3, 64, 64, True), (2, 128, 64, True),  # q . key block
    (1, 64, 9, False), (3, 64, 17, False), (3, 64, 65, False), (2, 64, 129, False),   # p . [value | 1] block
    (1, 64, 192, False), (1, 576, 1728, False), (1, 1536, 576, False), (1, 576, 1000, True),  # linears, tied head
])
def test_blas_products_do_not_depend_on_alignment(rows, n_in, n_out, transposed):
    """(rows, n_in) @ (n_in, n_out), the fixed shapes of the exact path, gives the same bits
    wherever its three operands start."""
    rng = np.random.default_rng(n_in * n_out + rows)
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    stored = rng.standard_normal((n_out, n_in) if transposed else (n_in, n_out)).astype(np.float32)
    expected = x @ (stored.T if transposed else stored)
    for x_offset, w_offset, y_offset in ((1, 0, 0), (0, 1, 0), (0, 0, 1), (4, 8, 12), (3, 5, 7), (8, 4, 0)):
        w = offset_copy(stored, w_offset)
        y = offset_copy(np.zeros((rows, n_out), np.float32), y_offset)
        np.matmul(offset_copy(x, x_offset), w.T if transposed else w, out=y)
        assert np.array_equal(y, expected), (x_offset, w_offset, y_offset)


@pytest.mark.parametrize("name", ["exp", "tanh", "sqrt", "divide"])
def test_elementwise_functions_are_position_independent(name):
    """Each element gets the same bits alone, in a long array (SIMD main loop or tail), or strided."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(1031) * 5).astype(np.float32)
    function = {"exp": np.exp, "tanh": np.tanh, "sqrt": lambda a: np.sqrt(np.abs(a)),
                "divide": lambda a: a / (np.float32(1) + np.abs(a))}[name]
    whole = function(x)
    alone = np.array([function(x[i:i + 1])[0] for i in range(len(x))])
    pieces = np.concatenate([function(x[s:s + 13]) for s in range(0, len(x), 13)])
    spaced = np.zeros(2 * len(x), np.float32)
    spaced[1::2] = x
    for label, other in (("alone", alone), ("pieces of 13", pieces), ("strided", function(spaced[1::2])),
                         ("2-D rows", function(x[:1024].reshape(16, 64)).ravel())):
        assert np.array_equal(whole[:len(other)], other), label


def test_the_rope_product_is_position_independent():
    """RoPE's complex64 product gives each pair the same bits alone, in SIMD body or tail, strided or in rows."""
    rng = np.random.default_rng(12)
    a, b = ((rng.standard_normal(1031) + 1j * rng.standard_normal(1031)).astype(np.complex64) for _ in range(2))
    whole = a * b
    spaced_a, spaced_b = np.zeros(2 * 1031, np.complex64), np.zeros(2 * 1031, np.complex64)
    spaced_a[1::2], spaced_b[1::2] = a, b
    for label, other in (("alone", np.array([(a[i:i + 1] * b[i:i + 1])[0] for i in range(1031)])),
                         ("pieces of 13", np.concatenate([a[s:s + 13] * b[s:s + 13] for s in range(0, 1031, 13)])),
                         ("strided", spaced_a[1::2] * spaced_b[1::2]),
                         ("2-D rows", (a[:1024].reshape(16, 64) * b[:1024].reshape(16, 64)).ravel())):
        assert np.array_equal(whole[:len(other)], other), label


@pytest.mark.parametrize("length", [8, 16, 64, 128, 576, 2048])
def test_row_sums_do_not_depend_on_how_many_rows(length):
    """A sum over a contiguous last axis runs in one order for one length, whatever else is summed."""
    rng = np.random.default_rng(length)
    x = rng.standard_normal((37, length)).astype(np.float32)
    together = x.sum(axis=-1)
    assert np.array_equal(together, np.array([x[t].sum() for t in range(37)]))
    assert np.array_equal(x.reshape(37, 1, 1, length).sum(axis=-1).ravel(), together)
    assert np.array_equal(np.cumsum(x, axis=0)[-1], np.cumsum(x[:, ::-1], axis=0)[-1][::-1])


@pytest.mark.parametrize("blocks, inner", [(2, (3, 65)), (9, (1, 17)), (69, (3, 65)), (300, (1, 9))])
def test_the_block_sum_adds_in_index_order_and_ignores_zero_blocks(blocks, inner):
    """attention's sequential_sum: ((b0 + b1) + b2) + ..., whatever the shape around it, so
    leading and trailing all-zero blocks (keys outside a query's range) change no bit."""
    rng = np.random.default_rng(blocks)
    x = (rng.standard_normal((2, 3, blocks) + inner) * 10.0 ** rng.integers(-3, 4, blocks)[:, None, None]
         ).astype(np.float32)
    expected = x[:, :, 0].copy()
    for b in range(1, blocks):
        expected = expected + x[:, :, b]
    assert np.array_equal(sequential_sum(x, axis=2), expected)
    padded = np.concatenate([np.zeros((2, 3, 5) + inner, np.float32), x, np.zeros((2, 3, 7) + inner, np.float32)],
                            axis=2)
    assert np.array_equal(sequential_sum(padded, axis=2), expected)
    assert np.array_equal(sequential_sum(np.asfortranarray(padded), axis=2), expected)
