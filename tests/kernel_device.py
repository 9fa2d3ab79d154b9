"""pytest plugin: the `kernel_device` fixture, one kernel test for the CPU harness and the GPU.

Without a GPU, a test that takes `kernel_device` runs once per thread order of the CPU
harness (tests/cudasim): "harness:id", "harness:reverse", "harness:random:1". With
TINYLOOP_TEST_DEVICE=cuda and CuPy seeing a GPU, it runs once, on the GPU ("cuda").

    def test_saxpy(kernel_device):
        dev = kernel_device
        fn = dev.module("elementwise").get_function("saxpy")
        y = dev.asarray(np.ones(8, np.float32))
        fn((1,), (8,), (y, dev.asarray(x), np.float32(2), np.int32(8)))
        np.testing.assert_array_equal(dev.to_host(y), expected)

    @pytest.mark.kernel_orders("id")      # a slow kernel: one harness order is enough
    def test_big(kernel_device): ...

TINYLOOP_CUDASIM_ORDERS="id,reverse,random:1,random:2" widens the default set of orders.
"""

import functools
import os
from pathlib import Path

import numpy as np
import pytest
from cudasim import guarded_copy, guarded_empty, guarded_zeros, load_module, parse_order

CUDA_DIR = Path(__file__).resolve().parents[1] / "cuda"
DEFAULT_ORDERS = ("id", "reverse", "random:1")


class HarnessDevice:
    """The CPU harness in one thread order. Arrays are NumPy arrays that end against an
    inaccessible page, so an out-of-bounds kernel access fails the launch."""

    is_gpu = False
    xp = np

    def __init__(self, order: str):
        parse_order(order)
        self.order = order
        self.name = f"harness:{order}"
        self._modules = {}

    def module(self, name: str, options=()):
        """cuda/<name>.cu, compiled once (shared by all orders) and loaded in this order."""
        key = (name, tuple(options))
        if key not in self._modules:
            self._modules[key] = load_module(CUDA_DIR / f"{name}.cu", order=self.order, options=options)
        return self._modules[key]

    def asarray(self, array, dtype=None):
        return guarded_copy(array, dtype)

    def zeros(self, shape, dtype=np.float32):
        return guarded_zeros(shape, dtype)

    def empty(self, shape, dtype=np.float32):
        """Every byte 0xFF (NaN / -1), so output a kernel never writes shows."""
        return guarded_empty(shape, dtype)

    def to_host(self, array):
        return np.array(array, copy=True)

    def synchronize(self):
        pass

    def __repr__(self):
        return self.name


class CupyDevice:
    """The GPU through CuPy, compiling the same sources with NVRTC."""

    is_gpu = True
    name = "cuda"
    order = None

    def __init__(self, cupy):
        self.xp = cupy
        self._modules = {}
        if os.environ.get("TINYLOOP_TEST_NO_MEMORY_POOL") == "1":
            # under compute-sanitizer (scripts/gpu_check.sh): an allocation of its own per array,
            # so memcheck sees a read past one and initcheck does not count pool reuse as written
            cupy.cuda.set_allocator(None)

    def module(self, name: str, options=()):
        key = (name, tuple(options))
        if key not in self._modules:
            code = (CUDA_DIR / f"{name}.cu").read_text()
            from tinyloop.backends.cuda.compile import compile_options    # the backend's own options
            self._modules[key] = self.xp.RawModule(code=code, options=(*compile_options(), *options))
        return self._modules[key]

    def asarray(self, array, dtype=None):
        return self.xp.asarray(np.asarray(array, dtype=dtype))

    def zeros(self, shape, dtype=np.float32):
        return self.xp.zeros(shape, dtype)

    def empty(self, shape, dtype=np.float32):
        """Filled with 0xFF bytes, like the harness's, so unwritten output shows here too."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return self.xp.full(nbytes, 0xFF, np.uint8).view(dtype).reshape(shape)

    def to_host(self, array):
        return self.xp.asnumpy(array)

    def synchronize(self):
        self.xp.cuda.Device().synchronize()

    def __repr__(self):
        return self.name


@functools.cache
def _cupy_or_none():
    """CuPy when TINYLOOP_TEST_DEVICE=cuda asks for it and it sees a GPU."""
    if os.environ.get("TINYLOOP_TEST_DEVICE", "").lower() != "cuda":
        return None
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return cupy
        reason = "CuPy sees no GPU"
    except Exception as error:  # noqa: BLE001 - ImportError, or any CUDA driver/runtime error
        reason = f"CuPy is unusable: {error}"
    # asked for the GPU and not getting it is a failure: a GPU check must not pass on the harness
    raise RuntimeError(f"TINYLOOP_TEST_DEVICE=cuda but {reason}")


_devices = {}


def _device(name: str):
    if name not in _devices:
        _devices[name] = CupyDevice(_cupy_or_none()) if name == "cuda" else HarnessDevice(name[len("harness:"):])
    return _devices[name]


def device_names(orders=None) -> list:
    """The devices a kernel test runs on: the GPU alone, or the harness in each order."""
    if _cupy_or_none() is not None:
        return ["cuda"]
    if not orders:
        configured = os.environ.get("TINYLOOP_CUDASIM_ORDERS", "")
        orders = [o.strip() for o in configured.split(",") if o.strip()] or DEFAULT_ORDERS
    return [f"harness:{order}" for order in orders]


def pytest_configure(config):
    config.addinivalue_line("markers", "kernel_orders(*orders): run this kernel_device test on the CPU harness "
                                       "in these thread orders only (e.g. 'id' for a slow kernel)")


def pytest_generate_tests(metafunc):
    if "kernel_device" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("kernel_orders")
        names = device_names(marker.args if marker else None)
        metafunc.parametrize("kernel_device", names, indirect=True, ids=names)


@pytest.fixture
def kernel_device(request):
    """A HarnessDevice (one thread order) or the CupyDevice; see the module docstring."""
    return _device(request.param)
