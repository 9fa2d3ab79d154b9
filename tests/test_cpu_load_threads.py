"""A model load leaves no kernel threads behind on the thread that loaded it.

A thread that runs a threaded numba kernel keeps a team of OpenMP threads while it lives; a
second team (the engine's) then makes libgomp put waiting threads to sleep almost at once,
and decoding ran at half speed (kernels/__init__.py, on_a_passing_thread). So every threaded
kernel a load calls runs on a thread that ends with it: the process has as many threads after
the load as before it.
"""
import subprocess
import sys

from tinyloop.model.testmodels import make_test_model

PROBE = """
import os, sys, time
from tinyloop.model.loader import load_model
import tinyloop.backends.cpu.backend            # numba and the kernels imported before counting
threads = lambda: len(os.listdir("/proc/self/task"))
before = threads()
loaded = load_model(sys.argv[1], "cpu")
# the passing threads' OpenMP workers end a moment after their thread: wait for that state
deadline = time.monotonic() + 30
while threads() > before and time.monotonic() < deadline:
    time.sleep(0.05)
print(before, threads())
"""


def test_loading_a_model_leaves_no_thread_behind(tmp_path):
    path = tmp_path / "tiny.tinyloop"
    make_test_model(path, "tiny-looped", seed=0)
    result = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    before, after = (int(n) for n in result.stdout.split()[-2:])
    assert after <= before, f"{after - before} thread(s) left behind by the load"
