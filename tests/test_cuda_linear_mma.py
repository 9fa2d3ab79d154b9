"""cuda/linear_mma.cu (the exact path's linear on tensor cores, 1-16 rows a tile) against its
twin bit for bit on the harness, against float64 within the half-rounding tolerance anywhere,
and row invariance, run through the `kernel_device` fixture (the CPU harness, or a GPU)."""
import re
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tinyloop.backends.cuda.launch import linear as launch
from tinyloop.backends.cuda.launch.packing import pack_linear
from tinyloop.backends.reference.twins import linear as twin
from tinyloop.model.quant import quantize_rtn

from test_cuda_linear import assert_bits_equal, fused_norm_call, magnitude, weight_part

pytestmark = pytest.mark.harness       # the kernels run on the CPU harness (or a GPU): scripts/exactness_matrix.py


class Scratch:
    """The backend's side of an MmaPath: one partials buffer and one counters buffer, kept
    (so a test can see the counters left zero)."""

    def __init__(self, device):
        self.device = device
        self.partials = None
        self.counter_array = device.zeros(4096, np.uint32)

    def scratch(self, n):
        self.partials = self.device.empty(n, np.float32)       # 0xFF: a partial never written shows
        return self.partials

    def counters(self, n):
        assert n <= self.counter_array.size
        return self.counter_array[:n]

    def path(self, shared_limit=None):
        return launch.MmaPath(self.device.module("linear_mma"), self.scratch, self.counters, shared_limit)


def run_mma(device, parts, bias, x, residual=None, activation=None, out_dtype=np.float32, x_pad=(0, 0),
            scratch=None, shared_limit=None):
    """The launcher with an MmaPath on the device (shared_limit: the path's); x a view inside a
    wider buffer. -> host out."""
    packed = pack_linear(parts, bias, SimpleNamespace(asarray=device.asarray), keep_f16=True)
    rows, n_in = x.shape
    wide = np.full((rows, x_pad[0] + n_in + x_pad[1]), np.nan, x.dtype)        # NaN: a stray read shows
    wide[:, x_pad[0]:x_pad[0] + n_in] = x
    x_dev = device.asarray(wide)[:, x_pad[0]:x_pad[0] + n_in]
    out = device.empty((rows, packed.out_features), out_dtype)
    scratch = scratch or Scratch(device)
    launch.linear(device.module("linear"), x_dev, packed, out, True, None,
                  None if residual is None else device.asarray(residual), activation,
                  mma=scratch.path(shared_limit))
    return device.to_host(out)


def int4_part(rng, n_out, n_in, group=32):
    weight = rng.standard_normal((n_out, n_in)).astype(np.float32) / np.sqrt(n_in)
    return quantize_rtn(weight, 4, group, np.float16)


def on_gpu(device) -> bool:
    return device.is_gpu


# -- bit for bit against the twin (the harness runs the mma stand-in the twin spells out) ---------
@pytest.mark.parametrize("x_pad", [(3, 1), (4, 4)], ids=["misaligned", "aligned"])
@pytest.mark.parametrize("rows", [1, 5, 16, 17, 33])
@pytest.mark.parametrize("n_in,group", [(576, 32), (100, 32), (1024, 64), (640, 128)])
def test_mma_kernel_equals_twin(kernel_device, rows, n_in, group, x_pad):
    """150 columns (a partial column block: 3 column blocks, so k splits, at most 4 ways), 576
    inputs (3 splits of 2 chunks, the last half empty), 100 (one split: the epilogue without a
    sum, padded columns), 1024 with groups of 64 (4 whole splits) and 640 with groups of 128
    (3; a group spanning a lane's 32 columns and more); 1 to 33 rows (one, two and three row
    tiles: past one tile the last block adds the splits); a bias. x a view: 3 floats into its
    buffer (rows not 16-byte aligned: the checked staging) or 4 (aligned, the row stride not
    the width: the 16-byte staging where the items are whole, 1024's). On a GPU the tensor
    cores add their own way: within a tolerance there."""
    rng = np.random.default_rng(rows * 1000 + n_in)
    parts = [int4_part(rng, 150, n_in, group)]
    bias = rng.standard_normal(150).astype(np.float32)
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    got = run_mma(kernel_device, parts, bias, x, x_pad=x_pad)
    expected = twin.linear_mma(x, pack_linear(parts, bias, np))
    if on_gpu(kernel_device):
        assert np.all(np.abs(got - expected) <= 1e-5 * (magnitude(x, parts) + np.abs(bias)))
    else:
        assert_bits_equal(got, expected)


def test_the_splits_are_a_function_of_the_weight_alone():
    """The splits of the model shapes: one where the column blocks reach MMA_TARGET_BLOCKS (no
    sum), else enough to make up the difference, never more than MMA_MAX_SPLITS nor one per
    chunk; the twin uses the launcher's choice. And the parts a block takes: all the splits (3
    on 4 parts), or one a block past a tile of rows."""
    assert (launch.MMA_TARGET_BLOCKS, launch.MMA_MAX_SPLITS) == (64, 4)
    assert launch.mma_split_k(2048, 50257) == 2048        # the head: 786 column blocks, one split
    assert launch.mma_split_k(2048, 6144) == 2048         # doc-407m qkv: 96 column blocks
    assert launch.mma_split_k(2048, 8192) == 2048         # up: 128
    assert launch.mma_split_k(8192, 2048) == 4096         # down: 32 column blocks, 2 splits of 8 batches
    assert launch.mma_split_k(2048, 2048) == 1024         # out: 2 splits of 2 batches
    assert launch.mma_split_k(576, 960) == 256            # SmolLM2 qkv: 15 column blocks, 4 wanted: 3 of 2 chunks
    assert launch.mma_split_k(1536, 576) == 384           # down: 9 column blocks, 4 splits of 3 chunks
    assert launch.mma_split_k(640, 64) == 256             # 1 column block: 4 splits wanted, 3 of 2 chunks
    assert launch.mma_split_k(128, 64) == 128
    assert [launch.mma_parts(splits, 1) for splits in (1, 2, 3, 4)] == [1, 2, 4, 4]
    assert [launch.mma_parts(3, rows) for rows in (16, 17)] == [4, 1]


def launched_parts(monkeypatch) -> list:
    """The parts of each linear_mma launch from now on, read back from its shared memory."""
    parts, run = [], launch._Launch.run

    def recording(self):
        if self.name == "linear_mma_int4":
            parts.append(self.shared // (2 * launch.MMA_XS_PART_BYTES))
        run(self)
    monkeypatch.setattr(launch._Launch, "run", recording)
    return parts


@pytest.mark.parametrize("x_pad", [(1, 2), (4, 4)], ids=["misaligned", "aligned"])
@pytest.mark.parametrize("n_out,n_in,rows", [(70, 640, 1), (150, 1280, 5), (64, 1280, 16), (150, 576, 17),
                                             (64, 1536, 16), (150, 1536, 5), (150, 768, 16)])
def test_a_blocks_parts_change_no_bit(kernel_device, monkeypatch, n_out, n_in, rows, x_pad):
    """The same splits added by a block's warps in shared memory (2 or 4 parts: 3 splits on 4
    parts leaves a warp idle) or by the last block from the partials (1 part): the same bits,
    and the twin's, with 1 to 17 rows; each forced count reaches the launch (its shared memory).
    x's rows misaligned (the checked staging) or aligned: 1536 inputs are 4 whole splits of 3
    chunks, staged by the 16-byte loop, whose threads on 4 parts take two parts each (an item's
    threads, 2, fewer than the parts); 768 are 3 whole splits on 4 parts, the fourth staging
    nothing (its columns would lie past the row: past the last row's, a fault here)."""
    rng = np.random.default_rng(n_in * 3 + rows)
    parts = [int4_part(rng, n_out, n_in)]
    bias = rng.standard_normal(n_out).astype(np.float32)
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    split_k = launch.mma_split_k(n_in, n_out)
    assert -(-n_in // split_k) in (3, 4)
    runs, launched = {}, launched_parts(monkeypatch)
    for forced in (1, 2, 4):
        monkeypatch.setattr(launch, "mma_parts", lambda splits, n_rows, limit, forced=forced: forced)
        runs[forced] = run_mma(kernel_device, parts, bias, x, x_pad=x_pad)
    assert launched == [1, 2, 4]
    assert_bits_equal(runs[2], runs[1])
    assert_bits_equal(runs[4], runs[1])
    if not on_gpu(kernel_device):
        assert_bits_equal(runs[1], twin.linear_mma(x, pack_linear(parts, bias, np)))


def test_a_device_of_less_shared_memory_takes_fewer_parts(kernel_device, monkeypatch):
    """4 parts want 129 KiB of shared memory a block: a device allowing 99 KiB (sm_86, sm_89)
    gets 2, one under 65 KiB 1, with the same bits; and the kernel's staging buffers are the
    size the launcher asks for (its #defines, read from the source)."""
    assert [launch.mma_parts(4, 1, limit) for limit in (227 << 10, 163 << 10, 99 << 10, 48 << 10, None)] == \
        [4, 4, 2, 1, 4]
    assert [launch.mma_parts(2, 1, limit) for limit in (99 << 10, 48 << 10)] == [2, 1]
    four = launch.mma_shared_bytes(4)                      # the static shared memory counts too
    assert [launch.mma_parts(4, 1, four + extra) for extra in (0, launch.MMA_STATIC_SHARED)] == [2, 4]
    rng = np.random.default_rng(4)
    parts = [int4_part(rng, 64, 1280)]
    x = rng.standard_normal((2, 1280)).astype(np.float32)
    launched = launched_parts(monkeypatch)
    runs = [run_mma(kernel_device, parts, None, x, shared_limit=limit) for limit in (None, 99 << 10, 48 << 10)]
    assert launched == [4, 2, 1]
    assert_bits_equal(runs[1], runs[0])
    assert_bits_equal(runs[2], runs[0])
    source = (Path(__file__).resolve().parent.parent / "cuda" / "linear_mma.cu").read_text()
    defines = dict(re.findall(r"^#define (MMA_\w+) (.+?)(?:\s*//.*)?$", source, re.M))
    def value(name):
        expression = re.sub(r"MMA_\w+", lambda m: str(value(m.group(0))), defines[name])
        return eval(expression, {"__builtins__": {}})          # integer arithmetic on the kernel's constants
    assert value("MMA_XS_WORDS") * 4 == launch.MMA_XS_PART_BYTES
    assert (value("MMA_THREADS"), value("MMA_BLOCK_COLS"), value("MMA_CHUNK"), value("MMA_MAX_CHUNKS"),
            value("MMA_TILE_ROWS"), value("MMA_WARPS")) == (launch.MMA_THREADS, launch.MMA_BLOCK_COLS,
                                                            launch.MMA_CHUNK, launch.MMA_MAX_CHUNKS,
                                                            launch.MMA_TILE_ROWS, launch.MMA_MAX_PARTS)


def test_parts_other_than_one_two_or_four_trap(kernel_device, monkeypatch):
    """The kernel's staging indexes a block's parts by shifts: a launch with 3 parts traps rather
    than stage the wrong columns (on a GPU a trap leaves the context unusable: the harness shows it)."""
    if on_gpu(kernel_device):
        return
    rng = np.random.default_rng(2)
    monkeypatch.setattr(launch, "mma_parts", lambda splits, n_rows, limit: 3)
    monkeypatch.setattr(launch, "MMA_BLOCK_COLS", 63)             # 21 columns a block: the grid still covers
    with pytest.raises(Exception, match="trap"):
        run_mma(kernel_device, [int4_part(rng, 64, 640)], None, rng.standard_normal((1, 640)).astype(np.float32))


def test_a_refused_opt_in_launches_nothing(kernel_device):
    """The shared memory over 48 KiB is opted in for every launch of a call before the first
    runs: a function that cannot opt in (here one hiding the attribute) fails the call with
    nothing launched (a qkv whose rows segment had run would leave the KV fold's counters
    counted), and names the kernel."""
    rng = np.random.default_rng(6)
    parts = [weight_part("int8", rng, 16, 1280), int4_part(rng, 64, 1280)]     # rows, then linear_mma
    packed = pack_linear(parts, None, SimpleNamespace(asarray=kernel_device.asarray), keep_f16=True)
    launched = []

    class Hiding:                  # a module whose functions run but expose no opt-in
        def __init__(self, module):
            self.module = module

        def get_function(self, name):
            function = self.module.get_function(name)
            return lambda *args, **kwargs: launched.append(name) or function(*args, **kwargs)

    out = kernel_device.empty((2, packed.out_features), np.float32)
    path = launch.MmaPath(Hiding(kernel_device.module("linear_mma")), Scratch(kernel_device).scratch,
                          Scratch(kernel_device).counters)
    x = kernel_device.asarray(rng.standard_normal((2, 1280)).astype(np.float32))
    with pytest.raises(TypeError, match="linear_mma_int4 needs [0-9]+ bytes"):
        launch.linear(Hiding(kernel_device.module("linear")), x, packed, out, True, mma=path)
    assert launched == []


@pytest.mark.parametrize("target,n_out,n_in,rows", [(1, 150, 1280, 17), (1, 70, 1000, 3), (2, 64, 1280, 1),
                                                    (2, 64, 700, 6), (2, 64, 700, 16)])
def test_splits_of_several_batches(kernel_device, monkeypatch, target, n_out, n_in, rows):
    """A split of 10 chunks (batches of 4, 4 and 2: the next batch's weights loading while one
    is summed, the staging buffers alternating), a partial last chunk (1000 inputs), two
    splits of 5 chunks each (a batch of 4 and one of 1, then the reduction), and two of 3 (700
    inputs: a batch of 3 chunks, whose threads of items 48 to 63 stage no item of their own but
    take the edge items, 39 to 47 of the last part, with the rest): the twin's bits on the
    harness, and each row alone equals itself among the others."""
    monkeypatch.setattr(launch, "MMA_TARGET_BLOCKS", target)
    rng = np.random.default_rng(n_in + rows)
    parts = [int4_part(rng, n_out, n_in)]
    bias = rng.standard_normal(n_out).astype(np.float32)
    x = rng.standard_normal((rows, n_in)).astype(np.float32)
    got = run_mma(kernel_device, parts, bias, x)
    expected = twin.linear_mma(x, pack_linear(parts, bias, np))
    if on_gpu(kernel_device):
        assert np.all(np.abs(got - expected) <= 1e-5 * (magnitude(x, parts) + np.abs(bias)))
    else:
        assert_bits_equal(got, expected)
    assert_bits_equal(run_mma(kernel_device, parts, bias, x[-1:])[0], got[-1])


# -- what the exactness rule asks: a row's bits are its own -------------------------------------
@pytest.mark.exactness
def test_mma_row_invariance(kernel_device):
    """Each of 33 rows computed alone equals the same row in the 33-row call (three row tiles,
    the rows at different places within a tile), bit for bit: on the harness and on a GPU."""
    rng = np.random.default_rng(5)
    parts = [int4_part(rng, 70, 576)]
    bias = rng.standard_normal(70).astype(np.float32)
    x = rng.standard_normal((33, 576)).astype(np.float32)
    together = run_mma(kernel_device, parts, bias, x)
    for t in (0, 7, 15, 16, 24, 32):
        alone = run_mma(kernel_device, parts, bias, x[t:t + 1])
        assert_bits_equal(alone[0], together[t])
    # and within a 16-row tile: a verify's rows, shifted by one, change nothing
    shifted = run_mma(kernel_device, parts, bias, x[1:17])
    assert_bits_equal(shifted, together[1:17])


# -- against float64: what the half rounding costs, from an independent computation ---------------
def half_by_struct(value: float) -> float:
    """The nearest half to a Python float, by the struct module's 'e' format (round half to even):
    an implementation of its own, not NumPy's."""
    return struct.unpack("e", struct.pack("e", value))[0]


def test_mma_weights_are_the_once_rounded_halves():
    """Every code 0..15 of int4 rows with random half scales and mins: the twin's weight is
    struct's half of the exact code * scale + min (one rounding, as __hfma2)."""
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((8, 64)).astype(np.float32)
    tensor = quantize_rtn(weight, 4, 32, np.float16)
    tensor.scale = (rng.standard_normal(tensor.scale.shape) * 3).astype(np.float16)
    tensor.min = (rng.standard_normal(tensor.min.shape) * 40).astype(np.float16)
    tensor.codes = rng.integers(0, 256, tensor.codes.shape, dtype=np.uint8)
    seg = pack_linear([tensor], None, np).segments[0]
    got = twin.mma_weights(seg)
    for o in range(8):
        for j in range(64):
            byte = int(tensor.codes[o, j // 2])
            code = byte & 15 if j % 2 == 0 else byte >> 4
            exact = code * float(tensor.scale[o, j // 32]) + float(tensor.min[o, j // 32])
            assert got[o, j] == half_by_struct(exact), (o, j)


@pytest.mark.parametrize("x_dtype", [np.float32, np.float16])
def test_mma_kernel_close_to_float64(kernel_device, x_dtype):
    """Within what rounding x and the weights to half allows (each 2^-11 relative, plus float32
    sums) of float64 x @ W.T + bias with W the stored float32 weights; and the halves show: some
    output is further from it than float32 sums alone would put it (2^-17 of the magnitudes)."""
    rng = np.random.default_rng(11)
    parts = [int4_part(rng, 96, 512)]
    bias = rng.standard_normal(96).astype(np.float32)
    x = rng.standard_normal((9, 512)).astype(x_dtype)
    got = run_mma(kernel_device, parts, bias, x)
    packed = pack_linear(parts, bias, np)
    exact = twin.linear_bulk_reference(x, packed)
    scale = magnitude(x, parts) + np.abs(bias)
    error = np.abs(got - exact)
    assert np.all(error <= 2 ** -10 * scale), (error / scale).max()
    assert np.any(error > 2 ** -17 * scale)


# -- the epilogue, the fallbacks, the counters ----------------------------------------------------
@pytest.mark.parametrize("fusion", ["residual", "gelu half"])
def test_mma_epilogue_is_the_shared_one(kernel_device, fusion):
    """A fused residual or GELU (half out) on the mma path: the bits of the separate operations
    on its plain result (the rows kernels' epilogue, linear_kinds.cuh), two splits or one."""
    rng = np.random.default_rng(13)
    for n_in in (256, 100):
        parts = [int4_part(rng, 80, n_in)]
        bias = rng.standard_normal(80).astype(np.float32)
        x = rng.standard_normal((3, n_in)).astype(np.float32)
        plain = run_mma(kernel_device, parts, bias, x)
        if fusion == "residual":
            residual = rng.standard_normal((3, 80)).astype(np.float32)
            got = run_mma(kernel_device, parts, bias, x, residual=residual)
            assert_bits_equal(got, residual + plain)
        else:
            from tinyloop.backends.reference.twins.elementwise import gelu_tanh
            got = run_mma(kernel_device, parts, bias, x, activation="gelu", out_dtype=np.float16)
            assert np.array_equal(got.view(np.uint16), gelu_tanh(plain).astype(np.float16).view(np.uint16))


def test_segments_the_mma_path_does_not_take_stay_on_the_rows_kernels(kernel_device):
    """A fused output of an eligible int4 part, an act-order int4 part, int8, int4 with float32
    scales and groups of 16: the first through linear_mma_int4 (its twin's bits), the others
    with linear_rows_* bits, each in its columns."""
    rng = np.random.default_rng(17)
    n_in = 128
    parts = [int4_part(rng, 40, n_in), weight_part("int4", rng, 24, n_in, act_order=True),
             weight_part("int8", rng, 16, n_in), weight_part("int4", rng, 8, n_in, scale_dtype=np.float32),
             int4_part(rng, 8, n_in, group=16)]
    packed = pack_linear(parts, None, np)
    assert [launch.mma_eligible(s) for s in packed.segments] == [True, False, False, False, False]
    x = rng.standard_normal((4, n_in)).astype(np.float32)
    got = run_mma(kernel_device, parts, None, x)
    expected = twin.linear_mma(x, packed)
    rows_bits = twin.linear_rows(x, packed)
    if on_gpu(kernel_device):
        assert np.all(np.abs(got[:, :40] - expected[:, :40]) <= 1e-5 * magnitude(x, parts[:1]))
    else:
        assert_bits_equal(got, expected)
    assert_bits_equal(got[:, 40:], rows_bits[:, 40:])
    assert not np.array_equal(expected[:, :40], rows_bits[:, :40])     # the mma part differs from rows


def test_counters_are_left_zero_and_a_second_launch_repeats_the_bits(kernel_device):
    """The last block resets its counter: after a launch of several splits every counter is
    zero, and the same launch again (a replayed graph) gives the same bits."""
    rng = np.random.default_rng(19)
    parts = [int4_part(rng, 130, 640)]
    x = rng.standard_normal((18, 640)).astype(np.float32)
    scratch = Scratch(kernel_device)
    first = run_mma(kernel_device, parts, None, x, scratch=scratch)
    assert not kernel_device.to_host(scratch.counter_array).any()
    second = run_mma(kernel_device, parts, None, x, scratch=scratch)
    assert_bits_equal(second, first)


# -- the pre-norm folded into the tensor-core rows' staging --------------------------------------
def mma_norm_call(device, parts, bias, h, norm, norm_w, norm_b, half, fused=True):
    """h (T, in) float32 through the norm then the linear on the tensor-core rows: fused (one
    linear_mma launch staging norm(h), each row's statistics summed by one warp) or as two
    launches (the norm kernel's 256 threads, then linear_mma). -> (T, out) host float32."""
    return fused_norm_call(device, parts, bias, h, norm, norm_w, norm_b, half, fused=fused,
                           mma=Scratch(device).path())


@pytest.mark.parametrize("rows,n_in,group", [(1, 576, 32), (5, 100, 32), (16, 1024, 64), (17, 640, 128),
                                             (1, 2200, 32), (3, 2200, 32)])
@pytest.mark.parametrize("norm,with_bias", [("rms", False), ("layer", False), ("layer", True)])
@pytest.mark.parametrize("half", [False, True])
def test_a_folded_norm_gives_the_bits_of_the_norm_launch_then_linear_mma(kernel_device, rows, n_in, group, norm,
                                                                         with_bias, half):
    """linear_mma staging norm(h) (rms, layer, layer with a bias; the norm's output as float or
    rounded to half) gives the bits of the norm kernel then linear_mma, bit for bit on the
    harness and on a GPU (the statistics: the same 256 sums in the same tree, eight a lane; the
    staged value: the norm kernel's function). Decode's one row, a partial and a full tile and
    two tiles, several splits (576, 640), padded columns (100, 2200), and rows wider than one
    norm batch of the 256 threads (2200 > 2048: each sums two). On the harness also the twins':
    the norm twin (half where half), then the mma twin."""
    from tinyloop.backends.reference.twins import elementwise as twin_elementwise
    rng = np.random.default_rng(rows * 1000 + n_in)
    parts = [int4_part(rng, 70, n_in, group)]
    bias = rng.standard_normal(70).astype(np.float32)
    h = (rng.standard_normal((rows, n_in)) * 3 + 0.5).astype(np.float32)
    norm_w = rng.standard_normal(n_in).astype(np.float32)
    norm_b = rng.standard_normal(n_in).astype(np.float32) if with_bias else None
    fused = mma_norm_call(kernel_device, parts, bias, h, norm, norm_w, norm_b, half)
    apart = mma_norm_call(kernel_device, parts, bias, h, norm, norm_w, norm_b, half, fused=False)
    assert_bits_equal(fused, apart)
    if not on_gpu(kernel_device):
        normed = (twin_elementwise.rms_norm(h, norm_w, 1e-5) if norm == "rms"
                  else twin_elementwise.layer_norm(h, norm_w, norm_b, 1e-5))
        if half:
            normed = normed.astype(np.float16).astype(np.float32)
        assert_bits_equal(fused, twin.linear_mma(normed, pack_linear(parts, bias, np)))


def test_a_folded_norm_keeps_each_rows_bits_its_own(kernel_device):
    """Each row staged through the folded norm alone equals the same row among 17 (a second tile
    too): the statistics are each row's own, whichever rows share the block."""
    rng = np.random.default_rng(23)
    parts = [int4_part(rng, 70, 576)]
    h = (rng.standard_normal((17, 576)) * 2).astype(np.float32)
    norm_w = rng.standard_normal(576).astype(np.float32)
    norm_b = rng.standard_normal(576).astype(np.float32)
    together = mma_norm_call(kernel_device, parts, None, h, "layer", norm_w, norm_b, False)
    for t in (0, 9, 16):
        alone = mma_norm_call(kernel_device, parts, None, h[t:t + 1], "layer", norm_w, norm_b, False)
        assert_bits_equal(alone[0], together[t])


def test_the_swiglu_fold_is_refused_with_tensor_core_rows():
    """linear_mma stages no SwiGLU: a call with an MmaPath and the swiglu fold is a clear error
    before anything launches (the backend keeps the swiglu launch for it)."""
    rng = np.random.default_rng(29)
    packed = pack_linear([int4_part(rng, 8, 64)], None, np, keep_f16=True)
    mma = launch.MmaPath(None, lambda n: None, lambda n: None)
    with pytest.raises(ValueError, match="rows kernels only"):
        launch.linear(None, np.ones((1, 128), np.float32), packed, np.zeros((1, 8), np.float32), True, mma=mma,
                      norm=launch.NormFold("swiglu", None, None, 0.0))
