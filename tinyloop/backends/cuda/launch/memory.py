"""Whether two device arrays may share memory, the same way for CuPy and NumPy arrays.

A launcher refuses an output that overlaps an input a kernel still reads (a half output
over its float input, a fused residual under its output): the kernels would read
half-overwritten values. The test is by byte bounds, for both array kinds, so the CPU
harness refuses exactly what a GPU refuses (np.shares_memory would be exact on the
harness and so more lenient than the GPU's bounds)."""
from __future__ import annotations


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
