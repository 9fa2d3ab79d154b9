"""numba's on-disk cache made safe for processes that compile at the same time.

numba saves a compiled kernel by reading the function's index file, picking the first data
file number the index does not name, and writing the index, then the data. Two processes
that compile different signatures of one function at once (two Granian workers starting on
a fresh machine, two pytest-xdist workers, two exactness-matrix configurations) can both
read the same index and pick the same number: one index entry is lost, or worse, the index
names a data file the other process then overwrites with another signature's machine code,
which a later process would load and run for the wrong argument types.

`lock_cache_saves()` makes each save one critical section across processes: an exclusive
flock on `<index>.lock`, the index read inside it (so the number is picked from every save
before this one), the data written before the index names it (so a reader that takes no
lock never finds an entry whose data is not there yet). Loads take no lock: both files are
replaced whole (numba writes a temporary file and renames it), so a reader sees an index and
data files that some completed save wrote.
"""
from __future__ import annotations

import contextlib
import itertools
import os

from numba.core import caching

try:
    import fcntl
except ImportError:                      # not POSIX: numba's own save, unlocked
    fcntl = None


@contextlib.contextmanager
def _exclusive(path: str):
    with open(path, "a+b") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _locked_save(self, key, data):
    """IndexDataCacheFile.save, as one critical section across processes (see the module doc)."""
    os.makedirs(self._cache_path, exist_ok=True)
    with _exclusive(self._index_path + ".lock"):
        overloads = self._load_index()
        if key in overloads:                        # a recompile of a saved signature: its file again
            self._save_data(overloads[key], data)
            return
        taken = set(overloads.values())
        data_name = next(name for name in map(self._data_name, itertools.count(1)) if name not in taken)
        self._save_data(data_name, data)            # before the index names it
        overloads[key] = data_name
        self._save_index(overloads)


def lock_cache_saves() -> bool:
    """Install the locked save (once; idempotent). False where there is no flock."""
    if fcntl is None:
        return False
    caching.IndexDataCacheFile.save = _locked_save
    return True
