"""numba's cache under processes that save at the same time (tinyloop/backends/cpu/kernels/
cache_lock.py): two processes save 150 different signatures each into one function's index at
once; afterwards every key is in the index and loads its own data, none another's."""
import subprocess
import sys
from pathlib import Path


LOCK_MODULE = Path(__file__).resolve().parents[1] / "tinyloop" / "backends" / "cpu" / "kernels" / "cache_lock.py"
SAVES = 150

WORKER = f'''
import importlib.util, os, sys, time
from numba.core.caching import IndexDataCacheFile
spec = importlib.util.spec_from_file_location("cache_lock", {str(LOCK_MODULE)!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
assert module.lock_cache_saves()
cache_dir, worker, start = sys.argv[1], sys.argv[2], sys.argv[3]
cache = IndexDataCacheFile(cache_dir, "kernel", "stamp")
print("ready", flush=True)
while not os.path.exists(start):        # both processes begin their saves together
    time.sleep(0.001)
for i in range({SAVES}):
    cache.save(("signature", worker, i), ("machine code of", worker, i))
'''


def test_two_processes_saving_at_once_lose_and_cross_nothing(tmp_path):
    from numba.core.caching import IndexDataCacheFile
    start = tmp_path / "start"
    (tmp_path / "cache").mkdir()                # as numba's cache makes it before any save
    workers = [subprocess.Popen([sys.executable, "-c", WORKER, str(tmp_path / "cache"), name, str(start)],
                                stdout=subprocess.PIPE, text=True) for name in ("a", "b")]
    for worker in workers:
        assert worker.stdout.readline().strip() == "ready"
    start.write_text("")
    for worker in workers:
        assert worker.wait(timeout=120) == 0
    cache = IndexDataCacheFile(str(tmp_path / "cache"), "kernel", "stamp")
    for name in ("a", "b"):
        for i in range(SAVES):
            assert cache.load(("signature", name, i)) == ("machine code of", name, i), (name, i)
    assert len(list((tmp_path / "cache").glob("kernel.*.nbc"))) == 2 * SAVES


def test_the_kernels_install_the_locked_save():
    import tinyloop.backends.cpu.kernels  # noqa: F401  (installs it on import)
    from numba.core import caching
    from tinyloop.backends.cpu.kernels import cache_lock
    assert caching.IndexDataCacheFile.save is cache_lock._locked_save
