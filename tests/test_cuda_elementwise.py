"""cuda/elementwise.cu against its twin (bit for bit) and the CPU backend's ops (within a
tolerance), through the launchers the CUDA backend calls, on the kernel_device fixture
(the CPU harness running the .cu file in several thread orders, or a GPU)."""
import numpy as np
import pytest

from tinyloop.backends.reference import activations, norms, positions
from tinyloop.backends.reference.twins import elementwise as twin
from tinyloop.backends.cuda.launch import elementwise as launch

F = np.float32


def rows_with_edges(rng, rows: int, width: int) -> np.ndarray:
    """(rows, width) normal floats; with 4 rows or more, rows 0-3 are all zeros, huge (their
    squares overflow float32), large, and tiny (their squares underflow)."""
    x = rng.standard_normal((rows, width)).astype(F) * F(3)
    if rows >= 4:
        x[:4] *= np.array([0, 3e19, 1e15, 1e-22], F)[:, None]
    return x


def bits_equal(a, b) -> bool:
    return np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


def device_bits_equal(device, got, want) -> bool:
    """bits_equal, but for what a GPU does differently by design: CuPy compiles every kernel with
    -ftz=true, so a subnormal result is a zero of its sign there, and its NaNs carry the canonical
    payload (seen on an H200). On the CPU harness every bit must match."""
    if not getattr(device, "is_gpu", False):
        return bits_equal(got, want)
    got, want = np.asarray(got, F), np.asarray(want, F)
    subnormal = (want != 0) & (np.abs(want) < np.finfo(F).tiny)
    want = np.where(subnormal, np.copysign(F(0), want), want).astype(F)
    nan = np.isnan(want)
    return (np.array_equal(nan, np.isnan(got))
            and np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32)))


def test_embed_rows(kernel_device):
    rng = np.random.default_rng(0)
    table = rng.standard_normal((50, 1100)).astype(F)     # 1,024 a thread batch: two, the second partial
    ids = np.array([0, 49, 7, 7, 13], np.int32)
    out = kernel_device.empty((5, 1100), F)
    launch.embed(kernel_device.module("elementwise"), kernel_device.asarray(table), kernel_device.asarray(ids), out)
    assert bits_equal(kernel_device.to_host(out), table[ids])


def test_add_rows_in_place(kernel_device):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 1001)).astype(F)
    b = rng.standard_normal((3, 1001)).astype(F) * F(1e-4)
    a[0, :3] = [np.inf, 3e38, -0.0]
    b[0, :3] = [-1.0, 3e38, -0.0]
    device_a = kernel_device.asarray(a)
    launch.add(kernel_device.module("elementwise"), device_a, kernel_device.asarray(b), device_a)
    with np.errstate(over="ignore"):
        expected = a + b
    assert bits_equal(kernel_device.to_host(device_a), expected)


@pytest.mark.parametrize("rows, width", [(1, 64), (65, 1000), (4, 2304), (3, 10), (2, 5000)])   # 2048 a batch
@pytest.mark.parametrize("norm", ["rms", "layer", "layer_no_bias"])
def test_norms_match_twin_and_cpu(kernel_device, norm, rows, width):
    rng = np.random.default_rng(rows * width)
    x = rows_with_edges(rng, rows, width)
    weight = rng.standard_normal(width).astype(F)
    bias = None if norm == "layer_no_bias" else rng.standard_normal(width).astype(F)
    padded = np.zeros((rows, width + 40), F)                     # x as a column view (row stride != D)
    padded[:, 8:8 + width] = x
    device_x = kernel_device.asarray(padded)[:, 8:8 + width]
    out = kernel_device.empty((rows, width), F)
    module = kernel_device.module("elementwise")
    with np.errstate(over="ignore"):                              # the huge row's squares
        if norm == "rms":
            launch.rms_norm(module, device_x, kernel_device.asarray(weight), 1e-5, out)
            expected, reference = twin.rms_norm(x, weight, 1e-5), norms.rms_norm(x, weight, 1e-5)
        else:
            launch.layer_norm(module, device_x, kernel_device.asarray(weight),
                              None if bias is None else kernel_device.asarray(bias), 1e-5, out)
            expected, reference = twin.layer_norm(x, weight, bias, 1e-5), norms.layer_norm(x, weight, bias, 1e-5)
    got = kernel_device.to_host(out)
    assert bits_equal(got, expected)
    # Only the sum order differs from NumPy's pairwise sum: a few ulp of the row's scale.
    scale = np.abs(reference).max(axis=1, keepdims=True) + F(1e-30)
    assert np.all(np.abs(got - reference) <= 4e-6 * scale)


@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_norms_row_invariant(kernel_device, norm):
    """Row r normalised alone has the bits it has in a 65-row call."""
    rng = np.random.default_rng(7)
    x = rows_with_edges(rng, 65, 777)
    weight = kernel_device.asarray(rng.standard_normal(777).astype(F))
    bias = kernel_device.asarray(rng.standard_normal(777).astype(F))
    module = kernel_device.module("elementwise")

    def run(host):
        out = kernel_device.empty(host.shape, F)
        if norm == "rms":
            launch.rms_norm(module, kernel_device.asarray(host), weight, 1e-6, out)
        else:
            launch.layer_norm(module, kernel_device.asarray(host), weight, bias, 1e-6, out)
        return kernel_device.to_host(out)

    together = run(x)
    for r in (0, 1, 2, 31, 64):
        assert bits_equal(run(x[r:r + 1])[0], together[r])


@pytest.mark.parametrize("rows", [1, 65])
def test_rope_in_place_on_a_view(kernel_device, rows):
    """q is a column range of a fused qkv row; rotating it leaves the other columns alone."""
    rng = np.random.default_rng(rows)
    heads, head_dim, width = 3, 64, 3 * 64 + 2 * 64
    qkv = rng.standard_normal((rows, width)).astype(F) * F(10)
    qkv[0, :4] = [0.0, -0.0, 3e30, -3e30]
    table = positions.rope_table(4096, positions.inv_frequencies(head_dim, 10000.0))
    rotation = table[rng.integers(0, 4096, rows)]                 # (T, hd/2) complex64
    device_qkv = kernel_device.asarray(qkv)
    q = device_qkv[:, :heads * head_dim].reshape(rows, heads, head_dim)
    launch.rope(kernel_device.module("elementwise"), q, kernel_device.asarray(rotation))
    got = kernel_device.to_host(device_qkv)
    x = qkv[:, :heads * head_dim].reshape(rows, heads, head_dim)
    assert bits_equal(got[:, :heads * head_dim].reshape(rows, heads, head_dim), twin.rope_rows(x, rotation))
    assert bits_equal(got[:, heads * head_dim:], qkv[:, heads * head_dim:])
    reference = positions.apply_rope(x, rotation)
    assert np.allclose(got[:, :heads * head_dim].reshape(rows, heads, head_dim), reference, rtol=1e-6, atol=1e-5)


def test_swiglu(kernel_device):
    rng = np.random.default_rng(3)
    rows, ffn_dim = 65, 300
    up = rng.standard_normal((rows, 2 * ffn_dim)).astype(F) * F(4)
    up[0, :6] = [0.0, -0.0, 100.0, -100.0, 88.0, -89.0]          # exp(-g) overflows / underflows
    out = kernel_device.empty((rows, ffn_dim), F)
    launch.swiglu(kernel_device.module("elementwise"), kernel_device.asarray(up), out)
    got = kernel_device.to_host(out)
    assert bits_equal(got, twin.swiglu(up, ffn_dim))
    with np.errstate(over="ignore"):
        reference = activations.swiglu(up, ffn_dim)
    assert np.allclose(got, reference, rtol=4e-7, atol=0)       # tl_exp vs np.exp: ~2 ulp


def test_gelu_tanh(kernel_device):
    rng = np.random.default_rng(4)
    x = np.concatenate([rng.standard_normal(3000).astype(F) * F(3),
                        np.array([0.0, -0.0, 1e-30, -1e-30, 9.0, -9.0, 20.0, -20.0, 1e5, -1e5,
                                  1e20, -1e20, 3e38, -3e38, 1e-40, -1e-40, np.inf, -np.inf, np.nan], F)])
    device_x = kernel_device.asarray(x)
    launch.gelu(kernel_device.module("elementwise"), device_x, device_x)   # in place
    got = kernel_device.to_host(device_x)
    assert device_bits_equal(kernel_device, got, twin.gelu_tanh(x))
    with np.errstate(over="ignore", invalid="ignore"):
        reference = activations.gelu_tanh(x)
    # 1 + tanh(u) near u = -inf cancels in both: absolute error ~ |x| * 2^-24.
    with np.errstate(invalid="ignore"):
        close = (got == reference) | (np.abs(got - reference) <= 1e-6 * np.abs(x))
    assert np.all(close | (np.isnan(got) & np.isnan(reference)))


# -- fp16 activations: a linear's input rounded to half by the kernel that makes it -------------
def half_bits_equal(a, b) -> bool:
    return a.dtype == b.dtype == np.float16 and np.array_equal(a.view(np.uint16), b.view(np.uint16))


@pytest.mark.parametrize("op", ["rms", "layer", "swiglu", "gelu"])
def test_half_outputs_are_the_float_results_rounded(kernel_device, op):
    """out float16 (out_half = 1): the float32 result rounded to nearest, ties to even, as
    NumPy's astype(float16); values past 65504 become inf, tiny ones subnormal halves."""
    rng = np.random.default_rng(11)
    module = kernel_device.module("elementwise")
    rows, width = 65, 300
    weight = rng.standard_normal(width).astype(F) * F(3e4)           # norm outputs past the half range
    if op in ("rms", "layer"):
        x = rows_with_edges(rng, rows, width)
        out = kernel_device.empty((rows, width), np.float16)
        with np.errstate(over="ignore"):
            if op == "rms":
                launch.rms_norm(module, kernel_device.asarray(x), kernel_device.asarray(weight), 1e-5, out)
                expected = twin.rms_norm(x, weight, 1e-5)
            else:
                bias = rng.standard_normal(width).astype(F)
                launch.layer_norm(module, kernel_device.asarray(x), kernel_device.asarray(weight),
                                  kernel_device.asarray(bias), 1e-5, out)
                expected = twin.layer_norm(x, weight, bias, 1e-5)
    elif op == "swiglu":
        up = rng.standard_normal((rows, 2 * width)).astype(F) * F(400)
        out = kernel_device.empty((rows, width), np.float16)
        launch.swiglu(module, kernel_device.asarray(up), out)
        expected = twin.swiglu(up, width)
    else:
        x = rng.standard_normal(rows * width).astype(F) * F(10) ** rng.integers(-9, 6, rows * width).astype(F)
        out = kernel_device.empty(x.shape, np.float16)
        launch.gelu(module, kernel_device.asarray(x), out)
        expected = twin.gelu_tanh(x)
    with np.errstate(over="ignore"):
        rounded = expected.astype(np.float16)
    got = kernel_device.to_host(out)
    assert half_bits_equal(got, rounded)
    assert np.isinf(rounded).any() or op == "gelu"                  # the overflow edge was exercised
    assert (rounded != expected).any()                               # and rounding was not a no-op


def test_half_output_cannot_overwrite_its_float_input(kernel_device):
    module = kernel_device.module("elementwise")
    x = kernel_device.asarray(np.ones((2, 8), F))
    with pytest.raises(ValueError, match="in place"):
        launch.gelu(module, x, x.view(np.float16).reshape(-1)[:16].reshape(2, 8))
    with pytest.raises(ValueError, match="in place"):                       # partly over it, too
        launch.gelu(module, x, x.view(np.float16).reshape(-1)[8:24].reshape(2, 8))
    with pytest.raises(ValueError, match="float32 or float16"):
        launch.rms_norm(module, x, kernel_device.asarray(np.ones(8, F)), 1e-5, kernel_device.empty((2, 8), np.float64))
