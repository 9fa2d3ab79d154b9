"""cuda/linear.cu against its twin (bit for bit), the CPU backend and float64 (within a
tolerance), run by the CPU harness (or a GPU) through the `kernel_device` fixture."""
from types import SimpleNamespace

import numpy as np
import pytest

from tinyloop.backends.reference.backend import NumpyBackend
from tinyloop.backends.reference.twins import linear as twin
from tinyloop.backends.reference.twins.arith import fma_f32, warp_sum
from tinyloop.backends.cuda.launch import linear as launch
from tinyloop.backends.cuda.launch.packing import pack_linear
from tinyloop.model.quant import QuantizedTensor, dequantize, quantize_rtn

pytestmark = pytest.mark.harness       # the kernels run on the CPU harness (or a GPU): scripts/exactness_matrix.py

KINDS = ("int2", "int4", "int8", "f16", "f32")
# groups that leave padded columns (100 -> 108 / 102) and a code row that is not whole
# words (27, 51, 102 bytes), and int4 groups that start inside a word
ODD_GROUP = {"int2": 12, "int4": 6, "int8": 6, "f16": 0, "f32": 0}
# f32 scales too: code * scale rounds then (with f16 scales it is exact), so the kernel's
# order of the dequantizing multiply and add shows
KIND_SCALES = [(k, np.float16) for k in KINDS] + [(k, np.float32) for k in ("int2", "int4", "int8")]


def kernel_suffix(kind: str, scale_dtype) -> str:
    """The kernel a part of `kind` with scales of `scale_dtype` must run on."""
    return kind + "_f32s" if kind.startswith("int") and scale_dtype == np.float32 else kind


def weight_part(kind: str, rng, n_out: int, n_in: int, group: int = 32, act_order: bool = False,
                scale_dtype=np.float16):
    """One (n_out, n_in) weight part of `kind`: a QuantizedTensor, or a float array."""
    weight = rng.standard_normal((n_out, n_in)).astype(np.float32) / np.sqrt(n_in)
    if kind == "f16":
        return weight.astype(np.float16)
    if kind == "f32":
        return weight
    tensor = quantize_rtn(weight, int(kind[3:]), group, scale_dtype)
    if act_order:
        tensor.perm = rng.permutation(tensor.padded_in).astype(np.int32)
    return tensor


def inputs(rng, rows: int, n_in: int) -> np.ndarray:
    return rng.standard_normal((rows, n_in)).astype(np.float32)                 # (T, in)


def run_kernel(device, parts, bias, x, exact=True, out_pad=(0, 0), x_pad=(0, 0), tensor_cores=False, cap=None):
    """The launcher on the device; x and out may sit inside wider buffers (row strides,
    column offsets); tensor_cores: pass it the linear_tc module; cap: its column_block_cap.
    -> (T, out) host float32."""
    # device.asarray: on the harness, arrays that end against an inaccessible page
    packed = pack_linear(parts, bias, SimpleNamespace(asarray=device.asarray), keep_f16=True)
    rows, n_in = x.shape
    wide_x = np.full((rows, x_pad[0] + n_in + x_pad[1]), np.nan, x.dtype)      # NaN: a stray read shows
    wide_x[:, x_pad[0]:x_pad[0] + n_in] = x
    x_dev = device.asarray(wide_x)[:, x_pad[0]:x_pad[0] + n_in]
    out = device.zeros((rows, out_pad[0] + packed.out_features + out_pad[1]), np.float32)
    launch.linear(device.module("linear"), x_dev, packed,
                  out[:, out_pad[0]:out_pad[0] + packed.out_features], exact,
                  device.module("linear_tc") if tensor_cores else None, column_block_cap=cap)
    result = device.to_host(out)
    assert not result[:, :out_pad[0]].any() and not result[:, out_pad[0] + packed.out_features:].any()
    return result[:, out_pad[0]:out_pad[0] + packed.out_features]


def twin_rows(parts, bias, x):
    return twin.linear_rows(x, pack_linear(parts, bias, np, keep_f16=True))


def assert_bits_equal(actual, expected):
    assert actual.dtype == expected.dtype == np.float32 and actual.shape == expected.shape
    diff = actual.view(np.uint32) != expected.view(np.uint32)
    assert not diff.any(), (f"{diff.sum()} of {diff.size} differ, first at {np.argwhere(diff)[0]}: "
                            f"{actual[diff][:4]} vs {expected[diff][:4]}")


def magnitude(x, parts) -> np.ndarray:
    """|x| @ |W|.T: the scale of each output's rounding error."""
    weight = np.concatenate([dequantize(p) if isinstance(p, QuantizedTensor) else np.asarray(p, np.float32)
                             for p in parts])
    return np.abs(x).astype(np.float64) @ np.abs(weight).astype(np.float64).T


# -- the exact path: kernel == twin, bit for bit -------------------------------------------------
@pytest.mark.parametrize("rows", [1, 2, 7, 16, 65])
@pytest.mark.parametrize("kind,scale_dtype", KIND_SCALES)
def test_rows_kernel_equals_twin(kernel_device, kind, scale_dtype, rows):
    rng = np.random.default_rng(rows * 10 + KINDS.index(kind))
    n_in = 100
    parts = [weight_part(kind, rng, 21, n_in, ODD_GROUP[kind], scale_dtype=scale_dtype)]   # 21: idle warps
    assert pack_linear(parts, None, np, keep_f16=True).segments[0].kernel == kernel_suffix(kind, scale_dtype)
    bias = rng.standard_normal(21).astype(np.float32)
    x = inputs(rng, rows, n_in)
    assert_bits_equal(run_kernel(kernel_device, parts, bias, x), twin_rows(parts, bias, x))


@pytest.mark.parametrize("kind", KINDS)
def test_rows_kernel_several_tiles_and_act_order(kernel_device, kind):
    """A 4-row chunk stages 2,048 stored columns a tile (LIN_STAGE_FLOATS / 4): 2,200 inputs
    take two tiles, with a permutation, and the ninth row (a 1-row chunk) takes them in one."""
    rng = np.random.default_rng(7)
    n_in = 2200
    parts = [weight_part(kind, rng, 9, n_in, group=64, act_order=kind.startswith("int"))]
    x = inputs(rng, 9, n_in)
    assert_bits_equal(run_kernel(kernel_device, parts, None, x), twin_rows(parts, None, x))


@pytest.mark.parametrize("kind", ["int4", "int8", "f32"])
def test_one_row_wider_than_its_stage(kernel_device, kind):
    """A decode row stages up to 8,192 stored columns at once; 8,300 inputs take a second tile,
    with the batches' last words past each tile's end (the clamped loads)."""
    rng = np.random.default_rng(8)
    n_in = 8300
    parts = [weight_part(kind, rng, 9, n_in, group=32)]
    x = inputs(rng, 1, n_in)
    assert_bits_equal(run_kernel(kernel_device, parts, None, x), twin_rows(parts, None, x))


@pytest.mark.parametrize("group", [4, 12, 32, 96, 128])
def test_groups_found_by_multiply_equal_division(kernel_device, group):
    """The rows kernels find a word's group with a high multiply (linear_kinds.cuh group_magic):
    groups of every kind of size (a power of two or not, under a word's 8 columns or over a
    lane's chunk of 32) give the twin's bits, whose groups come from a division."""
    rng = np.random.default_rng(group)
    parts = [weight_part("int4" if group % 8 == 0 else "int8", rng, 9, 1000, group=group)]
    x = inputs(rng, 2, 1000)
    assert_bits_equal(run_kernel(kernel_device, parts, None, x), twin_rows(parts, None, x))


@pytest.mark.parametrize("kind,group,n_in", [("int4", 8, 2040), ("int8", 4, 1020), ("int2", 16, 4080)])
def test_whole_batches_past_the_last_group_borrow_it(kernel_device, kind, group, n_in):
    """Rows whose 16-byte padding holds a word past the last group (int4 in groups of 8 over
    2,040 columns: 255 words of groups, 256 stored), in whole batches (one row: 256 words a
    batch): groups narrower than a chunk, so each word finds its own as it is summed; the
    padding word borrows the last group's scale and min as the twin's does, and no load reads
    past a row's groups (the last row's would fault: the harness's arrays end against an
    inaccessible page). (Where a chunk is one group, the rows are whole groups: no padding.)"""
    rng = np.random.default_rng(group)
    parts = [weight_part(kind, rng, 9, n_in, group=group)]
    x = inputs(rng, 1, n_in)
    assert_bits_equal(run_kernel(kernel_device, parts, None, x), twin_rows(parts, None, x))


@pytest.mark.parametrize("kind,group,n_in", [("int4", 512, 2048), ("int4", 32, 2048), ("int8", 128, 1024)])
def test_whole_batches_find_each_words_group(kernel_device, kind, group, n_in):
    """One row in whole batches (linear.cu's resident loop, no clamped batch), each chunk of 4
    words in one group (linear_kinds.cuh chunk_uniform): a scale and a min a chunk, found from
    its first word, as the twin's division finds it (groups of 512 int4 columns: half a stripe,
    16 lanes' chunks a group; of 32: one chunk a group)."""
    rng = np.random.default_rng(group + n_in)
    parts = [weight_part(kind, rng, 9, n_in, group=group)]
    x = inputs(rng, 1, n_in)
    assert_bits_equal(run_kernel(kernel_device, parts, None, x), twin_rows(parts, None, x))


@pytest.mark.parametrize("n_in", [700, 2048, 2500])
@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("kind,scale_dtype", KIND_SCALES)
def test_capped_grid_runs_columns_back_to_back(kernel_device, kind, scale_dtype, rows, n_in):
    """With fewer column blocks than columns / 8 (column_block_cap) each warp sums several
    columns in turn, the next column's first batch in flight: 45 columns (6 blocks' worth, the
    last one short) over 1, 2 and 5 blocks, act-order, rows of 700 inputs (one partial batch a
    column), 2,048 (whole batches: the even loop, but for int2 at one row) and 2,500
    (whole batches, then a partial one): every cap gives the uncapped bits, and the twin's."""
    rng = np.random.default_rng(40 + rows + n_in)
    group = 32 if n_in == 2048 else ODD_GROUP[kind] or 32          # 2,048 in groups of 32: whole words
    parts = [weight_part(kind, rng, 45, n_in, group, act_order=kind.startswith("int"), scale_dtype=scale_dtype)]
    bias = rng.standard_normal(45).astype(np.float32)
    x = inputs(rng, rows, n_in)
    want = twin_rows(parts, bias, x)
    for cap in (None, 1, 2, 5):
        assert_bits_equal(run_kernel(kernel_device, parts, bias, x, cap=cap), want)


def test_capped_grid_on_the_tiled_path(kernel_device, monkeypatch):
    """The kernel takes a capped grid on its tiled path too (the launcher caps only resident
    calls): 9 rows (two 4-row chunks over two tiles, then a resident 1-row chunk), 45 columns
    on 2 blocks: the twin's bits."""
    monkeypatch.setattr(launch, "rows_resident", lambda seg, n_rows: True)
    rng = np.random.default_rng(47)
    parts = [weight_part("int4", rng, 45, 2200, 32)]
    x = inputs(rng, 9, 2200)
    assert_bits_equal(run_kernel(kernel_device, parts, None, x, cap=2), twin_rows(parts, None, x))


def test_the_launcher_caps_only_resident_calls():
    """rows_resident mirrors linear.cu: 1 or 2 rows whose stored words fit one staged tile."""
    seg = SimpleNamespace(kind="int4", words_per_row=1024)       # 8,192 stored columns
    assert launch.rows_resident(seg, 1) and not launch.rows_resident(seg, 2) and not launch.rows_resident(seg, 3)
    assert launch.rows_resident(SimpleNamespace(kind="int4", words_per_row=512), 2)
    assert not launch.rows_resident(SimpleNamespace(kind="int4", words_per_row=1056), 1)
    assert launch.rows_resident(SimpleNamespace(kind="f32", words_per_row=8192), 1)


def test_group_lookup_bound_is_checked():
    """The multiply finds the group exactly while stored columns x group size < 2^32; the
    launcher refuses a segment past that (no real model comes near: 8,192 x 128 is 2^20)."""
    ok = SimpleNamespace(kind="int4", words_per_row=1024, group_size=128)
    launch.check_group_lookup(ok)
    with pytest.raises(ValueError, match="group"):
        launch.check_group_lookup(SimpleNamespace(kind="int4", words_per_row=1 << 16, group_size=1 << 13))
    launch.check_group_lookup(SimpleNamespace(kind="f16", words_per_row=1 << 20, group_size=0))
    with pytest.raises(ValueError, match="whole 16-byte lines"):     # a lane's 16-byte load would straddle rows
        launch.check_group_lookup(SimpleNamespace(kind="f32", words_per_row=102, group_size=0))


def test_fused_segments_fill_one_output(kernel_device):
    """q|k|v-like parts of different layouts, two with act-order: one launch per segment,
    each at its column offset, bias split between them; x and out are views in wider buffers."""
    rng = np.random.default_rng(3)
    n_in = 70
    parts = [weight_part("int4", rng, 12, n_in, act_order=True),
             weight_part("int4", rng, 5, n_in, act_order=True),
             weight_part("int4", rng, 6, n_in), weight_part("int4", rng, 4, n_in),   # one segment
             weight_part("int8", rng, 3, n_in, group=16),
             weight_part("f32", rng, 8, n_in), weight_part("f16", rng, 9, n_in)]
    packed = pack_linear(parts, None, np, keep_f16=True)
    assert [(s.kind, s.out_offset, s.out_features) for s in packed.segments] == [
        ("int4", 0, 12), ("int4", 12, 5), ("int4", 17, 10), ("int8", 27, 3), ("f32", 30, 8), ("f16", 38, 9)]
    bias = rng.standard_normal(47).astype(np.float32)
    x = inputs(rng, 5, n_in)
    got = run_kernel(kernel_device, parts, bias, x, out_pad=(3, 5), x_pad=(2, 7))
    assert_bits_equal(got, twin_rows(parts, bias, x))


def test_f16_and_f32_scale_segments_in_one_output(kernel_device):
    """Segments with float16 and float32 scales side by side, each on its own kernel; a run
    that mixes them shares one launch with float32 scales."""
    rng = np.random.default_rng(31)
    n_in = 80
    parts = [weight_part("int4", rng, 7, n_in, act_order=True),
             weight_part("int4", rng, 6, n_in, act_order=True, scale_dtype=np.float32),
             weight_part("int4", rng, 5, n_in), weight_part("int4", rng, 4, n_in, scale_dtype=np.float32),
             weight_part("int8", rng, 3, n_in, group=16), weight_part("int2", rng, 9, n_in, scale_dtype=np.float32)]
    packed = pack_linear(parts, None, np, keep_f16=True)
    assert [(s.kernel, s.out_features) for s in packed.segments] == [
        ("int4", 7), ("int4_f32s", 6), ("int4_f32s", 9), ("int8", 3), ("int2_f32s", 9)]
    bias = rng.standard_normal(34).astype(np.float32)
    x = inputs(rng, 3, n_in)
    assert_bits_equal(run_kernel(kernel_device, parts, bias, x), twin_rows(parts, bias, x))


@pytest.mark.exactness
@pytest.mark.parametrize("split_rows", [True, False])
@pytest.mark.parametrize("kind", KINDS)
def test_row_invariance(kernel_device, kind, split_rows, monkeypatch):
    """Row r of a 65-row call has the bits of the same row computed alone, whether the
    launcher spreads the rows over blocks or not."""
    monkeypatch.setattr(launch, "FEW_COLUMN_BLOCKS", 10**9 if split_rows else 0)
    rng = np.random.default_rng(11)
    parts = [weight_part(kind, rng, 10, 90, act_order=kind.startswith("int"))]
    bias = rng.standard_normal(10).astype(np.float32)
    x = inputs(rng, 65, 90)
    together = run_kernel(kernel_device, parts, bias, x)
    for r in (0, 1, 5, 8, 15, 16, 33, 62, 64):
        assert_bits_equal(together[r:r + 1], run_kernel(kernel_device, parts, bias, x[r:r + 1]))
    assert_bits_equal(together[20:27], run_kernel(kernel_device, parts, bias, x[20:27]))


@pytest.mark.parametrize("kind,scale_dtype", KIND_SCALES)
def test_kernel_weights_are_the_dequantized_weights(kernel_device, kind, scale_dtype):
    """x = identity picks out each weight column: the kernel decodes exactly what
    tinyloop.model.quant.dequantize gives (act-order, padding, f16 and f32 scales)."""
    rng = np.random.default_rng(5)
    n_in = 40
    part = weight_part(kind, rng, 6, n_in, group=12 if kind == "int8" else 16,
                       act_order=kind.startswith("int"), scale_dtype=scale_dtype)
    expected = dequantize(part) if isinstance(part, QuantizedTensor) else np.asarray(part, np.float32)
    got = run_kernel(kernel_device, [part], None, np.eye(n_in, dtype=np.float32))  # (in, out) = W.T
    assert_bits_equal(np.ascontiguousarray(got.T), expected)


# -- against the CPU backend and float64 ---------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_rows_kernel_close_to_cpu_backend(kernel_device, kind):
    rng = np.random.default_rng(13)
    n_in = 100
    parts = [weight_part(kind, rng, 12, n_in, act_order=kind.startswith("int")), weight_part(kind, rng, 7, n_in)]
    bias = rng.standard_normal(19).astype(np.float32)
    x = inputs(rng, 4, n_in)
    cpu = NumpyBackend()
    expected = cpu.linear(x, cpu.prepare_linear(parts, bias), exact=True)
    got = run_kernel(kernel_device, parts, bias, x)
    assert np.all(np.abs(got - expected) <= 1e-5 * (magnitude(x, parts) + np.abs(bias)) + 1e-30)


@pytest.mark.parametrize("kind,scale_dtype", KIND_SCALES)
def test_bulk_kernel_close_to_reference(kernel_device, kind, scale_dtype):
    """exact=False with 70 rows: the bulk kernel, two row tiles, a partial column tile."""
    rng = np.random.default_rng(17)
    n_in = 75
    parts = [weight_part(kind, rng, 50, n_in, act_order=kind.startswith("int"), scale_dtype=scale_dtype),
             weight_part(kind, rng, 20, n_in, scale_dtype=scale_dtype)]
    bias = rng.standard_normal(70).astype(np.float32)
    x = inputs(rng, 70, n_in)
    expected = twin.linear_bulk_reference(x, pack_linear(parts, bias, np, keep_f16=True))
    got = run_kernel(kernel_device, parts, bias, x, exact=False, out_pad=(1, 2), x_pad=(3, 0))
    assert np.all(np.abs(got - expected) <= 1e-5 * (magnitude(x, parts) + np.abs(bias)))


@pytest.mark.parametrize("kind,scale_dtype", KIND_SCALES)
def test_tensor_core_kernel_close_to_its_reference(kernel_device, kind, scale_dtype):
    """linear_tc_* (a bulk call with half x and the linear_tc module): 70 rows (two row tiles),
    130 + 20 columns (three column tiles, partial ones), 75 inputs (a partial k step),
    act-order, x and out as views: within float32 summation error of x and W rounded to half
    then multiplied exactly (4e-5 of the sum of magnitudes: room for tensor cores' float32
    accumulation, which may truncate); and that tolerance is tight enough to tell rounded
    weights from unrounded ones."""
    rng = np.random.default_rng(19)
    n_in = 75
    parts = [weight_part(kind, rng, 130, n_in, act_order=kind.startswith("int"), scale_dtype=scale_dtype),
             weight_part(kind, rng, 20, n_in, scale_dtype=scale_dtype)]
    bias = rng.standard_normal(150).astype(np.float32)
    x = inputs(rng, 70, n_in).astype(np.float16)
    packed = pack_linear(parts, bias, np, keep_f16=True)
    expected = twin.linear_tc_reference(x, packed)
    got = run_kernel(kernel_device, parts, bias, x, exact=False, out_pad=(1, 2), x_pad=(3, 0), tensor_cores=True)
    tolerance = 4e-5 * (magnitude(x, parts) + np.abs(bias))
    assert np.all(np.abs(got - expected) <= tolerance), np.abs(got - expected).max()
    if kind != "f16":                    # f16 weights are halves already: rounding changes nothing
        assert np.any(np.abs(twin.linear_bulk_reference(x, packed) - expected) > tolerance)


@pytest.mark.parametrize("options", [(), ("-DTL_NO_TENSOR_CORES",)])
def test_one_mma_follows_the_ptx_fragment_layout(kernel_device, options):
    """mma_16816_lanes: D = A B + C for one warp, with the fragments laid out as the PTX ISA
    describes mma.m16n8k16 (.row.col, f16 inputs, f32 accumulators), written out here on
    its own: on a GPU this checks the real instruction, and with TL_NO_TENSOR_CORES the
    stand-in (the harness always runs the stand-in)."""
    rng = np.random.default_rng(29)
    a = rng.standard_normal((16, 16)).astype(np.float16)
    b = rng.standard_normal((16, 8)).astype(np.float16)
    c = rng.standard_normal((16, 8)).astype(np.float32)

    def pack(low, high):
        return int(np.float16(low).view(np.uint16)) | int(np.float16(high).view(np.uint16)) << 16

    a_regs, b_regs, c_regs = [], [], []
    for lane in range(32):
        g, q = lane // 4, lane % 4
        a_regs += [pack(a[g, 2 * q], a[g, 2 * q + 1]), pack(a[g + 8, 2 * q], a[g + 8, 2 * q + 1]),
                   pack(a[g, 2 * q + 8], a[g, 2 * q + 9]), pack(a[g + 8, 2 * q + 8], a[g + 8, 2 * q + 9])]
        b_regs += [pack(b[2 * q, g], b[2 * q + 1, g]), pack(b[2 * q + 8, g], b[2 * q + 9, g])]
        c_regs += [c[g, 2 * q], c[g, 2 * q + 1], c[g + 8, 2 * q], c[g + 8, 2 * q + 1]]
    d = kernel_device.zeros(128, np.float32)
    fragments = [kernel_device.asarray(np.array(r, dtype)) for r, dtype in
                 ((a_regs, np.uint32), (b_regs, np.uint32), (c_regs, np.float32))]
    kernel_device.module("linear_tc", options).get_function("mma_16816_lanes")((1,), (32,), (*fragments, d))
    got = kernel_device.to_host(d).reshape(32, 4)
    expected = a.astype(np.float64) @ b.astype(np.float64) + c
    for lane in range(32):
        g, q = lane // 4, lane % 4
        want = [expected[g, 2 * q], expected[g, 2 * q + 1], expected[g + 8, 2 * q], expected[g + 8, 2 * q + 1]]
        assert np.allclose(got[lane], want, rtol=1e-5, atol=1e-5), (lane, got[lane], want)


def test_tensor_cores_only_for_bulk_calls_with_half_inputs(kernel_device):
    """The launcher sends exact calls, short calls and float32 x to linear_rows_* / linear_bulk_*
    even with the linear_tc module at hand: their results are those kernels' bits."""
    rng = np.random.default_rng(23)
    parts = [weight_part("int4", rng, 40, 96)]
    for rows, exact, dtype in ((70, True, np.float16), (20, False, np.float16), (70, False, np.float32)):
        x = inputs(rng, rows, 96).astype(dtype)
        assert_bits_equal(run_kernel(kernel_device, parts, None, x, exact=exact, tensor_cores=True),
                          run_kernel(kernel_device, parts, None, x, exact=exact))
    x = inputs(rng, 70, 96).astype(np.float16)
    with_tc = run_kernel(kernel_device, parts, None, x, exact=False, tensor_cores=True)
    assert not np.array_equal(with_tc, run_kernel(kernel_device, parts, None, x, exact=False))


# -- the residual add fused into the epilogue ---------------------------------------------------
@pytest.mark.parametrize("path", ["rows 1", "rows 65", "bulk", "tensor cores"])
@pytest.mark.parametrize("kind", ["int4", "f32"])
def test_a_fused_residual_gives_the_bits_of_the_separate_add(kernel_device, kind, path):
    """linear(..., residual=h) == h + linear(...) bit for bit (NumPy's add as the oracle) on every
    path, two segments, a bias, and h a strided view; out and h may not overlap."""
    rows = {"rows 1": 1, "rows 65": 65}.get(path, 70)
    rng = np.random.default_rng(rows + len(path))
    n_in = 75
    parts = [weight_part(kind, rng, 30, n_in, act_order=kind == "int4"), weight_part(kind, rng, 14, n_in)]
    bias = rng.standard_normal(44).astype(np.float32)
    x = inputs(rng, rows, n_in).astype(np.float16 if path == "tensor cores" else np.float32)
    exact, tensor_cores = path.startswith("rows"), path == "tensor cores"
    packed = pack_linear(parts, bias, SimpleNamespace(asarray=kernel_device.asarray), keep_f16=True)
    wide_h = rng.standard_normal((rows, 50)).astype(np.float32) * np.float32(30)
    h = kernel_device.asarray(wide_h)[:, 3:47]                               # (T, 44), row stride 50
    module, tc = kernel_device.module("linear"), kernel_device.module("linear_tc") if tensor_cores else None
    fused, plain = kernel_device.zeros((rows, 44), np.float32), kernel_device.zeros((rows, 44), np.float32)
    x_dev = kernel_device.asarray(x)
    launch.linear(module, x_dev, packed, fused, exact, tc, residual=h)
    launch.linear(module, x_dev, packed, plain, exact, tc)
    assert_bits_equal(kernel_device.to_host(fused), wide_h[:, 3:47] + kernel_device.to_host(plain))
    with pytest.raises(ValueError, match="must not overlap"):
        launch.linear(module, x_dev, packed, h, exact, tc, residual=h)
    if rows > 1:
        interleaved = kernel_device.zeros((rows, 88), np.float32)         # rows of out between rows of h
        with pytest.raises(ValueError, match="must not overlap"):
            launch.linear(module, x_dev, packed, interleaved[:, :44], exact, tc, residual=interleaved[:, 44:])
    apart = kernel_device.zeros((2 * rows, 44), np.float32)                 # one buffer, disjoint halves: fine
    launch.linear(module, x_dev, packed, apart[:rows], exact, tc, residual=apart[rows:])
    with pytest.raises(ValueError, match="residual must have shape"):
        launch.linear(module, x_dev, packed, plain, exact, tc, residual=h[:, :40])


# -- the MLP's GELU fused into the epilogue ------------------------------------------------------
@pytest.mark.parametrize("path", ["rows 1", "rows 65", "bulk", "tensor cores"])
@pytest.mark.parametrize("out_dtype", [np.float32, np.float16])
def test_a_fused_gelu_gives_the_bits_of_the_separate_activation(kernel_device, path, out_dtype):
    """linear(..., activation="gelu") == the twin's gelu_tanh of linear(...) bit for bit (rounded
    to half for a half output, as the gelu_tanh kernel writes it under fp16 activations) on
    every path, two segments and a bias; a half output needs an activation, an unknown one is
    an error."""
    from tinyloop.backends.reference.twins import elementwise as twin_elementwise
    rows = {"rows 1": 1, "rows 65": 65}.get(path, 70)
    rng = np.random.default_rng(rows + 7 * len(path))
    n_in = 75
    parts = [weight_part("int4", rng, 30, n_in, act_order=True), weight_part("int4", rng, 14, n_in)]
    bias = rng.standard_normal(44).astype(np.float32)
    x = inputs(rng, rows, n_in).astype(np.float16 if path == "tensor cores" else np.float32)
    exact, tensor_cores = path.startswith("rows"), path == "tensor cores"
    packed = pack_linear(parts, bias, SimpleNamespace(asarray=kernel_device.asarray), keep_f16=True)
    module, tc = kernel_device.module("linear"), kernel_device.module("linear_tc") if tensor_cores else None
    fused, plain = kernel_device.zeros((rows, 44), out_dtype), kernel_device.zeros((rows, 44), np.float32)
    x_dev = kernel_device.asarray(x)
    launch.linear(module, x_dev, packed, fused, exact, tc, activation="gelu")
    launch.linear(module, x_dev, packed, plain, exact, tc)
    expected = twin_elementwise.gelu_tanh(kernel_device.to_host(plain)).astype(out_dtype)
    got = kernel_device.to_host(fused)
    assert got.dtype == out_dtype and np.array_equal(got.view(np.uint16 if out_dtype == np.float16 else np.uint32),
                                                     expected.view(np.uint16 if out_dtype == np.float16 else np.uint32))
    with pytest.raises(ValueError, match="activation must be one of"):
        launch.linear(module, x_dev, packed, plain, exact, tc, activation="relu")
    with pytest.raises(ValueError, match="float16 only with an activation"):
        launch.linear(module, x_dev, packed, kernel_device.zeros((rows, 44), np.float16), exact, tc)


# -- fp16 activations: the kernels widen a half x as they stage it ------------------------------
@pytest.mark.parametrize("exact,rows", [(True, 1), (True, 65), (False, 70)])
@pytest.mark.parametrize("kind,scale_dtype", KIND_SCALES)
def test_half_activations_give_the_bits_of_their_widening(kernel_device, kind, scale_dtype, exact, rows):
    """A float16 x (x_half = 1, a strided view in a wider half buffer) gives exactly what the
    same kernel gives for x widened to float32, and on the exact path what the twin gives for
    that widening (a kernel reading half bits as floats, or striding in floats, cannot)."""
    rng = np.random.default_rng(rows + 3 * KINDS.index(kind))
    n_in = 100
    parts = [weight_part(kind, rng, 21, n_in, ODD_GROUP[kind], scale_dtype=scale_dtype)]
    bias = rng.standard_normal(21).astype(np.float32)
    x_half = inputs(rng, rows, n_in).astype(np.float16)
    widened = x_half.astype(np.float32)
    got = run_kernel(kernel_device, parts, bias, x_half, exact=exact, x_pad=(3, 5))
    assert_bits_equal(got, run_kernel(kernel_device, parts, bias, widened, exact=exact))
    if exact:
        assert_bits_equal(got, twin_rows(parts, bias, widened))


def test_twin_close_to_float64():
    """The twin itself against an independent float64 product (no device needed)."""
    rng = np.random.default_rng(19)
    parts = [weight_part("int4", rng, 30, 200, act_order=True), weight_part("f32", rng, 10, 200)]
    x = inputs(rng, 3, 200)
    weight = np.concatenate([dequantize(parts[0]), parts[1]]).astype(np.float64)
    expected = x.astype(np.float64) @ weight.T
    assert np.all(np.abs(twin_rows(parts, None, x) - expected) <= 1e-6 * magnitude(x, parts))


@pytest.mark.parametrize("kind,n_in", [("int4", 2100), ("f32", 300), ("int2", 700)])
def test_twin_follows_the_lane_order_written_out(kind, n_in):
    """The twin's sums against the rows path's order written out word by word (cuda/linear.cu):
    lane l owns the chunk of 4 words from 128 s + 4 l on in each stripe s of 128 words and adds
    its words' products in increasing order, within a word its columns in order, each with one
    rounding (fma_f32); then the butterfly, then the bias. 2,100 int4 inputs: 263 words, two
    whole stripes and a partial one."""
    rng = np.random.default_rng(23)
    parts = [weight_part(kind, rng, 3, n_in)]
    bias = rng.standard_normal(3).astype(np.float32)
    x = inputs(rng, 2, n_in)
    seg = pack_linear(parts, bias, np, keep_f16=True).segments[0]
    weights = twin.stored_weights(seg)                                         # (out, columns)
    stored = twin.stored_inputs(x, seg, n_in)                                  # (T, columns)
    cpw = launch.COLUMNS_PER_WORD[kind]
    expected = np.zeros((2, 3), np.float32)
    for t in range(2):
        for o in range(3):
            lanes = np.zeros(32, np.float32)
            for w in range(seg.words_per_row):
                lane = w % 128 // 4
                for col in range(w * cpw, (w + 1) * cpw):
                    lanes[lane] = fma_f32(weights[o, col], stored[t, col], lanes[lane])
            expected[t, o] = warp_sum(lanes) + bias[o]
    assert_bits_equal(twin.linear_rows_segment(x, seg, n_in), expected)


# -- packing -------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits,group,n_in,act_order", [(2, 8, 50, False), (4, 32, 100, True),
                                                       (8, 6, 45, True), (4, 128, 576, False)])
def test_packing_round_trip(bits, group, n_in, act_order):
    rng = np.random.default_rng(bits)
    part = weight_part(f"int{bits}", rng, 5, n_in, group=group, act_order=act_order)
    dense = rng.standard_normal((3, n_in)).astype(np.float32)
    half = rng.standard_normal((2, n_in)).astype(np.float16)
    packed = pack_linear([part, dense, half], None, np, keep_f16=True)
    quantized = packed.segments[0]
    assert quantized.weights.dtype == np.uint8 and quantized.weights.shape[1] % 16 == 0   # 16-byte rows
    assert quantized.scale.dtype == quantized.min.dtype == np.float16            # RTN's default, kept
    assert packed.segments[1].weights.shape == (3, -(-n_in // 4) * 4)
    assert packed.segments[2].weights.dtype == np.float16 and packed.segments[2].weights.shape[1] % 8 == 0
    weight = twin.dense_weight(packed)                                           # (10, n_in)
    assert np.array_equal(weight[:5], dequantize(part))
    assert np.array_equal(weight[5:8], dense) and np.array_equal(weight[8:], half.astype(np.float32))
    assert packed.nbytes == sum(a.nbytes for s in packed.segments
                                for a in (s.weights, s.scale, s.min, s.perm, s.bias) if a is not None)


@pytest.mark.parametrize("scale_dtype,min_dtype,kept", [
    (np.float16, np.float16, np.float16),        # GGUF Q4_1/Q8_0, RTN, GPTQ run here
    (np.float32, np.float32, np.float32),        # GPTQ imports
    (np.float16, np.float32, np.float32),        # a mix: both widened, one dtype per kernel
    (np.float32, np.float16, np.float32),
    (np.float64, np.float64, np.float32),
])
def test_scales_keep_float16_when_they_can(scale_dtype, min_dtype, kept):
    rng = np.random.default_rng(1)
    part = weight_part("int4", rng, 4, 64)
    part = _bad(part, scale=part.scale.astype(scale_dtype), min=part.min.astype(min_dtype))
    seg = pack_linear([part], None, np).segments[0]
    assert seg.scale.dtype == seg.min.dtype == kept
    assert np.array_equal(seg.scale, part.scale) and np.array_equal(seg.min, part.min)      # values exact
    # a run of parts shares one dtype: float16 only when every part's is
    other = weight_part("int4", rng, 3, 64)
    run = pack_linear([other, part], None, np).segments
    assert len(run) == 1 and run[0].scale.dtype == run[0].min.dtype == kept


@pytest.mark.parametrize("scale_dtype,per_group", [(np.float16, 4), (np.float32, 8)])
def test_nbytes_counts_the_stored_scales(scale_dtype, per_group):
    """SmolLM2-135M's q|k|v (576 -> 960), int4 groups of 32, with a bias: codes, scale+min, bias."""
    rng = np.random.default_rng(2)
    parts = [weight_part("int4", rng, n, 576, scale_dtype=scale_dtype) for n in (576, 192, 192)]
    packed = pack_linear(parts, np.zeros(960, np.float32), np)
    assert packed.nbytes == 960 * 576 // 2 + 960 * (576 // 32) * per_group + 960 * 4


def test_f16_parts_widen_unless_kept():
    half = np.ones((2, 6), np.float16)
    assert pack_linear([half], None, np).segments[0].kind == "f32"
    assert pack_linear([half], None, np, keep_f16=True).segments[0].kind == "f16"


def test_quantized_weights_stay_small():
    rng = np.random.default_rng(0)
    part = weight_part("int4", rng, 64, 256)
    dense = pack_linear([dequantize(part)], None, np)
    assert pack_linear([part], None, np).nbytes < dense.nbytes / 5


def _bad(tensor: QuantizedTensor, **changes) -> QuantizedTensor:
    fields = {"codes": tensor.codes, "scale": tensor.scale, "min": tensor.min, "bits": tensor.bits,
              "group_size": tensor.group_size, "perm": tensor.perm, "in_features": tensor.in_features}
    fields.update(changes)
    return QuantizedTensor(**fields)


def test_bad_layouts_are_refused():
    rng = np.random.default_rng(0)
    good = weight_part("int4", rng, 4, 64)
    cases = [
        ([], None, "at least one weight part"),
        ([good, weight_part("f32", rng, 3, 65)], None, "share the input width"),
        ([good], np.zeros(5), r"bias must have shape \(4,\)"),
        ([_bad(good, perm=np.arange(64, dtype=np.int32)[::-1] % 63)], None, "perm must be a permutation"),
        ([_bad(good, perm=np.arange(32, dtype=np.int32))], None, "perm must be a permutation"),
        ([_bad(good, scale=good.scale[:, :1])], None, r"scale must have shape \(4, 2\)"),
        ([_bad(good, min=good.min[:3])], None, r"min must have shape \(4, 2\)"),
        ([_bad(good, codes=good.codes.astype(np.int16))], None, "codes must be a 2-D uint8"),
        ([_bad(good, bits=3)], None, "bits must be one of"),
        ([_bad(good, group_size=24)], None, "not a multiple of the group size"),
        ([_bad(good, in_features=65)], None, r"in_features must be in \[1, 64\]"),
        ([np.zeros((2, 3), np.int32)], None, "2-D float array"),
        ([np.zeros(3, np.float32)], None, "2-D float array"),
    ]
    for parts, bias, message in cases:
        with pytest.raises(ValueError, match=message):
            pack_linear(parts, bias, np)


def test_bad_arrays_are_refused_by_the_launcher():
    packed = pack_linear([np.ones((4, 8), np.float32)], None, np)
    module = None                                   # refused before any launch
    cases = [(np.ones((2, 9), np.float32), np.zeros((2, 4), np.float32), r"x must have shape \(T, 8\)"),
             (np.ones((2, 8), np.float32), np.zeros((3, 4), np.float32), r"out must have shape \(2, 4\)"),
             (np.ones((2, 8), np.float64), np.zeros((2, 4), np.float32), "x must be float32"),
             (np.ones((8, 2), np.float32).T, np.zeros((2, 4), np.float32), "rows must be contiguous"),
             (np.ones((2, 8), np.float32), np.zeros((2, 4), np.float16), "out must be float32")]
    for x, out, message in cases:
        with pytest.raises(ValueError, match=message):
            launch.linear(module, x, packed, out, exact=True)


# -- real models' shapes -------------------------------------------------------------------------
def test_smollm2_qkv_shape(kernel_device):
    """SmolLM2-135M's fused q|k|v (576 -> 576 + 192 + 192), int4 groups of 128 (stored 640)."""
    rng = np.random.default_rng(23)
    parts = [weight_part("int4", rng, n, 576, group=128) for n in (576, 192, 192)]
    x = inputs(rng, 2, 576)
    assert_bits_equal(run_kernel(kernel_device, parts, None, x), twin_rows(parts, None, x))


@pytest.mark.slow
@pytest.mark.kernel_orders("id")
@pytest.mark.parametrize("parts_shape,rows", [
    (((1536, 576), (1536, 576)), 65),          # SmolLM2 gate|up, a full verify step
    (((576, 1536),), 65),                      # SmolLM2 down
    (((2048, 2048),) * 3, 1),                  # doc-407m q|k|v, one decode row
])
def test_model_shapes(kernel_device, parts_shape, rows):
    rng = np.random.default_rng(29)
    parts = [weight_part("int4", rng, n_out, n_in, group=128) for n_out, n_in in parts_shape]
    x = inputs(rng, rows, parts_shape[0][1])
    assert_bits_equal(run_kernel(kernel_device, parts, None, x), twin_rows(parts, None, x))


# -- the pre-norm fused into the rows kernels' staging -------------------------------------------
def fused_norm_call(device, parts, bias, h, norm, norm_w, norm_b, half, cap=None, fused=True, mma=None):
    """h (T, in) float32 through norm then the linear on the device: fused (one launch that
    stages norm(h)) or as two launches (the norm kernel, its output half where `half`, then the
    linear); mma: an MmaPath (the tensor-core rows), else the rows kernels. -> (T, out) host
    float32."""
    from tinyloop.backends.cuda.launch import elementwise
    packed = pack_linear(parts, bias, SimpleNamespace(asarray=device.asarray), keep_f16=True)
    h_dev = device.asarray(h)
    w_dev = device.asarray(norm_w)
    b_dev = None if norm_b is None else device.asarray(norm_b)
    out = device.zeros((h.shape[0], packed.out_features), np.float32)
    if fused:
        launch.linear(device.module("linear"), h_dev, packed, out, True, column_block_cap=cap, mma=mma,
                      norm=launch.NormFold(norm, w_dev, b_dev, 1e-5, half))
    else:
        x = device.zeros(h.shape, np.float16 if half else np.float32)
        if norm == "rms":
            elementwise.rms_norm(device.module("elementwise"), h_dev, w_dev, 1e-5, x)
        else:
            elementwise.layer_norm(device.module("elementwise"), h_dev, w_dev, b_dev, 1e-5, x)
        launch.linear(device.module("linear"), x, packed, out, True, column_block_cap=cap, mma=mma)
    return device.to_host(out)


@pytest.mark.parametrize("rows,n_in,cap", [(1, 300, None), (1, 2048, 2), (2, 700, 3), (9, 2200, None), (3, 80, None)])
@pytest.mark.parametrize("norm,with_bias", [("rms", False), ("layer", False), ("layer", True)])
@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("kind", ["int4", "int8", "f16", "f32"])
def test_a_fused_norm_gives_the_bits_of_the_norm_launch_then_the_linear(kernel_device, kind, half, norm, with_bias,
                                                                        rows, n_in, cap):
    """The rows kernels staging norm(h) (rms, layer, layer with a bias; its output as float or
    rounded to half) give the bits of the norm kernel then the linear, and the twins' (the norm
    twin, half where half, then the linear twin): decode rows on the resident path (capped grid
    too), 2 rows, 4-row chunks over two tiles then a 1-row chunk, act-order weights."""
    from tinyloop.backends.reference.twins import elementwise as twin_elementwise
    rng = np.random.default_rng(rows * 1000 + n_in)
    parts = [weight_part(kind, rng, 21, n_in, group=32, act_order=kind.startswith("int"))]
    bias = rng.standard_normal(21).astype(np.float32)
    h = (rng.standard_normal((rows, n_in)) * 3 + 0.5).astype(np.float32)
    norm_w = rng.standard_normal(n_in).astype(np.float32)
    norm_b = rng.standard_normal(n_in).astype(np.float32) if with_bias else None
    fused = fused_norm_call(kernel_device, parts, bias, h, norm, norm_w, norm_b, half, cap)
    apart = fused_norm_call(kernel_device, parts, bias, h, norm, norm_w, norm_b, half, cap, fused=False)
    assert_bits_equal(fused, apart)
    normed = (twin_elementwise.rms_norm(h, norm_w, 1e-5) if norm == "rms"
              else twin_elementwise.layer_norm(h, norm_w, norm_b, 1e-5))
    if half:
        normed = normed.astype(np.float16).astype(np.float32)
    assert_bits_equal(fused, twin_rows(parts, bias, normed))


def test_a_fused_norm_is_refused_where_it_cannot_run():
    """Only an exact call with a float32 x takes a fused norm, and an RMS norm
    has no bias: anything else is a clear error, not other bits."""
    rng = np.random.default_rng(3)
    packed = pack_linear([weight_part("int4", rng, 8, 64)], None, np, keep_f16=True)
    out = np.zeros((1, 8), np.float32)
    fold = launch.NormFold("rms", np.ones(64, np.float32), None, 1e-5)
    cases = [(dict(exact=False), "exact path only"),
             (dict(x=np.ones((1, 64), np.float16)), "exact path only"),
             (dict(norm=launch.NormFold("rms", np.ones(64, np.float32), np.ones(64, np.float32), 1e-5)), "no bias"),
             (dict(norm=launch.NormFold("batch", np.ones(64, np.float32), None, 1e-5)), "norm kind")]
    for change, message in cases:
        call = dict(x=np.ones((1, 64), np.float32), exact=True, norm=fold) | change
        with pytest.raises(ValueError, match=message):
            launch.linear(None, call["x"], packed, out, call["exact"], norm=call["norm"])


# -- the SwiGLU fused into the down projection's staging -----------------------------------------
def swiglu_linear_call(device, parts, bias, up, half, cap=None, fused=True, residual=None):
    """up (T, 2 in) float32 = [gate | up] through SwiGLU then the linear on the device: fused (one
    rows launch that stages swiglu(up)) or as two launches (the swiglu kernel, its output half
    where `half`, then the linear). -> (T, out) host float32."""
    from tinyloop.backends.cuda.launch import elementwise
    packed = pack_linear(parts, bias, SimpleNamespace(asarray=device.asarray), keep_f16=True)
    up_dev = device.asarray(up)
    res = None if residual is None else device.asarray(residual)
    out = device.zeros((up.shape[0], packed.out_features), np.float32)
    if fused:
        launch.linear(device.module("linear"), up_dev, packed, out, True, column_block_cap=cap, residual=res,
                      norm=launch.NormFold("swiglu", None, None, 0.0, half))
    else:
        x = device.zeros((up.shape[0], up.shape[1] // 2), np.float16 if half else np.float32)
        elementwise.swiglu(device.module("elementwise"), up_dev, x)
        launch.linear(device.module("linear"), x, packed, out, True, column_block_cap=cap, residual=res)
    return device.to_host(out)


@pytest.mark.parametrize("rows,n_in,cap", [(1, 300, None), (1, 2048, 2), (2, 700, 3), (9, 2200, None), (3, 80, None)])
@pytest.mark.parametrize("half", [False, True])
@pytest.mark.parametrize("kind", ["int4", "int8", "f16"])
def test_a_fused_swiglu_gives_the_bits_of_the_swiglu_launch_then_the_linear(kernel_device, kind, half, rows, n_in,
                                                                            cap):
    """The rows kernels staging swiglu(up) from the up projection's [gate | up] output (as float
    or rounded to half) give the bits of the swiglu kernel then the linear, and the twins' (the
    swiglu twin, half where half, then the linear twin): decode rows on the resident path (capped
    grid too), 2 rows, 4-row chunks over two tiles then a 1-row chunk, act-order weights; with
    the residual add in the same launch."""
    from tinyloop.backends.reference.twins import elementwise as twin_elementwise
    rng = np.random.default_rng(rows * 1000 + n_in + 7)
    parts = [weight_part(kind, rng, 21, n_in, group=32, act_order=kind.startswith("int"))]
    bias = rng.standard_normal(21).astype(np.float32)
    up = (rng.standard_normal((rows, 2 * n_in)) * 3).astype(np.float32)
    residual = rng.standard_normal((rows, 21)).astype(np.float32)
    fused = swiglu_linear_call(kernel_device, parts, bias, up, half, cap, residual=residual)
    apart = swiglu_linear_call(kernel_device, parts, bias, up, half, cap, fused=False, residual=residual)
    assert_bits_equal(fused, apart)
    gated = twin_elementwise.swiglu(up, n_in)
    if half:
        gated = gated.astype(np.float16).astype(np.float32)
    plain = swiglu_linear_call(kernel_device, parts, bias, up, half, cap)
    assert_bits_equal(plain, twin_rows(parts, bias, gated))


def test_a_fused_swiglu_is_refused_where_it_cannot_run():
    """The SwiGLU fold takes [gate | up], twice the linear's inputs, on an exact rows call of
    half-scale or float weights, and no norm weight or bias: anything else is a clear error (the
    backend keeps the swiglu launch for float32-scale weights)."""
    rng = np.random.default_rng(4)
    packed = pack_linear([weight_part("int4", rng, 8, 64)], None, np, keep_f16=True)
    out = np.zeros((1, 8), np.float32)
    fold = launch.NormFold("swiglu", None, None, 0.0)
    cases = [(dict(x=np.ones((1, 64), np.float32)), r"\(T, 128\) \(\[gate \| up\]\)"),
             (dict(exact=False), "exact path only"),
             (dict(norm=launch.NormFold("swiglu", np.ones(64, np.float32), None, 0.0)), "no norm weight"),
             (dict(packed=pack_linear([weight_part("int4", rng, 8, 64, scale_dtype=np.float32)], None, np,
                                      keep_f16=True)), "float32-scale")]
    for change, message in cases:
        call = dict(x=np.ones((1, 128), np.float32), exact=True, norm=fold, packed=packed) | change
        with pytest.raises(ValueError, match=message):
            launch.linear(None, call["x"], call["packed"], out, call["exact"], norm=call["norm"])
    assert launch.swiglu_fold_supported(packed) and not launch.swiglu_fold_supported(cases[-1][0]["packed"])
