"""The CPU harness for CUDA kernels (tests/cudasim) checked against CUDA's documented
semantics. Expected values are written from the CUDA programming guide, not from the
harness; the kernels are in tests/cudasim/testkernels/."""

import sys
import time
from pathlib import Path

import kernel_device as kd
import numpy as np
import pytest
from cudasim import KernelError, guarded_copy, guarded_empty, load_module

KERNELS = Path(__file__).resolve().parent / "cudasim" / "testkernels"
FULL = 0xFFFFFFFF
UNDEFINED = -1  # what the harness gives for an undefined value: all one bits


def kernels(name, order="id"):
    return load_module(KERNELS / f"{name}.cu", order=order)


def line_of(name, marker):
    """1-based line of the first line of testkernels/<name> containing `marker`."""
    lines = (KERNELS / name).read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if marker in text)


# -- block barriers -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("order", ["id", "reverse", "random:1", "random:2", "random:3"])
def test_missing_syncthreads_shows_outside_thread_id_order(order):
    out = np.zeros(64, np.float32)
    kernels("sync", order).get_function("broadcast_missing_sync")(1, 64, (out,))
    if order == "id":  # thread 0 writes before anyone reads: the bug hides
        assert (out == 42).all()
    else:
        assert not (out == 42).all()
    kernels("sync", order).get_function("broadcast_with_sync")(1, 64, (out,))
    assert (out == 42).all()


def test_divergent_barrier_is_reported_with_file_and_line():
    with pytest.raises(KernelError, match="divergent barrier") as error:
        kernels("sync").get_function("divergent_barrier")(1, 32, (np.zeros(32, np.int32),))
    assert f"sync.cu:{line_of('sync.cu', 'barrier A')}" in str(error.value)
    assert f"sync.cu:{line_of('sync.cu', 'barrier B')}" in str(error.value)


@pytest.mark.parametrize("order", ["id", "reverse", "random:1"])
def test_exited_threads_do_not_hold_up_a_barrier(order):
    out = np.full(64, -7, np.int32)
    kernels("sync", order).get_function("early_exit_barrier")(1, 64, (out, np.int32(40)))
    np.testing.assert_array_equal(out[:40], np.arange(39, -1, -1))
    assert (out[40:] == -7).all()


def test_syncthreads_count_and_or():
    out = np.zeros(96, np.int32)
    kernels("sync", "reverse").get_function("barrier_count")(1, 96, (out,))
    # count of threadIdx.x % 3 == 0 among 96 threads is 32; all(x < 1000) = 1; any(x == 5) = 1
    assert (out == 32 * 100 + 10 + 1).all()


def test_deadlock_between_barrier_and_shuffle_is_reported():
    with pytest.raises(KernelError, match="deadlock") as error:
        kernels("sync").get_function("warp_barrier_deadlock")(1, 32, (np.zeros(32, np.float32),))
    assert f"sync.cu:{line_of('sync.cu', 'never completes')}" in str(error.value)


# -- shared memory --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("order", ["id", "random:5"])
def test_dynamic_shared_memory_sized_by_shared_mem(order):
    n = 3000
    data = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    out = np.zeros(n, np.float32)
    fn = kernels("sync", order).get_function("shared_reverse")
    with pytest.raises(ValueError, match="max_dynamic_shared_size_bytes"):  # over 48 KiB needs the opt-in
        fn(1, 64, (out, data, np.int32(n)), shared_mem=64 * 1024)
    fn(1, 64, (out, data, np.int32(n)), shared_mem=4 * n)
    np.testing.assert_array_equal(out, data[::-1])
    fn.max_dynamic_shared_size_bytes = 100 * 1024
    big = np.arange(20000, dtype=np.float32)
    out = np.zeros_like(big)
    fn(1, 128, (out, big, np.int32(big.size)), shared_mem=4 * big.size)
    np.testing.assert_array_equal(out, big[::-1])


@pytest.mark.parametrize("order", ["id", "reverse"])
def test_shared_memory_is_poisoned_at_each_block_start(order):
    out = np.zeros(128, np.uint32)
    kernels("sync", order).get_function("read_unwritten_shared")(2, 64, (out,))
    assert (out[:64] == 7).all()
    assert (out[64:] == FULL).all()  # block 1 never wrote: poison, not block 0's values
    out[:] = 0
    kernels("sync", order).get_function("read_unwritten_dynamic")(2, 64, (out,), shared_mem=256)
    assert (out[:64] == 7).all()
    assert (out[64:] == FULL).all()


def test_dynamic_shared_arrays_share_one_address():
    out = np.zeros(32, np.uint32)
    kernels("sync").get_function("dynamic_arrays_alias")(1, 32, (out,), shared_mem=128)
    assert (out == 0x3F800000).all()  # the bits of 1.0f


def test_local_arrays_start_poisoned_in_each_launch():
    out = np.zeros(32, np.float32)
    kernels("sync").get_function("write_local")(1, 32, (out,))
    np.testing.assert_array_equal(out, np.arange(32) % 16)
    kernels("sync").get_function("read_unwritten_local")(1, 32, (out,))
    assert np.isnan(out).all()


# -- warp collectives -----------------------------------------------------------------------------------------

def lanes(rule):
    """Expected per-lane values for a 64-thread block: two warps, lane = thread % 32."""
    return np.array([rule(t % 32) for t in range(64)], np.int32)


# (mode, arg, width, expected value seen by each lane): every lane offers 100 + lane.
SHUFFLES = {
    # __shfl_xor_sync: lane ^ laneMask
    "xor 1": (3, 1, 32, lambda lane: 100 + (lane ^ 1)),
    "xor 16": (3, 16, 32, lambda lane: 100 + (lane ^ 16)),
    # width 16: lanes 0-15 would read the later group (lanes 16-31) and get their own value;
    # lanes 16-31 may read the earlier group.
    "xor 16 width 16": (3, 16, 16, lambda lane: 100 + lane if lane < 16 else 100 + lane - 16),
    "xor 2 width 4": (3, 2, 4, lambda lane: 100 + (lane ^ 2)),
    # __shfl_down_sync: lane + delta inside the width-segment, else the caller's own value
    "down 1": (2, 1, 32, lambda lane: 100 + lane + 1 if lane < 31 else 100 + lane),
    "down 4 width 16": (2, 4, 16, lambda lane: 100 + lane + 4 if lane % 16 < 12 else 100 + lane),
    # __shfl_up_sync: lane - delta inside the width-segment, else the caller's own value
    "up 3": (1, 3, 32, lambda lane: 100 + lane - 3 if lane >= 3 else 100 + lane),
    "up 1 width 16": (1, 1, 16, lambda lane: 100 + lane - 1 if lane % 16 >= 1 else 100 + lane),
    # __shfl_sync: srcLane modulo width, inside the caller's segment
    "idx 5": (0, 5, 32, lambda lane: 105),
    "idx 9 width 8": (0, 9, 8, lambda lane: 100 + (lane // 8) * 8 + 1),
    "idx 35": (0, 35, 32, lambda lane: 103),
}


@pytest.mark.parametrize("order", ["id", "reverse", "random:1"])
@pytest.mark.parametrize("case", list(SHUFFLES))
def test_shuffles_follow_cuda_semantics(case, order):
    mode, arg, width, rule = SHUFFLES[case]
    out = np.zeros(64, np.int32)
    kernels("warp", order).get_function("shuffle")(1, 64, (out, np.int32(mode), np.int32(arg), np.int32(width)))
    np.testing.assert_array_equal(out, lanes(rule))


def test_ballot_with_partial_masks():
    out = np.zeros(32, np.uint32)
    kernels("warp", "reverse").get_function("ballot_partial")(1, 32, (out,))
    assert (out[:16] == 0x0000AAAA).all()  # odd lanes among 0..15
    assert (out[16:] == 0x49240000).all()  # lanes 18, 21, 24, 27, 30 (multiples of 3 among 16..31)


def test_vote_reduce_and_match():
    votes, sums, groups = np.zeros(32, np.int32), np.zeros(32, np.uint32), np.zeros(32, np.uint32)
    kernels("warp", "random:2").get_function("vote")(1, 32, (votes, sums, groups))
    assert (votes == 1 + 2 + 0).all()  # any(lane == 7), all(lane < 32), not all(lane < 31)
    assert (sums == sum(range(32))).all()
    np.testing.assert_array_equal(groups, [0xFF << (8 * (lane // 8)) for lane in range(32)])


def test_partial_mask_shuffle_and_exited_lanes():
    out = np.zeros(32, np.int32)
    kernels("warp").get_function("shuffle_partial_mask")(1, 32, (out,))
    np.testing.assert_array_equal(out[:15], 101 + np.arange(15))
    assert out[15] == UNDEFINED  # its source, lane 16, is not in the mask
    assert (out[16:] == -5).all()
    out = np.full(32, -9, np.int32)
    kernels("warp", "reverse").get_function("shuffle_after_exit")(1, 32, (out,))
    np.testing.assert_array_equal(out[:16], 100 + (np.arange(16) ^ 1))
    assert (out[16:] == -9).all()


def test_mismatched_warp_collectives_are_reported():
    with pytest.raises(KernelError, match="warp collective mismatch"):
        kernels("warp").get_function("mask_mismatch")(1, 32, (np.zeros(32, np.int32),))


def test_warp_sum_is_the_same_in_every_order():
    data = np.random.default_rng(1).standard_normal(32).astype(np.float32)
    results = []
    for order in ("id", "reverse", "random:7"):
        out = np.zeros(32, np.float32)
        kernels("warp", order).get_function("warp_sum")(1, 32, (out, data))
        assert (out == out[0]).all()
        results.append(out[0])
    assert results[0] == results[1] == results[2]
    np.testing.assert_allclose(results[0], data.astype(np.float64).sum(), rtol=1e-5)


# -- failures become exceptions -------------------------------------------------------------------------------

def test_assert_and_trap_fail_the_launch_and_the_process_survives():
    out = np.zeros(32, np.int32)
    with pytest.raises(KernelError, match=r"assertion .* failed .*faults.cu:\d+") as error:
        kernels("faults").get_function("assert_lane")(1, 32, (out, np.int32(3)))
    assert "thread (3,0,0)" in str(error.value)
    with pytest.raises(KernelError, match=r"__trap\(\) called at .*faults.cu"):
        kernels("faults").get_function("trap_lane")(1, 32, (out, np.int32(9)))
    kernels("faults").get_function("assert_lane")(1, 32, (out, np.int32(-1)))
    assert (out == 1).all()


def test_memory_faults_fail_the_launch():
    fn = kernels("faults").get_function
    with pytest.raises(KernelError, match="invalid memory access at address 0x8"):
        fn("write_to_address")(1, 1, (np.uint64(8),))
    data = guarded_copy(np.arange(32, dtype=np.float32))
    out = np.zeros(32, np.float32)
    fn("copy_shifted")(1, 32, (out, data, np.int32(0)))
    with pytest.raises(KernelError, match="invalid memory access"):  # one element past the end
        fn("copy_shifted")(1, 32, (out, data, np.int32(1)))
    with pytest.raises(KernelError, match="stack overflow"):
        fn("deep_recursion")(1, 2, (np.zeros(2, np.int32), np.int32(1_000_000)))
    with pytest.raises(KernelError, match="integer division by zero"):
        fn("divide")(1, 4, (np.zeros(4, np.int32), np.int32(0)))
    fn("copy_shifted")(1, 32, (out, data, np.int32(0)))  # the module still works afterwards
    np.testing.assert_array_equal(out, data)


def test_a_spinning_thread_is_stopped_by_the_watchdog(monkeypatch):
    monkeypatch.setenv("CUDASIM_TIMEOUT", "1")
    start = time.perf_counter()
    with pytest.raises(KernelError, match="ran longer than 1 s"):
        kernels("faults", "reverse").get_function("spin_on_flag")(1, 2, (np.zeros(2, np.int32),))
    assert time.perf_counter() - start < 5


# -- arguments and geometry -----------------------------------------------------------------------------------

def test_argument_type_mismatches_raise_type_error():
    fn = kernels("types").get_function("saxpy")
    y, x = np.zeros(4, np.float32), np.ones(4, np.float32)
    fn(1, 4, (y, x, np.float32(2), np.int32(4)))
    bad = {
        "takes 4 arguments": (y, x, np.float32(2)),
        r"'n' \(int n\) needs a np.int32 scalar, got a Python int": (y, x, np.float32(2), 4),
        r"'a' \(float a\) needs a np.float32 scalar, got np.float64": (y, x, np.float64(2), np.int32(4)),
        r"'a' \(float a\) needs a np.float32 scalar, got a float32 array": (y, x, np.zeros(1, np.float32),
                                                                         np.int32(4)),
        r"'x' \(const float\* __restrict__ x\) needs a NumPy array, got np.float32": (y, np.float32(1),
                                                                                     np.float32(2), np.int32(4)),
        r"'y' \(float\* y\) needs a NumPy array, got a Python list": ([0.0], x, np.float32(2), np.int32(4)),
    }
    for message, args in bad.items():
        with pytest.raises(TypeError, match=message):
            fn(1, 4, args)
    with pytest.raises(TypeError, match="grid"):
        fn(1.0, 4, (y, x, np.float32(2), np.int32(4)))
    with pytest.raises(ValueError, match="at most 1024 threads"):
        fn(1, (64, 32), (y, x, np.float32(2), np.int32(4)))
    with pytest.raises(ValueError, match="thread order"):
        load_module(KERNELS / "types.cu", order="backwards")


def test_every_scalar_type_arrives_intact():
    out = np.zeros(6, np.float64)
    kernels("types").get_function("scalars")(1, 1, (out, np.int32(-7), np.float32(0.25), np.uint32(4000000000),
                                                    np.uint8(200), np.int64(-2**40), np.float64(1e300)))
    np.testing.assert_array_equal(out, [-7, 0.25, 4000000000, 200, -2**40, 1e300])


@pytest.mark.parametrize("order", ["id", "random:3"])
def test_3d_grid_and_block_indices(order):
    grid, block = (2, 3, 4), (4, 2, 3)
    ids = np.zeros((2 * 3 * 4 * 4 * 2 * 3, 6), np.uint32)
    dims = np.zeros(6, np.uint32)
    kernels("types", order).get_function("ids_3d")(grid, block, (ids, dims))
    np.testing.assert_array_equal(dims, block + grid)
    # global position = linear block id * threads per block + linear thread id, x fastest
    bz, by, bx, tz, ty, tx = np.meshgrid(*(np.arange(n) for n in grid[::-1] + block[::-1]), indexing="ij")
    expected = np.stack([tx, ty, tz, bx, by, bz], axis=-1).reshape(-1, 6)
    np.testing.assert_array_equal(ids, expected)


# -- __half ---------------------------------------------------------------------------------------------------

def test_half_conversions_match_numpy():
    rng = np.random.default_rng(2)
    values = rng.standard_normal(20000) * 10.0 ** rng.uniform(-9, 6, 20000)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 65504, 65519.99, 65520, 2**-24, 2**-25, 2**-25 * 1.0001,
               3 * 2**-26, 1 + 2**-11, 1 + 3 * 2**-12,
               1 + 2**-11 + 2**-40]  # a double just above a half midpoint: rounding via float would tie
    as_double = np.concatenate([values, special])
    as_float = as_double.astype(np.float32)
    n = as_double.size
    from_float, back, from_double = np.zeros(n, np.float16), np.zeros(n, np.float32), np.zeros(n, np.float16)
    kernels("types").get_function("half_convert")(8, 128, (from_float, back, from_double, as_float, as_double,
                                                           np.int32(n)))
    with np.errstate(over="ignore"):  # values past 65520 become inf, as intended
        expected_float, expected_double = as_float.astype(np.float16), as_double.astype(np.float16)
    assert_same_halves(from_float, expected_float)
    assert_same_halves(from_double, expected_double)
    np.testing.assert_array_equal(back, expected_float.astype(np.float32))


def assert_same_halves(actual, expected):
    """Bit for bit, except that any NaN matches any NaN."""
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(actual), nan)
    np.testing.assert_array_equal(actual.view(np.uint16)[~nan], expected.view(np.uint16)[~nan])


def test_half_arithmetic_matches_numpy():
    rng = np.random.default_rng(3)
    a = (rng.standard_normal(5000) * 100).astype(np.float16)
    b = (rng.standard_normal(5000) * 10).astype(np.float16)
    out = np.zeros((4, a.size), np.float16)
    kernels("types").get_function("half_arith")(4, 256, (out, a, b, np.int32(a.size)))
    with np.errstate(over="ignore", divide="ignore"):
        expected = np.stack([a + b, a - b, a * b, a / b])
    assert_same_halves(out.ravel(), expected.ravel())


def test_device_api_sample():
    f, i = np.zeros(15, np.float32), np.zeros(16, np.int32)
    kernels("api", "random:4").get_function("api_sample")(1, 32, (f, i))
    np.testing.assert_array_equal(f, [
        7, 0.25, 3, 0.5, 1, np.inf,
        1.0, 1 + 2**-10, -(1 + 2**-10),  # half steps are 2^-10 just above 1: rz, ru, rd
        1.5, 3.5, 1.0, 0.5, 32, 10])
    np.testing.assert_array_equal(i, [
        8, 31, 4, -2**31, 2, 4, -2, 2**31 - 1,  # cvt.rni rounds half to even and saturates
        -4, 4, 0x3F800000, 31, 0x77553311, 2, 1, 0x3C00])


def test_half_fma_rounds_once():
    rng = np.random.default_rng(5)
    a, b, c = (rng.choice([-1, 1], 30000) * rng.uniform(1 / 16, 8, 30000)).astype(np.float16).reshape(3, -1)
    out = np.zeros(a.size, np.float16)
    kernels("types").get_function("half_fma")(8, 128, (out, a, b, c, np.int32(a.size)))
    # a*b+c of halves in [1/16, 8] spans under 53 bits: exact in float64, so one rounding to half
    exact = a.astype(np.float64) * b + c
    np.testing.assert_array_equal(out, exact.astype(np.float16))


# -- compilation and speed ------------------------------------------------------------------------------------

def test_modules_are_cached_and_defines_reach_the_source(tmp_path):
    source = tmp_path / "define.cu"
    source.write_text('extern "C" __global__ void value(int* out) { out[0] = VALUE; }\n')
    out = np.zeros(1, np.int32)
    for value in (3, 4):
        load_module(source, options=(f"-DVALUE={value}",)).get_function("value")(1, 1, (out,))
        assert out[0] == value
    start = time.perf_counter()
    load_module(source, options=("-DVALUE=3",))
    assert time.perf_counter() - start < 0.5  # no second compile


def test_int4_gemv_576x1536_is_fast_and_right():
    rows, cols, group = 576, 1536, 64
    rng = np.random.default_rng(4)
    codes = rng.integers(0, 16, (rows, cols), dtype=np.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)  # low nibble first
    scale = rng.uniform(0.01, 0.02, (rows, cols // group)).astype(np.float32)
    minimum = rng.uniform(-0.1, 0.0, (rows, cols // group)).astype(np.float32)
    x = rng.standard_normal(cols).astype(np.float32)
    out = guarded_empty(rows, np.float32)
    fn = kernels("gemv").get_function("gemv_int4")
    args = (out, guarded_copy(packed), guarded_copy(scale), guarded_copy(minimum), guarded_copy(x),
            np.int32(rows), np.int32(cols), np.int32(group))
    fn(rows // 8, 256, args)  # warm-up: first-touch of fiber stacks
    start = time.perf_counter()
    fn(rows // 8, 256, args)
    elapsed = time.perf_counter() - start
    weight = codes * np.repeat(scale, group, axis=1).astype(np.float64) + np.repeat(minimum, group, axis=1)
    np.testing.assert_allclose(out, weight @ x, rtol=1e-4, atol=1e-4)
    assert elapsed < 1.0, f"int4 GEMV 576x1536 took {elapsed:.3f} s on the harness"


# -- the kernel_device fixture --------------------------------------------------------------------------------

def test_fixture_devices_default_to_three_harness_orders(monkeypatch):
    monkeypatch.delenv("TINYLOOP_TEST_DEVICE", raising=False)
    monkeypatch.delenv("TINYLOOP_CUDASIM_ORDERS", raising=False)
    assert kd.device_names() == ["harness:id", "harness:reverse", "harness:random:1"]
    assert kd.device_names(("id",)) == ["harness:id"]
    monkeypatch.setenv("TINYLOOP_CUDASIM_ORDERS", "id,random:9")
    assert kd.device_names() == ["harness:id", "harness:random:9"]


def test_fixture_loads_modules_by_name(kernel_device, monkeypatch):
    if kernel_device.is_gpu:
        pytest.skip("the harness-only checks of the fixture (this run is on a GPU)")
    monkeypatch.setattr(kd, "CUDA_DIR", KERNELS)
    device = kd.HarnessDevice(kernel_device.order)
    y = device.asarray(np.ones(100, np.float32))
    x = device.asarray(np.arange(100, dtype=np.float32))
    device.module("types").get_function("saxpy")(4, 32, (y, x, np.float32(2), np.int32(100)))
    np.testing.assert_array_equal(device.to_host(y), 2 * np.arange(100) + 1)
    assert np.isnan(device.empty(3)).all() and (device.zeros((2, 2), np.int32) == 0).all()


def test_fixture_runs_on_cupy_when_asked_and_a_gpu_is_seen(monkeypatch):
    compiled = []

    class FakeCupy:  # just enough of CuPy's surface for the fixture's wiring
        class cuda:
            class runtime:
                @staticmethod
                def getDeviceCount():
                    return 1

        @staticmethod
        def RawModule(code, options):
            compiled.append((code, options))
            return "module"

        asarray = staticmethod(np.asarray)
        asnumpy = staticmethod(np.asarray)

    monkeypatch.setitem(sys.modules, "cupy", FakeCupy)
    monkeypatch.setenv("TINYLOOP_TEST_DEVICE", "cuda")
    kd._cupy_or_none.cache_clear()
    monkeypatch.setattr(kd, "_devices", {})
    try:
        assert kd.device_names(("id",)) == ["cuda"]
        device = kd._device("cuda")
        assert device.is_gpu and device.xp is FakeCupy and device.module("attention") == "module"
        from tinyloop.backends.cuda.compile import compile_options
        assert compiled[0][1] == compile_options()          # what the CUDA backend compiles with
        assert compiled[0][1][:2] == ("-std=c++17", f"-I{kd.CUDA_DIR}")
    finally:
        kd._cupy_or_none.cache_clear()


def test_asking_for_the_gpu_without_one_fails_instead_of_testing_the_harness(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)            # `import cupy` raises ImportError
    monkeypatch.setenv("TINYLOOP_TEST_DEVICE", "cuda")
    kd._cupy_or_none.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="TINYLOOP_TEST_DEVICE=cuda but CuPy is unusable"):
            kd.device_names(("id",))
    finally:
        kd._cupy_or_none.cache_clear()


@pytest.mark.kernel_orders("reverse")
def test_kernel_orders_marker_picks_one_order(kernel_device):
    assert kernel_device.name in ("harness:reverse", "cuda")
