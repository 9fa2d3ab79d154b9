"""Device memory questions a launcher asks: whether two device arrays may share memory (the same
way for CuPy and NumPy arrays), and a kernel's opt-in to more than 48 KiB of shared memory.

A launcher refuses an output that overlaps an input a kernel still reads (a half output
over its float input, a fused residual under its output): the kernels would read
half-overwritten values. The test is by byte bounds, for both array kinds, so the CPU
harness refuses exactly what a GPU refuses (np.shares_memory would be exact on the
harness and so more lenient than the GPU's bounds)."""
from __future__ import annotations

import numpy as np


def _first_byte(array) -> int:
    data = array.data
    return data.ptr if hasattr(data, "ptr") else array.__array_interface__["data"][0]   # CuPy, NumPy


def byte_bounds(array) -> tuple[int, int]:
    """[low, high) of the bytes the array's elements occupy (views and negative strides included)."""
    start = _first_byte(array)
    low = high = start
    for n, stride in zip(array.shape, array.strides):
        if n == 0:
            return start, start
        low += min(0, (n - 1) * stride)
        high += max(0, (n - 1) * stride)
    return low, high + array.itemsize


def may_overlap(a, b) -> bool:
    (a0, a1), (b0, b1) = byte_bounds(a), byte_bounds(b)
    return a0 < a1 and b0 < b1 and a0 < b1 and b0 < a1


DEFAULT_SHARED_LIMIT = 48 * 1024   # dynamic shared memory a kernel gets without opting in


def allow_shared(function, nbytes: int, kernel: str) -> None:
    """Over 48 KiB a kernel must opt in (CUDA's MAX_DYNAMIC_SHARED_SIZE_BYTES; sm_80 allows up
    to 163 KiB, sm_90 227 KiB): CuPy's Function exposes it as a settable attribute, as do the
    CPU harness's functions (which enforce it) and dependent_launch's. A device that refuses the
    size is an error here, naming the sizes, not a failed launch later; so is a function that
    does not expose the attribute (a wrapper that hides it would fail only at launch)."""
    if nbytes <= DEFAULT_SHARED_LIMIT:
        return
    if not hasattr(function, "max_dynamic_shared_size_bytes"):
        raise TypeError(f"{kernel} needs {nbytes} bytes of shared memory per block, and its function "
                        f"({type(function).__name__}) has no max_dynamic_shared_size_bytes to opt in with")
    if function.max_dynamic_shared_size_bytes >= nbytes:
        return
    try:
        function.max_dynamic_shared_size_bytes = nbytes
    except Exception as error:            # noqa: BLE001 - CuPy raises its CUDA runtime error
        raise RuntimeError(f"{kernel} needs {nbytes} bytes of shared memory per block and the device "
                           f"refuses it ({type(error).__name__}: {error})") from error
    if function.max_dynamic_shared_size_bytes < nbytes:
        raise RuntimeError(f"{kernel} needs {nbytes} bytes of shared memory per block; the device "
                           f"allows {function.max_dynamic_shared_size_bytes}")



class WrappedKernel:
    """A kernel called through a wrapper of ours (a launcher, a launch counter, a timer): what the
    wrapper does not hold itself, such as CuPy's max_dynamic_shared_size_bytes (allow_shared's
    opt-in), is read and set on the kernel underneath, `wrapped`. Subclasses define __call__ and
    pass their own state to __init__ by name."""

    def __init__(self, wrapped, **own):
        object.__setattr__(self, "wrapped", wrapped)
        for name, value in own.items():
            object.__setattr__(self, name, value)

    def __getattr__(self, attribute):           # only what the wrapper does not hold
        return getattr(object.__getattribute__(self, "wrapped"), attribute)

    def __setattr__(self, attribute, value):
        setattr(self.wrapped, attribute, value)

_SHARED_LIMITS: dict = {}      # device id -> its opt-in limit (asked once: a call per layer would cost)


def device_shared_limit(out) -> int:
    """The most dynamic shared memory a block may opt in to on out's device (sm_80 163 KiB,
    sm_86/89 99 KiB, sm_90 227 KiB); the CPU harness allows 227 KiB, as its functions do."""
    if isinstance(out, np.ndarray):
        return 227 * 1024
    import cupy
    device = cupy.cuda.Device()
    if device.id not in _SHARED_LIMITS:
        # cudaDevAttrMaxSharedMemoryPerBlockOptin (97)
        _SHARED_LIMITS[device.id] = int(cupy.cuda.runtime.deviceGetAttribute(97, device.id))
    return _SHARED_LIMITS[device.id]
