"""The CUDA device as the CUDA backend sees it: CuPy arrays, kernel modules, transfers.

The backend (backend.py) touches the GPU only through this object, so the test suite
can hand it a device made of NumPy arrays and the CPU harness that runs the very same
.cu sources (tests/cudasim), and run the whole CUDA backend end to end on the CPU.
"""
from __future__ import annotations

import numpy as np

from tinyloop.backends.cuda.compile import compile_options, kernel_path
from tinyloop.backends.cuda.dependent_launch import (MIN_COMPUTE_CAPABILITY, DependentModule, cupy_stream_ptr,
                                                     dependent_launch_enabled, driver_launcher)
from tinyloop.backends.cuda.launch.linear import ROWS_BLOCKS_PER_SM

ARENA_BYTES = 256 << 20      # a captured step's arena when its warm-up was not measured (doc-407m decode: ~10 MiB)
ARENA_SLACK = 4 << 20        # on top of what the warm-up allocated (alignment, the host-side plan's uploads)
EXTRA_HINT = "pip install -e '.[cuda12]' (CUDA 12) or '.[cuda13]' (CUDA 13)"


def cuda_unavailable() -> str | None:
    """None when CuPy is installed and sees a GPU, else why not (for the startup log and errors)."""
    try:
        import cupy
    except ImportError:
        return f"CuPy is not installed; {EXTRA_HINT}"
    except Exception as error:                         # noqa: BLE001 - a broken CUDA install says why
        return f"CuPy failed to import ({type(error).__name__}: {error})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as error:                         # noqa: BLE001 - no driver, no device
        return f"CuPy finds no usable GPU ({type(error).__name__}: {error})"
    return None if count > 0 else "CuPy finds no GPU"


KV_POOL_SHARE = 0.5              # of the free device memory, for the default KV pool


class CupyDevice:
    """The GPU: CuPy arrays, RawModules compiled with NVRTC from cuda/*.cu."""
    name = "cuda"

    def __init__(self, dependent_launch: bool | None = None):
        import cupy
        self.xp = cupy
        self._modules = {}
        self._stream = None
        # programmatic dependent launch (dependent_launch.py): asked for (TINYLOOP_CUDA_PDL=1) and
        # an sm_90 or later device; below sm_90 the request is reported by describe() and ignored
        asked = dependent_launch_enabled() if dependent_launch is None else dependent_launch
        self.dependent_launch_asked = asked
        self.dependent_launch = asked and int(cupy.cuda.Device().compute_capability) >= MIN_COMPUTE_CAPABILITY
        self._launcher = driver_launcher() if self.dependent_launch else None

    def module(self, name: str):
        if name not in self._modules:
            module = self.xp.RawModule(code=kernel_path(name).read_text(), options=compile_options())
            if self._launcher is not None:
                module = DependentModule(module, self._launcher, lambda: cupy_stream_ptr(self.xp))
            self._modules[name] = module
        return self._modules[name]

    @property
    def column_block_cap(self) -> int:
        """The rows linear's blocks the device holds at once (launch/linear.py column_block_cap)."""
        if not hasattr(self, "_column_block_cap"):
            sms = self.xp.cuda.runtime.deviceGetAttribute(16, self.xp.cuda.Device().id)   # MultiProcessorCount
            self._column_block_cap = int(sms) * ROWS_BLOCKS_PER_SM
        return self._column_block_cap

    @property
    def tensor_cores(self) -> bool:
        """mma.sync m16n8k16 with f16 inputs (cuda/linear_tc.cu) needs sm_80 or later."""
        return int(self.xp.cuda.Device().compute_capability) >= 80

    def kv_pool_bytes(self) -> int:
        """The default KV pool: half the device memory free once the weights are loaded (the
        rest stays for activations, scratch and CUDA graphs' arenas)."""
        free, _total = self.xp.cuda.runtime.memGetInfo()
        return int(free * KV_POOL_SHARE)

    def asarray(self, host, dtype=None):
        return self.xp.asarray(host, dtype=dtype)

    def to_host(self, array) -> np.ndarray:
        return self.xp.asnumpy(array)

    def synchronize(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()

    def upload_ints(self, buffer, values) -> None:
        """values -> an int32 device buffer of their length, in one copy, on the stream graphs
        replay on (after the work queued so far), and before anything queued next on the current
        stream: an eager kernel after a block table's upload reads the new table."""
        with self._ordered_graph_stream():
            buffer.set(np.asarray(values, np.int32))
        self.wait_for_uploads()

    def wait_for_uploads(self) -> None:
        """The current stream waits for what upload_ints and copy_into queued on the graph stream
        (each of them ends with it: a non-blocking stream and the default one order nothing
        between them by themselves)."""
        self.xp.cuda.get_current_stream().wait_event(self._graph_stream().record())

    def copy_into(self, target, source) -> None:
        """target[...] = source on the device, on the stream graphs replay on, after the work
        that produced source (a draft forward on the current stream), and before what the
        current stream does next."""
        with self._ordered_graph_stream():
            target[...] = source
        self.wait_for_uploads()

    def _graph_stream(self):
        if self._stream is None:
            self._stream = self.xp.cuda.Stream(non_blocking=True)
        return self._stream

    def _ordered_graph_stream(self):
        """The graph stream, made to wait for everything queued so far on the current stream
        (a non-blocking stream does not wait for the default one by itself)."""
        stream = self._graph_stream()
        stream.wait_event(self.xp.cuda.get_current_stream().record())
        return stream

    def measure(self, step):
        """Run step() as usual, counting the device bytes it allocates. -> (result, bytes)."""
        cp = self.xp
        pool, total = cp.get_default_memory_pool(), [0]

        def counting(size):
            total[0] += -(-size // 256) * 256
            return pool.malloc(size)
        with cp.cuda.using_allocator(counting):
            result = step()
        return result, total[0]

    def capture(self, step, arena_bytes=None):
        """Record step() as a CUDA graph on a stream of its own, every allocation from an arena
        kept with the graph (arena_bytes: what the step's warm-up allocated; None: ARENA_BYTES);
        launch it once. -> (replay, the step's result), replay() relaunching it (the result's
        memory is rewritten in place). A replay does not wait on the host: the current stream
        waits for it on the device, so whatever reads the result next (the greedy ids' copy to
        the host, an eager kernel) runs after it, and the next replay waits for those readers."""
        cp = self.xp
        stream = self._ordered_graph_stream()
        arena = Arena(cp, ARENA_BYTES if arena_bytes is None else arena_bytes + ARENA_SLACK)
        with cp.cuda.using_allocator(arena.malloc), stream:
            stream.begin_capture()
            try:
                result = step()
            finally:
                graph = stream.end_capture()

        def replay():
            self._ordered_graph_stream()
            graph.launch(stream)
            cp.cuda.get_current_stream().wait_event(stream.record())
        replay.arena = arena                  # the graph's memory lives as long as its replay
        # for benchmarks (scripts/bench_gpu.py): launch without waiting, on the stream to time
        replay.launch, replay.stream = (lambda: graph.launch(stream)), stream
        replay()
        return replay, result

    def describe(self) -> str:
        runtime = self.xp.cuda.runtime
        index = self.xp.cuda.Device().id
        props = runtime.getDeviceProperties(index)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        version = runtime.runtimeGetVersion()
        launch = ("programmatic dependent launch" if self.dependent_launch else
                  f"TINYLOOP_CUDA_PDL=1 ignored below sm_{MIN_COMPUTE_CAPABILITY}" if self.dependent_launch_asked
                  else "plain launches")
        return (f"{name} (sm_{props['major']}{props['minor']}, {props['totalGlobalMem'] / 2**30:.0f} GiB), "
                f"CuPy {self.xp.__version__}, CUDA runtime {version // 1000}.{version % 1000 // 10}, {launch}")


class Arena:
    """A bump allocator over one device allocation: what a captured step allocates stays
    at the addresses the graph recorded (CuPy's pool would hand them to others)."""

    def __init__(self, cp, nbytes: int):
        self.cp, self.memory, self.offset = cp, cp.cuda.Memory(nbytes), 0

    def malloc(self, size: int):
        start = -(-self.offset // 256) * 256
        if start + size > self.memory.size:
            raise MemoryError(f"a captured step needs more than the {self.memory.size >> 20} MiB graph arena")
        self.offset = start + size
        return self.cp.cuda.MemoryPointer(self.memory, start)
