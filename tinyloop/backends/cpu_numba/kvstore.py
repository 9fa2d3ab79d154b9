"""KV storage of the numba backend: the NumPy backend's arrays (backends/cpu/kvstore.py, the
same layout and bytes per row), written by the compiled KV kernel (kernels/kv.py) and read
in place by the attention kernel (kernels/attention.py). The NumPy stores there are the
write kernel's oracle and serve tests and tools (read rows back, quantize). The float
modes' column of ones after hd (the NumPy attention's probability sum) is kept, unread
by the kernels, so the two backends' storage stays the same.
"""
from __future__ import annotations

import numpy as np

from tinyloop.backends.cpu.kvstore import FloatStore, IntStore, KVStorage, bytes_per_row, store_for  # noqa: F401
from tinyloop.backends.cpu_numba.kernels.kv import write as write_rows
from tinyloop.kv.modes import CODE_BITS, group_size


def kv_write(storage: KVStorage, slot: int, rows, keys: np.ndarray, values: np.ndarray) -> None:
    """keys, values (T, n_kv, hd) stored at physical rows (a slice or a (T,) array) of `slot`
    by the compiled kernel (kernels/kv.py; int4-h rotates with rotation.py's FWHT first).
    Its oracle is the NumPy stores (store_for(mode).store of the rotated rows)."""
    bits = CODE_BITS.get(storage.mode, 0)
    group_len = group_size(storage.head_dim)
    for side, x in ((storage.keys, keys), (storage.values, values)):
        write_rows(bits, group_len, storage.mode == "fp16", storage.rotation is not None, side, slot, rows, x)
