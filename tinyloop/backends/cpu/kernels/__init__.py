"""The CPU kernels: compiled with numba, row-invariant, the same bits on every CPU.

Why they exist: BLAS picks its summation order from the call (shapes, strides, row count,
thread count) and from the CPU it runs on, so a row's bits could depend on its neighbours
and on the machine. Every kernel here fixes its arithmetic in our own code instead:

- Each output is reduced in an order that depends only on the model's shapes: in order
  along the reduced axis (the linear kernels, linear.py), or in 16 lanes, lane l taking
  its own fixed subset of the axis in order, then the lanes added in a fixed tree
  (lanes.py). Rows, threads and the call's row count never enter it.
- No fast-math: numba leaves LLVM no licence to reassociate or to fuse a multiply and an
  add into an FMA, so a vectorised loop (16 lanes on AVX-512, 2 x 8 on AVX2, 4 x 4 on SSE2)
  performs the very operations, in the very order, of the scalar loop. Vectorisation runs
  across independent lanes or outputs, never across a reduction.
- No libm: exp and tanh are our own (fmath.py), built of IEEE-754 additions,
  multiplications and exact scalings, which every x86-64 and ARM CPU rounds identically
  (glibc's exp picks an FMA or a plain variant by CPU; NumPy's picks AVX-512 or SSE code).
  sqrt and division are IEEE-exact (correctly rounded) everywhere.

Each kernel has a NumPy oracle (`<kernel>_oracle.py`), written from the same definition with
NumPy's elementwise operations (never a reduction NumPy or BLAS may reorder), which the
tests compare bit for bit; `scripts/logit_fingerprint.py` writes the logits of every forward
path, so runs under NUMBA_CPU_NAME=generic and this CPU's own target can be compared.
"""
import hashlib
import os
import threading
from pathlib import Path

import numba


def _cache_dir() -> str:
    """numba's cache for these kernels: a folder named after a hash of their sources.

    numba keys a cached kernel on its own file only, not on the files of the functions it
    inlines (fmath.py, lanes.py, ...): edit one of those and the kernels that inline it would
    keep running their old machine code. A folder per version of the sources cannot be
    stale. It lives in the user's cache ($NUMBA_CACHE_DIR, else $XDG_CACHE_HOME/tinyloop/numba),
    so an install whose package folder is read-only still caches."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    base = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "tinyloop", "numba")
    return os.path.join(base, digest.hexdigest()[:16])


# read when each kernel module below is imported (cache=True looks it up then)
numba.config.CACHE_DIR = _cache_dir()

# processes that compile at once (Granian workers on a fresh machine, pytest -n 2) must not
# lose or cross each other's cache entries: cache_lock.py
from .cache_lock import lock_cache_saves  # noqa: E402

lock_cache_saves()

# Threads of the kernels: numba's default, every CPU this process may use (NUMBA_NUM_THREADS
# sets another count). Threads split outputs and queries, never a sum, so the count changes
# speed, never bits. Measured on the 2-vCPU development machine, `tinyloop bench` side by
# side with llama.cpp, one thread against two: decode 118 -> 154 tok/s, prefill of 128 tokens
# 343 -> 596 tok/s, a 16-row forward 45 -> 25 ms; serving 8 streams 92.6 -> 131 tok/s, which
# overturned an earlier default of one thread on <= 2 CPUs.

# numba's OpenMP threads spin at a barrier before they sleep, by default for about 300,000
# rounds: when another process holds the other core, a spinning thread keeps the very thread
# it waits for off the CPU, and one linear call measured 7 ms instead of 0.4 ms. A short spin
# costs a wake-up of a few microseconds per parallel call on an idle machine instead. Read by
# libgomp when numba first starts its threads; an explicit setting wins.
os.environ.setdefault("GOMP_SPINCOUNT", "2000")

# LLVM's SLP vectoriser packs the written-out loops of the linear kernels (16 outputs of a
# tile, scripts/gen_linear_kernels.py) into vector registers; numba leaves it off by
# default. It is read when each kernel is compiled, and it never reorders arithmetic
# (without fast-math no vectoriser may), so it changes speed, not bits.
numba.config.SLP_VECTORIZE = 1


def on_a_passing_thread(fn, *args):
    """fn(*args) on a thread of its own that ends when fn returns -> its result (its errors
    re-raised here).

    For the warm-up calls made at load: a thread that runs a threaded kernel keeps a team of
    OpenMP threads for as long as it lives, and once two threads' teams outnumber the CPUs,
    libgomp lets waiting threads spin only briefly, so every parallel call pays a sleep and a
    wake-up. Measured here: a model loaded (and warmed) on the main thread and then run by
    the engine's thread decoded at 75 tok/s against 154 when the load's team was gone. Every
    threaded kernel a load calls (the warm-ups, the RoPE table) therefore runs through here.
    A team ends with its thread, so a load leaves none behind on its caller."""
    failure, result = [], []

    def run():
        try:
            result.append(fn(*args))
        except BaseException as exc:      # noqa: BLE001 - handed to the caller
            failure.append(exc)
    thread = threading.Thread(target=run, name="tinyloop-kernels-at-load")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]
