"""Programmatic dependent launch (PDL, sm_90 and later), behind TINYLOOP_CUDA_PDL=1.

A decode step is ~170 kernels in a row, each reading what the one before wrote. Launched
plainly, a kernel's blocks are scheduled only once the previous grid has drained: the GPU
idles for the launch gap at every boundary (about 1 us in a graph, ~170 us of a ~700 us
doc-407m step on the paper model). Launched with the attribute
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, the next kernel's blocks may be
scheduled as soon as every block of the previous one has called
`griddepcontrol.launch_dependents`; each then waits in `griddepcontrol.wait` until the
previous grid has finished and its writes are visible. Every kernel in cuda/ begins with
both (cuda/common.cuh `tl_dependent_launch`), before any global read or write, so a kernel
sees exactly the memory it sees when launched alone: the bits cannot change, only the gap
shrinks. Without the attribute the two instructions do nothing.

CuPy launches with cuLaunchKernel, which takes no attributes, so the launch goes through the
driver's cuLaunchKernelEx by ctypes, with CuPy's own rules for turning arguments into
kernel parameters (`kernel_argument`). Stream capture is documented to record the
attribute as a programmatic edge of the graph (CUDA 12.3 and later; not yet seen on a GPU here).

Off by default until a GPU has run scripts/gpu_check.sh with it (README, "On a GPU"): the
harness cannot overlap grids, so only a device can show the gap it saves and that capture
takes the edges.
"""
from __future__ import annotations

import ctypes
import os
import threading

import numpy as np

from tinyloop.backends.cuda.launch.memory import WrappedKernel
from tinyloop.env import env_flag

PROGRAMMATIC_STREAM_SERIALIZATION = 6      # CUlaunchAttributeID in cuda.h
MIN_COMPUTE_CAPABILITY = 90                # griddepcontrol needs sm_90


def dependent_launch_enabled() -> bool:
    """TINYLOOP_CUDA_PDL: off unless 1/true/yes/on; a typo is an error (asgi/settings.py checks
    it at start)."""
    return env_flag(os.environ, "TINYLOOP_CUDA_PDL", False)


# -- the driver's structures, as cuda.h lays them out (scripts/cuda_compile_check.py compiles a
# C program against cuda.h and compares every size and offset with these) ---------------------
class LaunchAttributeValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64),
                ("programmatic_stream_serialization_allowed", ctypes.c_int),
                ("_align", ctypes.c_uint64)]       # the union holds pointers: 8-byte aligned


class LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint), ("pad", ctypes.c_char * 4), ("value", LaunchAttributeValue)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


# CUresult cuLaunchKernelEx(const CUlaunchConfig*, CUfunction, void** kernelParams, void** extra)
LAUNCH_KERNEL_EX = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(LaunchConfig), ctypes.c_void_p,
                                    ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p))


def kernel_argument(value):
    """One kernel parameter as CuPy passes it (cupy/cuda/function.pyx `_pointer`): None a null
    pointer, an array its device address, a NumPy scalar its own bytes, a Python bool, int or
    float a NumPy bool, int64 or float64. -> a ctypes object holding the bytes."""
    if value is None:
        return ctypes.c_void_p(0)
    if isinstance(value, bool):
        value = np.bool_(value)
    elif isinstance(value, int):
        value = np.int64(value)
    elif isinstance(value, float):
        value = np.float64(value)
    if isinstance(value, np.generic):
        raw = value.tobytes()
        return (ctypes.c_char * len(raw)).from_buffer_copy(raw)
    pointer = getattr(getattr(value, "data", None), "ptr", None)
    if isinstance(pointer, int):
        return ctypes.c_void_p(pointer)
    raise TypeError(f"a kernel argument must be a device array, a NumPy scalar, a number or None, "
                    f"not {type(value).__name__}")


def padded(dims) -> tuple[int, int, int]:
    """(x[, y[, z]]) -> three dimensions, each at least 1 (as CuPy's Function.__call__)."""
    dims = tuple(int(d) for d in dims) + (1, 1)
    return max(1, dims[0]), max(1, dims[1]), max(1, dims[2])


class DependentLauncher:
    """Launches a CUfunction through cuLaunchKernelEx with programmatic stream serialization."""

    def __init__(self, launch_kernel_ex, error_name=None):
        self._launch = launch_kernel_ex          # LAUNCH_KERNEL_EX: the driver's, or a test's stand-in
        self._error_name = error_name or (lambda status: f"CUresult {status}")
        # the one attribute every launch carries: made once, not per kernel launch
        self._attribute = LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
        self._attribute.value.programmatic_stream_serialization_allowed = 1

    def __call__(self, name: str, function_ptr: int, grid, block, args, shared_mem: int, stream_ptr: int) -> None:
        config = LaunchConfig(*padded(grid), *padded(block), int(shared_mem), ctypes.c_void_p(stream_ptr),
                              ctypes.pointer(self._attribute), 1)
        values = [kernel_argument(a) for a in args]          # kept alive until the call returns
        params = (ctypes.c_void_p * max(1, len(values)))(*[ctypes.addressof(v) for v in values])
        status = self._launch(ctypes.byref(config), ctypes.c_void_p(function_ptr), params, None)
        if status != 0:
            raise RuntimeError(f"{name}: cuLaunchKernelEx with programmatic dependent launch failed: "
                               f"{self._error_name(status)} (TINYLOOP_CUDA_PDL=0 launches without it)")


def driver_launcher() -> DependentLauncher:
    """The driver's cuLaunchKernelEx (CUDA 12.0 and later drivers), loaded once CuPy has made
    a context (libcuda is then already in the process)."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
        launch = LAUNCH_KERNEL_EX(("cuLaunchKernelEx", driver))
    except (OSError, AttributeError) as error:
        raise RuntimeError("TINYLOOP_CUDA_PDL=1 needs the CUDA driver's cuLaunchKernelEx (a CUDA 12 or "
                           f"later driver): {error}") from error
    get_name = driver.cuGetErrorName
    get_name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]

    def error_name(status: int) -> str:
        text = ctypes.c_char_p()
        return (f"{text.value.decode()} ({status})" if get_name(status, ctypes.byref(text)) == 0 and text.value
                else f"CUresult {status}")
    return DependentLauncher(launch, error_name)


def cupy_stream_ptr(cupy, _made=threading.local()):
    """The current CuPy stream's handle, once the calling thread has the device's context
    current: the driver API launches in the thread's current context, and an engine thread
    may not have one yet. CuPy's own launch ensures it the same way (a runtime call, once a
    thread)."""
    if not getattr(_made, "context", False):
        ensure = getattr(cupy.cuda.runtime, "_ensure_context", None)
        ensure() if ensure is not None else cupy.cuda.runtime.memGetInfo()
        _made.context = True
    return int(cupy.cuda.get_current_stream().ptr)


def function_handle(function) -> int:
    """The CUfunction of a CuPy kernel: RawModule.get_function gives a RawKernel, whose
    .kernel is the loaded Function."""
    return int(getattr(function, "kernel", function).ptr)


class DependentFunction(WrappedKernel):
    """A kernel called as CuPy's are, `f(grid, block, args, shared_mem=0, stream=None)`, launched
    with programmatic dependent launch. Attributes (max_dynamic_shared_size_bytes) read and set
    the wrapped kernel's (WrappedKernel)."""

    def __init__(self, name: str, function, launcher: DependentLauncher, current_stream_ptr):
        super().__init__(function, name=name, launcher=launcher, current_stream_ptr=current_stream_ptr)

    def __call__(self, grid, block, args, shared_mem: int = 0, stream=None):
        current = self.current_stream_ptr()         # also makes the device's context current on this thread
        stream_ptr = current if stream is None else int(stream.ptr)
        self.launcher(self.name, function_handle(self.wrapped), grid, block, args, shared_mem, stream_ptr)


class DependentModule:
    """A CuPy RawModule whose get_function gives DependentFunctions."""

    def __init__(self, module, launcher: DependentLauncher, current_stream_ptr):
        self._module, self._launcher, self._stream_ptr = module, launcher, current_stream_ptr
        self._functions = {}

    def get_function(self, name: str) -> DependentFunction:
        if name not in self._functions:
            self._functions[name] = DependentFunction(name, self._module.get_function(name), self._launcher,
                                                      self._stream_ptr)
        return self._functions[name]
