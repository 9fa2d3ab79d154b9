"""Programmatic dependent launch (tinyloop/backends/cuda/dependent_launch.py) on the CPU.

What a GPU cannot be asked here, these check: that every kernel's first statement waits for the
previous grid (the condition for the bits to stay those of a plain launch), and that the launch
hands cuLaunchKernelEx the configuration, the attribute and the parameter bytes CuPy's own launch
would (cupy/cuda/function.pyx: None a null pointer, an array its address, a NumPy scalar its
bytes, a Python int an int64, a float a float64). The launch function is a ctypes stand-in with
the driver's signature, so the structures cross a real C call. That the structures match cuda.h
is checked against the header by scripts/cuda_compile_check.py (in CI), and that the PTX of every
sm_90 entry holds the two instructions. Only a GPU shows the overlap itself (scripts/gpu_check.sh).
"""
from __future__ import annotations

import ctypes
import re
import struct
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from tinyloop.backends.cuda import dependent_launch as dl

CUDA_DIR = Path(__file__).resolve().parents[1] / "cuda"


def entry_bodies():
    """(file, kernel, body text) for every extern "C" __global__ entry point in cuda/*.cu."""
    for path in sorted(CUDA_DIR.glob("*.cu")):
        text = path.read_text()
        for match in re.finditer(r'extern "C" __global__', text):
            i, depth = match.end(), 0
            while text[i] != "{" or depth:                 # the first brace outside every parenthesis
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
            header = text[match.end():i]
            name = re.findall(r"(\w+)\s*\(", header)[-1]     # the last call-like word: the kernel's name
            yield path.name, name, text[i + 1:]


def test_every_kernel_waits_for_the_previous_grid_before_anything_else():
    entries = list(entry_bodies())
    assert len(entries) >= 45                                   # every kernel file is read
    late = [f"{f} {name}" for f, name, body in entries
            if not re.sub(r"//[^\n]*", "", body).lstrip().startswith("tl_dependent_launch();")]
    assert late == []


def test_the_wait_comes_before_the_release_and_only_from_sm_90():
    common = (CUDA_DIR / "common.cuh").read_text()
    body = common[common.index("void tl_dependent_launch()"):]
    body = body[:body.index("\n}\n")]
    assert "__CUDA_ARCH__ >= 900" in body
    assert body.index("griddepcontrol.wait;") < body.index("griddepcontrol.launch_dependents;")


class FakeArray:
    """What the launcher reads of a CuPy array: .data.ptr."""

    def __init__(self, address: int):
        self.data = types.SimpleNamespace(ptr=address)


class Driver:
    """cuLaunchKernelEx's stand-in: a real C callback with the driver's signature that decodes
    what it was handed, reading each parameter's bytes at the size the kernel would."""

    def __init__(self, sizes, status: int = 0):
        self.sizes, self.status, self.calls = sizes, status, []
        self.function = dl.LAUNCH_KERNEL_EX(self._launch)

    def _launch(self, config_ptr, function, params, extra):
        c = config_ptr.contents
        attrs = [c.attrs[i] for i in range(c.numAttrs)]
        self.calls.append({
            "grid": (c.gridDimX, c.gridDimY, c.gridDimZ), "block": (c.blockDimX, c.blockDimY, c.blockDimZ),
            "shared": c.sharedMemBytes, "stream": c.hStream or 0, "function": function,
            "attributes": [(a.id, a.value.programmatic_stream_serialization_allowed) for a in attrs],
            "params": [ctypes.string_at(params[i], size) for i, size in enumerate(self.sizes)],
            "extra": bool(extra)})
        return self.status


def test_a_launch_hands_the_driver_cupys_parameter_bytes_and_the_attribute():
    sizes = [8, 4, 8, 4, 8, 8, 1]
    driver = Driver(sizes)
    launch = dl.DependentLauncher(driver.function)
    args = (FakeArray(0x7F00_0000_1000), np.int32(-7), None, np.float32(1.5), -(2**40) - 3, 0.25, True)
    launch("k", 0xABC, (5, 2), (128,), args, 4096, 0x55)
    call, = driver.calls
    assert call["grid"] == (5, 2, 1) and call["block"] == (128, 1, 1)
    assert call["shared"] == 4096 and call["stream"] == 0x55 and call["function"] == 0xABC
    assert call["attributes"] == [(6, 1)] and call["extra"] is False
    assert call["params"] == [struct.pack("<Q", 0x7F00_0000_1000), struct.pack("<i", -7), bytes(8),
                              struct.pack("<f", 1.5), struct.pack("<q", -(2**40) - 3), struct.pack("<d", 0.25), b"\x01"]


@pytest.mark.parametrize("value, raw", [
    (None, bytes(8)), (FakeArray(0x10), struct.pack("<Q", 0x10)), (7, struct.pack("<q", 7)),
    (0.5, struct.pack("<d", 0.5)), (False, b"\x00"), (np.uint8(200), b"\xc8"), (np.float16(1.0), b"\x00\x3c"),
    (np.int64(-1), b"\xff" * 8)])
def test_each_argument_holds_exactly_the_bytes_cupy_passes(value, raw):
    held = dl.kernel_argument(value)
    assert ctypes.string_at(ctypes.addressof(held), ctypes.sizeof(held)) == raw


def test_zero_dimensions_launch_one_block_as_cupy_does_and_no_arguments_pass():
    driver = Driver([])
    dl.DependentLauncher(driver.function)("k", 1, (0,), (0, 0), (), 0, 0)
    assert driver.calls[0]["grid"] == (1, 1, 1) and driver.calls[0]["block"] == (1, 1, 1)


def test_a_refused_launch_names_the_kernel_and_the_error():
    driver = Driver([], status=719)
    launch = dl.DependentLauncher(driver.function, lambda status: f"CUDA_ERROR_LAUNCH_FAILED ({status})")
    with pytest.raises(RuntimeError, match=r"attention_fp16: .*CUDA_ERROR_LAUNCH_FAILED \(719\).*TINYLOOP_CUDA_PDL=0"):
        launch("attention_fp16", 1, (1,), (1,), (), 0, 0)


def test_an_argument_cupy_would_refuse_is_refused():
    with pytest.raises(TypeError, match="list"):
        dl.kernel_argument([1, 2])


class FakeKernel:
    """A CuPy RawKernel as the wrapper sees it: .kernel.ptr and settable attributes."""

    def __init__(self, ptr):
        self.kernel = types.SimpleNamespace(ptr=ptr)
        self.max_dynamic_shared_size_bytes = 48 << 10


def test_a_wrapped_kernel_launches_on_the_current_stream_and_keeps_its_attributes():
    driver = Driver([4])
    kernels = {"argmax_rows": FakeKernel(0x1234)}
    module = dl.DependentModule(types.SimpleNamespace(get_function=kernels.__getitem__),
                                dl.DependentLauncher(driver.function), lambda: 0x77)
    function = module.get_function("argmax_rows")
    assert module.get_function("argmax_rows") is function
    function.max_dynamic_shared_size_bytes = 100 << 10                 # attention's opt-in goes through
    assert kernels["argmax_rows"].max_dynamic_shared_size_bytes == 100 << 10 == function.max_dynamic_shared_size_bytes
    function((3,), (256,), (np.int32(9),))
    function((3,), (256,), (np.int32(9),), shared_mem=64, stream=types.SimpleNamespace(ptr=0x99))
    assert [(c["function"], c["stream"], c["shared"]) for c in driver.calls] == [(0x1234, 0x77, 0), (0x1234, 0x99, 64)]


def test_each_thread_makes_the_context_current_once_before_it_launches():
    """The driver launches in the calling thread's current context: cupy_stream_ptr runs CuPy's
    context check once a thread (as CuPy's own launch does), then gives the current stream."""
    import threading
    ensured = []
    cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(
        runtime=types.SimpleNamespace(_ensure_context=lambda: ensured.append(threading.get_ident())),
        get_current_stream=lambda: types.SimpleNamespace(ptr=0x42)))
    made = threading.local()
    assert [dl.cupy_stream_ptr(cupy, made) for _ in range(3)] == [0x42] * 3
    worker = threading.Thread(target=lambda: [dl.cupy_stream_ptr(cupy, made) for _ in range(2)])
    worker.start()
    worker.join()
    assert len(ensured) == 2 and ensured[0] == threading.get_ident() and ensured[1] != ensured[0]


class FakeCupy(types.ModuleType):
    """Just enough of CuPy for CupyDevice to pick its launch path: a device's compute
    capability, RawModule, the current stream."""

    def __init__(self, capability: str):
        super().__init__("cupy")
        self.__version__ = "fake"
        self.RawModule = lambda code, options: types.SimpleNamespace(get_function=lambda name: FakeKernel(1))
        properties = {"name": b"Some GPU", "major": int(capability[:-1]), "minor": 0, "totalGlobalMem": 80 << 30}
        runtime = types.SimpleNamespace(getDeviceProperties=lambda index: properties, runtimeGetVersion=lambda: 12080)
        self.cuda = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(compute_capability=capability, id=0),
                                          get_current_stream=lambda: types.SimpleNamespace(ptr=0), runtime=runtime)


@pytest.mark.parametrize("capability, asked, wrapped, said", [
    ("90", True, True, "programmatic dependent launch"), ("100", True, True, "programmatic dependent launch"),
    ("80", True, False, "TINYLOOP_CUDA_PDL=1 ignored below sm_90"), ("90", False, False, "plain launches")])
def test_the_device_takes_dependent_launch_only_when_asked_and_from_sm_90(monkeypatch, capability, asked, wrapped,
                                                                          said):
    from tinyloop.backends.cuda import device as device_module
    monkeypatch.setitem(sys.modules, "cupy", FakeCupy(capability))
    monkeypatch.setattr(device_module, "driver_launcher", lambda: dl.DependentLauncher(Driver([]).function))
    device = device_module.CupyDevice(dependent_launch=asked)
    assert device.dependent_launch is wrapped
    assert isinstance(device.module("sampling"), dl.DependentModule) is wrapped
    assert device.describe().endswith(f"CUDA runtime 12.8, {said}")          # the startup log's device line


def test_the_variable_is_read_as_a_flag(monkeypatch):
    monkeypatch.setenv("TINYLOOP_CUDA_PDL", "1")
    assert dl.dependent_launch_enabled() is True
    monkeypatch.setenv("TINYLOOP_CUDA_PDL", "")
    assert dl.dependent_launch_enabled() is False
