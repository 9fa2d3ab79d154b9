"""Stacking the rows of several passes of a batched forward (model/batch.py).

Rows that one layer call produced and the forward then split per pass lie together in memory
already: joining them back is a view, no copy. Otherwise each piece is copied into one new
array, a copy per piece: CuPy's own concatenate of many arrays uploads a table of their
addresses from the host, which a step being captured as a CUDA graph may not do
(backends/cuda/graphs.py). Either way the values are the pieces' own bits."""
from __future__ import annotations

import numpy as np

from tinyloop.backends.cuda.launch.attention import address as _address     # CuPy's pointer or NumPy's


def adjacent_rows(arrays: list):
    """arrays that are consecutive, C-contiguous row ranges of one array's memory, in order, of one
    dtype and row shape -> one view spanning them; else None."""
    first = arrays[0]
    owner = getattr(first, "base", None)
    if owner is None or not owner.flags.c_contiguous:
        return None
    itemsize, row_shape = first.itemsize, first.shape[1:]
    stop = _address(first)
    for array in arrays:
        if (array.base is not owner or array.dtype != first.dtype or array.shape[1:] != row_shape
                or not array.flags.c_contiguous or _address(array) != stop):
            return None
        stop += array.nbytes
    start = (_address(first) - _address(owner)) // itemsize
    flat = owner.reshape(-1)                          # a view: the owner is C-contiguous
    return flat[start:start + (stop - _address(first)) // itemsize].reshape((-1,) + row_shape)


def concat_rows(arrays: list):
    """The arrays stacked along their first axis (NumPy or CuPy), as np.concatenate gives them."""
    if len(arrays) == 1:
        return arrays[0]
    joined = adjacent_rows(arrays)
    if joined is not None:
        return joined
    if isinstance(arrays[0], np.ndarray):
        return np.concatenate(arrays)
    import cupy
    out = cupy.empty((sum(a.shape[0] for a in arrays),) + arrays[0].shape[1:], arrays[0].dtype)
    start = 0
    for a in arrays:
        out[start:start + a.shape[0]] = a
        start += a.shape[0]
    return out
