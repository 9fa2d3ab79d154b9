"""cuda/linear_pair.cu linear_rows_pair_*: the out projection's residual add and the MLP's
norm-linear after it in one launch, against the two launches (bit for bit) and the twins, run
by the CPU harness (or a GPU) through the `kernel_device` fixture. On the harness blocks run
one after another (in id, reverse and random order), so a second-call block never waits there;
the tickets still decide which call and place each block takes, in whatever order blocks start."""
from types import SimpleNamespace

import numpy as np
import pytest

from tinyloop.backends.cuda.launch import linear as launch
from tinyloop.backends.cuda.launch.packing import pack_linear
from tinyloop.backends.reference.twins import elementwise as twin_elementwise
from tinyloop.backends.reference.twins import linear as twin

from test_cuda_linear import assert_bits_equal, weight_part


def pair_inputs(seed: int, rows: int, d: int, n_in: int, ffn: int, kind: str = "int4"):
    """The out projection (d <- n_in), the up projection (ffn <- d), their biases, the attention
    output x (rows, n_in), the residual stream h (rows, d) and the norm's weight and bias."""
    rng = np.random.default_rng(seed)
    out_parts = [weight_part(kind, rng, d, n_in, group=32)]
    up_parts = [weight_part(kind, rng, ffn, d, group=32, act_order=True)]
    out_bias = rng.standard_normal(d).astype(np.float32)
    up_bias = rng.standard_normal(ffn).astype(np.float32)
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    h = (rng.standard_normal((rows, d)) * 3 + 0.5).astype(np.float32)
    norm_w = rng.standard_normal(d).astype(np.float32)
    norm_b = rng.standard_normal(d).astype(np.float32)
    return out_parts, up_parts, out_bias, up_bias, x, h, norm_w, norm_b


def run(device, inputs, norm: str, half: bool, gelu: bool, paired: bool, cap=None, chain=None):
    """On the device: h2 = h + out(x), y = up(norm(h2)) (GELU'd where gelu, half out then), as
    the pair or as two launches. -> (h2, y) on the host, float32."""
    out_parts, up_parts, out_bias, up_bias, x, h, norm_w, norm_b = inputs
    wrap = SimpleNamespace(asarray=device.asarray)
    out_w = pack_linear(out_parts, out_bias, wrap, keep_f16=True)
    up_w = pack_linear(up_parts, up_bias, wrap, keep_f16=True)
    rows = x.shape[0]
    h2 = device.zeros((rows, out_w.out_features), np.float32)
    y = device.zeros((rows, up_w.out_features), np.float16 if gelu and half else np.float32)
    fold = launch.NormFold(norm, device.asarray(norm_w), device.asarray(norm_b) if norm == "layer" else None,
                           1e-5, half)
    activation = "gelu" if gelu else None
    first = launch.PairCall(device.asarray(x), out_w, h2, residual=device.asarray(h))
    second = launch.PairCall(h2, up_w, y, activation=activation, norm=fold)
    if paired:
        chain = device.zeros((launch.PAIR_COUNTERS,), np.uint32) if chain is None else chain
        launch.linear_pair(device.module("linear_pair"), first, second, chain, cap)
        assert not device.to_host(chain).any(), "the pair left its counters behind"
    else:
        for call in (first, second):
            launch.linear(device.module("linear"), call.x, call.packed, call.out, True, residual=call.residual,
                          activation=call.activation, norm=call.norm, column_block_cap=cap)
    return device.to_host(h2), device.to_host(y).astype(np.float32)


@pytest.mark.parametrize("rows,d,n_in,ffn,cap", [(1, 256, 192, 300, None), (1, 256, 192, 300, 2), (1, 8200, 64, 40, 2),
                                                 (2, 96, 64, 200, None), (9, 96, 130, 64, None), (17, 64, 64, 40, None)])
@pytest.mark.parametrize("norm,half,gelu", [("rms", False, False), ("layer", True, True), ("layer", False, True)])
def test_the_pair_gives_the_bits_of_the_two_launches(kernel_device, rows, d, n_in, ffn, cap, norm, half, gelu):
    """Both outputs of the pair equal the two launches' bit for bit, and the twins' (the linear
    twin plus the residual, then the norm twin, half where half, the linear twin, GELU): decode
    rows on the resident path (a capped grid: each warp several columns; a capped first call
    before a second whose 8,200 inputs are past one tile, so not capped: two column grids), 2 rows, a 9-row call
    (an 8-row chunk and a 1-row one), 17 rows (two row blocks a call: the place's second
    coordinate), an RMS norm, and a layer norm with a bias under GELU, float and half."""
    inputs = pair_inputs(rows * 100 + d + ffn, rows, d, n_in, ffn)
    paired = run(kernel_device, inputs, norm, half, gelu, True, cap)
    apart = run(kernel_device, inputs, norm, half, gelu, False, cap)
    for a, b in zip(paired, apart):
        assert_bits_equal(a, b)
    out_parts, up_parts, out_bias, up_bias, x, h, norm_w, norm_b = inputs
    h2 = h + twin.linear_rows(x, pack_linear(out_parts, out_bias, np, keep_f16=True))
    assert_bits_equal(paired[0], h2)
    normed = (twin_elementwise.rms_norm(h2, norm_w, 1e-5) if norm == "rms"
              else twin_elementwise.layer_norm(h2, norm_w, norm_b, 1e-5))
    if half:
        normed = normed.astype(np.float16).astype(np.float32)
    y = twin.linear_rows(normed, pack_linear(up_parts, up_bias, np, keep_f16=True))
    if gelu:
        y = twin_elementwise.gelu_tanh(y)
        if half:
            y = y.astype(np.float16).astype(np.float32)
    assert_bits_equal(paired[1], y)


def test_the_second_call_reads_every_output_of_the_first(kernel_device):
    """A wide first call (2,048 outputs: 256 blocks) before a second call of 8 blocks whose norm
    reads all of them: on a GPU the second call's blocks start while most of the first's still run,
    so one that did not wait would read outputs not yet written and give other bits. The harness
    runs blocks one after another and cannot show it (the wait is GPU-only there); gpu_check.sh
    runs this file on the device, where the pair runs 20 times."""
    inputs = pair_inputs(11, 1, 2048, 256, 64)
    apart = run(kernel_device, inputs, "layer", False, True, False)
    for _ in range(20 if kernel_device.is_gpu else 1):
        paired = run(kernel_device, inputs, "layer", False, True, True)
        for a, b in zip(paired, apart):
            assert_bits_equal(a, b)


def test_one_counter_set_serves_launch_after_launch(kernel_device):
    """Every launch leaves the counters zero, so the same three serve the next pair (the backend
    keeps one buffer; a replayed graph finds them so); a launch that finds a ticket count left
    behind (a ticket past the grid) traps instead of giving wrong bits."""
    inputs = pair_inputs(5, 1, 64, 64, 48)
    chain = kernel_device.zeros((launch.PAIR_COUNTERS,), np.uint32)
    first = run(kernel_device, inputs, "rms", False, False, True, chain=chain)
    for _ in range(2):
        again = run(kernel_device, inputs, "rms", False, False, True, chain=chain)
        for a, b in zip(first, again):
            assert_bits_equal(a, b)
    if kernel_device.is_gpu:
        return          # a trap on a GPU leaves the process's context unusable: the harness shows it
    left_behind = kernel_device.asarray(np.array([1 << 20, 0, 0], np.uint32))
    with pytest.raises(Exception, match="trap"):
        run(kernel_device, inputs, "rms", False, False, True, chain=left_behind)


def test_the_pair_runs_one_kind_of_one_segment_weights():
    """linear_pair takes two one-segment int4 (half scale) weights and a three-counter uint32
    chain; anything else is a clear error before a launch, and the backend keeps two launches
    where pair_supported says no. The calls' own checks (shapes, the norm) still apply."""
    rng = np.random.default_rng(9)
    int4 = pack_linear([weight_part("int4", rng, 16, 32)], None, np, keep_f16=True)
    int8 = pack_linear([weight_part("int8", rng, 16, 32)], None, np, keep_f16=True)
    int4_f32s = pack_linear([weight_part("int4", rng, 16, 32, scale_dtype=np.float32)], None, np, keep_f16=True)
    two = pack_linear([weight_part("int4", rng, 8, 32), weight_part("int8", rng, 8, 32)], None, np,
                      keep_f16=True)
    assert launch.pair_supported(int4, int4)
    for a, b in ((int4, int8), (int8, int8), (int4, int4_f32s), (two, int4), (int4, two)):
        assert not launch.pair_supported(a, b)
    x, h2, y = np.ones((1, 32), np.float32), np.zeros((1, 16), np.float32), np.zeros((1, 16), np.float32)
    chain = np.zeros(3, np.uint32)
    with pytest.raises(ValueError, match="one-segment weights of one kind"):
        launch.linear_pair(None, launch.PairCall(x, int4, h2), launch.PairCall(x[:, :16], int8, y), chain)
    with pytest.raises(ValueError, match="3 uint32 counters"):
        launch.linear_pair(None, launch.PairCall(x, int4, h2), launch.PairCall(x, int4, y), np.zeros(3, np.int32))
    with pytest.raises(ValueError, match=r"x must have shape \(T, 32\)"):
        launch.linear_pair(None, launch.PairCall(x, int4, h2), launch.PairCall(h2, int4, y), chain)
