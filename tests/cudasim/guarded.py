"""NumPy arrays that end right before an inaccessible page.

A kernel reading or writing even one element past the end of such an array faults, and
the harness turns the fault into a KernelError; on an ordinary NumPy array the same bug
reads neighbouring heap memory silently. The array starts 16-byte aligned (vector loads
of a float4 stay legal), so up to 15 poisoned bytes may sit between its end and the page.
"""

import ctypes
import mmap

import numpy as np

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_PROT_NONE = 0


def guarded_empty(shape, dtype=np.float32) -> np.ndarray:
    """An uninitialised-looking array: every byte 0xFF (NaN for floats, -1 for ints)."""
    dtype = np.dtype(dtype)
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if nbytes == 0:
        return np.empty(shape, dtype)
    page = mmap.PAGESIZE
    end = -(-(nbytes + 16) // page) * page  # data pages; the guard page follows
    buffer = mmap.mmap(-1, end + page)
    np.frombuffer(buffer, np.uint8, count=end).fill(0xFF)
    view = ctypes.c_char.from_buffer(buffer)
    address = ctypes.addressof(view)
    del view  # release the export, or the mmap could never be closed
    if _libc.mprotect(address + end, page, _PROT_NONE) != 0:
        raise OSError(ctypes.get_errno(), "mprotect failed for a guarded array")
    start = (end - nbytes) & ~15
    return np.frombuffer(buffer, np.uint8, count=nbytes, offset=start).view(dtype).reshape(shape)


def guarded_zeros(shape, dtype=np.float32) -> np.ndarray:
    out = guarded_empty(shape, dtype)
    out[...] = 0
    return out


def guarded_copy(array, dtype=None) -> np.ndarray:
    """A guarded, C-contiguous copy of `array`."""
    array = np.asarray(array, dtype=dtype)
    out = guarded_empty(array.shape, array.dtype)
    out[...] = array
    return out
