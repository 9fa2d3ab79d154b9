"""The CUDA backend's own figures on the GPU at hand (run by scripts/gpu_check.sh).

    python scripts/bench_gpu.py --out DIR [--quick] [--contexts 1024 4096]

Everything is timed on the device, between CUDA events on the stream the work runs on,
and never brackets a single Python launch (whose host overhead would count as kernel time):

- **Kernels as a graph.** A call repeated N times is captured as one CUDA graph; the
  time of a replay / N is the call's cost inside a graph. Beside it, N eager launches
  back to back behind a spin kernel (so the GPU never waits for Python): the kernel's
  cost when launched one by one. The int4 linear per core weight at 1 and 16 rows
  (GB/s: packed codes, scales, mins and activations read, outputs written) and
  512-row prefill products, float32 bulk against tensor cores (TFLOP/s).
- **Steps as graphs, at each context** (1k and 4k by default): the captured decode step
  (graphs.DecodeGraph) replayed back to back; a 16-row and a 1-row full-depth forward,
  each captured (graphs.ForwardGraph) and replayed on the same cache, and their ratio
  (the target: a 16-row verify <= 1.2 steps); the wall time of model.decode with a host
  sync per token; and a per-kernel table of one eager step: the step enqueued behind a
  spin kernel with an event after every launch, so each kernel's time is the gap between
  two events on a busy stream, summed by kernel and grid. The table's sum against the
  replayed step is what launches cost inside a graph.
- **Quantized KV caches** (the longest context, 4k by default): the same model file with int8
  and with int4 caches, the captured decode step replayed and one eager step's kernels, so
  attention's share of a step (the target: at most 20 % at 4k) is read per cache mode.
- **The KV write folded or not** (1k context): the decode step as a graph with the KV write
  inside the qkv linear (the default) and as a launch of its own, side by side on one model,
  their ratio, and whether the two steps' logits are the same bits.
- **The out and up projections as one launch or two** (1k context, `TINYLOOP_CUDA_PAIR`): the
  decode step as a graph with `linear_rows_pair_int4` (the up projection's blocks waiting on the
  out projection's inside the launch) and without, side by side on one model (`toggled_figures`),
  their ratio (on_over_off), and whether the two steps' logits are the same bits.
- **Programmatic dependent launch or not** (1k context, `TINYLOOP_CUDA_PDL`): the decode step
  as a graph on a second copy of the model whose device launches every kernel with the
  attribute, beside the plain one, each on a cache of its own filled by the same prompt: their
  ratio, and whether the two steps' logits are the same bits.
- **Batches of decode steps as graphs** (graphs.BatchDecodeGraph): B requests at 1k context
  each, B = 1, 2, 4, 8, 16, one graph per batch replayed back to back: microseconds a step,
  aggregate tokens/s, and each against the one-request decode graph (graphs.DecodeGraph) on
  the same cache: what batching buys when the weights are read once per step. The caches'
  rows are allocated, not prefilled (a step's work does not depend on the values stored).
- Speculative (chain) and tree decoding tokens/s with acceptance (random weights:
  acceptance says little; the cost of a round is what is measured).

The model is doc-407m (random weights quantized to int4, group 32) at 8 loops, fp16 KV.
Writes DIR/bench_gpu.json and prints it. Needs a GPU and CuPy.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tinyloop.backends.cuda.backend import CudaBackend  # noqa: E402
from tinyloop.backends.cuda.compile import compile_options, kernel_path  # noqa: E402
from tinyloop.backends.cuda.device import CupyDevice  # noqa: E402
from tinyloop.backends.cuda.graphs import ForwardGraph, StepInputs  # noqa: E402
from tinyloop.backends.cuda.launch import attention as attention_launch  # noqa: E402
from tinyloop.backends.cuda.launch.kv import DeviceKV, DeviceView  # noqa: E402
from tinyloop.backends.cuda.launch.memory import WrappedKernel  # noqa: E402
from tinyloop.engine.decode import prefill  # noqa: E402
from tinyloop.engine.generate import GenerationRequest, generate, speculative_generate  # noqa: E402
from tinyloop.engine.speculative import SpeculativeParams  # noqa: E402
from tinyloop.model.loader import load_model  # noqa: E402
from tinyloop.model.testmodels import make_test_model  # noqa: E402
from tinyloop.quantize.pipeline import quantize_file  # noqa: E402

HBM_BYTES_PER_S = 4.8e12        # H200
SPIN_SOURCE = r'''
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
'''


class EventClock:
    """Device time between CUDA events, on the stream the timed work runs on."""

    def __init__(self, cp, device):
        self.cp, self.device = cp, device
        self._spin = cp.RawKernel(SPIN_SOURCE, "spin")
        # the SM clock sizes the spin only (too long wastes time, too short lets the host show):
        # CUDA 13's device properties dropped clockRate, so 2 GHz (an H200's boost) stands in
        khz = cp.cuda.runtime.getDeviceProperties(0).get("clockRate", 0)
        self.clock_hz = khz * 1e3 if khz else 2.0e9

    def spin(self, seconds: float, stream=None) -> None:
        """Keep the stream busy for `seconds`, so what the host enqueues next queues up behind it."""
        with (stream or self.cp.cuda.get_current_stream()):
            self._spin((1,), (1,), (np.int64(seconds * self.clock_hz),))

    def replays(self, replay, n: int) -> float:
        """Seconds per replay of a captured graph (device.capture's replay), n back to back."""
        stream = replay.stream
        stream.wait_event(self.cp.cuda.get_current_stream().record())     # after the work queued so far
        replay.launch()                                     # warm: the first launch uploads the graph
        stream.synchronize()
        start, stop = self.cp.cuda.Event(), self.cp.cuda.Event()
        start.record(stream)
        for _ in range(n):
            replay.launch()
        stop.record(stream)
        stop.synchronize()
        return self.cp.cuda.get_elapsed_time(start, stop) / 1e3 / n

    def captured_calls(self, fn, calls: int, reps: int = 5) -> float:
        """Seconds per fn() inside a graph: `calls` calls captured as one graph, replayed."""
        fn()                                                # compile and load
        _, arena = self.device.measure(lambda: [fn() for _ in range(calls)])
        replay, _ = self.device.capture(lambda: [fn() for _ in range(calls)], arena)
        return self.replays(replay, reps) / calls

    def eager_calls(self, fn, calls: int) -> float:
        """Seconds per fn() launched one by one, behind a spin kernel: the GPU's time, not Python's."""
        fn()
        stream = self.cp.cuda.get_current_stream()
        t0 = time.perf_counter()
        fn()
        stream.synchronize()
        host = time.perf_counter() - t0
        self.spin(2 * host * calls + 1e-3)
        start, stop = self.cp.cuda.Event(), self.cp.cuda.Event()
        start.record()
        for _ in range(calls):
            fn()
        stop.record()
        stop.synchronize()
        return self.cp.cuda.get_elapsed_time(start, stop) / 1e3 / calls

    def kernel_table(self, backend, step) -> list[dict]:
        """One eager step() enqueued behind a spin kernel with an event after every launch:
        each launch's device time is the gap to the event before it. -> rows by (kernel,
        grid): calls, total and mean microseconds, largest first."""
        step()                                              # compile and load
        stream = self.cp.cuda.get_current_stream()
        t0 = time.perf_counter()
        step()
        stream.synchronize()
        host = time.perf_counter() - t0
        marks = []
        device, original = backend.device, backend.device.module
        device.module = lambda name: TimedModule(original(name), marks, self.cp)
        try:
            self.spin(3 * host + 5e-3)
            first = self.cp.cuda.Event()
            first.record()
            step()
        finally:
            device.module = original
        if not marks:
            return []
        marks[-1][2].synchronize()
        return kernel_rows(first, marks, self.cp.cuda.get_elapsed_time)


class TimedModule:
    """A kernel module whose functions record an event on the current stream after each launch."""

    def __init__(self, module, marks: list, cp):
        self.module, self.marks, self.cp = module, marks, cp

    def get_function(self, name: str):
        return TimedFunction(self.module.get_function(name), name, self.marks, self.cp)


class TimedFunction(WrappedKernel):
    """A kernel that records an event after each launch (its shared memory opt-in goes to the
    kernel underneath)."""

    def __init__(self, function, name: str, marks: list, cp):
        super().__init__(function, name=name, marks=marks, cp=cp)

    def __call__(self, grid, block, args, shared_mem=0, **kwargs):
        self.wrapped(grid, block, args, shared_mem=shared_mem, **kwargs)
        event = self.cp.cuda.Event()
        event.record()
        self.marks.append((self.name, tuple(grid), event))


def kernel_rows(first, marks, elapsed_ms) -> list[dict]:
    """marks: (kernel, grid, event after it) in launch order; first: the event before the
    first. -> [{kernel, grid, calls, total_us, mean_us, share}] by total, largest first."""
    totals, counts = defaultdict(float), defaultdict(int)
    before = first
    for name, grid, event in marks:
        key = (name, grid)
        totals[key] += elapsed_ms(before, event) * 1e3
        counts[key] += 1
        before = event
    whole = sum(totals.values()) or 1.0
    rows = [{"kernel": name, "grid": list(grid), "calls": counts[(name, grid)], "total_us": total,
             "mean_us": total / counts[(name, grid)], "share": total / whole}
            for (name, grid), total in totals.items()]
    return sorted(rows, key=lambda r: -r["total_us"])


def linear_figures(cp, clock, backend, layer, rows: int, calls: int) -> dict:
    out = {}
    for name in ("qkv", "out", "up", "down"):
        weight = getattr(layer, name)
        x = cp.asarray(np.random.default_rng(0).standard_normal((rows, weight.in_features)).astype(np.float32))
        call = lambda: backend.linear(x, weight, True)                    # noqa: E731
        graph = clock.captured_calls(call, calls)
        eager = clock.eager_calls(call, calls)
        moved = weight.nbytes + x.nbytes + rows * weight.out_features * 4
        out[name] = {"shape": [weight.in_features, weight.out_features], "rows": rows,
                     "graph_us": graph * 1e6, "eager_us": eager * 1e6, "GB_s": moved / graph / 1e9,
                     "share_of_peak": moved / graph / HBM_BYTES_PER_S}
        cap = backend.column_block_cap
        if cap and rows <= 2:
            # the same calls with a block per 8 columns (no column_block_cap): what running a
            # warp's columns back to back buys, side by side
            backend.column_block_cap = None
            try:
                out[name]["uncapped_graph_us"] = clock.captured_calls(call, calls) * 1e6
            finally:
                backend.column_block_cap = cap
            out[name]["column_block_cap"] = cap
    return out


def mma_linear_figures(cp, clock, backend, layer, rows: int, calls: int) -> dict:
    """linear_figures with the exact path on tensor cores (TINYLOOP_CUDA_MMA_ROWS's
    cuda/linear_mma.cu), beside the float32 rows kernels' stage; and whether a row's bits are
    the same alone and among 16 (the invariance speculation rests on), per weight."""
    if not backend.tensor_cores:
        return {"error": "no tensor cores (sm_80+) on this device"}
    backend.mma_rows = True
    try:
        out = linear_figures(cp, clock, backend, layer, rows, calls)
        for name in ("qkv", "out", "up", "down"):
            weight = getattr(layer, name)
            x = cp.asarray(np.random.default_rng(1).standard_normal((16, weight.in_features)).astype(np.float32))
            together = cp.asnumpy(backend.linear(x, weight, True))
            alone = np.stack([cp.asnumpy(backend.linear(x[t:t + 1], weight, True))[0] for t in range(16)])
            out[name]["row_invariant"] = bool(np.array_equal(together.view(np.uint32), alone.view(np.uint32)))
        return out
    finally:
        backend.mma_rows = False


def prefill_linear(cp, clock, backend, layer, rows: int) -> dict:
    """512-row bulk products: the float32 tiled kernel against the tensor-core one (half x)."""
    out = {}
    for name in ("qkv", "out", "up", "down"):
        weight = getattr(layer, name)
        x = cp.asarray(np.random.default_rng(1).standard_normal((rows, weight.in_features)).astype(np.float32))
        x_half = x.astype(cp.float16)
        flops = 2 * rows * weight.in_features * weight.out_features
        bulk = clock.captured_calls(lambda: backend.linear(x, weight, False), 4)
        tc = clock.captured_calls(lambda: backend.linear(x_half, weight, False), 4)
        reference, got = backend.linear(x_half.astype(cp.float32), weight, False), backend.linear(x_half, weight, False)
        out[name] = {"rows": rows, "bulk_TFLOP_s": flops / bulk / 1e12, "tc_TFLOP_s": flops / tc / 1e12,
                     "tc_speedup": bulk / tc, "tensor_cores": backend.tensor_cores,
                     "max_rel_diff": float(cp.abs(got - reference).max() / cp.abs(reference).max())}
    return out


def context_figures(cp, clock, model, loops: int, context: int, replays: int, wall_steps: int) -> dict:
    """At `context` tokens of cached context: decode, 16-row and 1-row steps as graph replays,
    decode's wall time with a sync per token, and one eager step's kernels."""
    backend = model.backend
    # the captured decode step, as the engine runs it, replayed back to back
    decode_us, _, cache, token = captured_decode(clock, model, context_prompt(model, context), loops, replays)
    position = context
    figures = {"context": context, "decode_graph_us": decode_us}
    walls = []
    for step in range(wall_steps):                          # what a client sees per token
        t0 = time.perf_counter()
        token = int(backend.argmax(model.decode(token, position + 2 + step, cache, loops))[0])
        walls.append(time.perf_counter() - t0)
    figures["decode_wall_us"] = float(np.median(walls)) * 1e6
    figures["decode_tokens_per_s"] = 1e6 / figures["decode_graph_us"]

    # a 16-row and a 1-row full-depth forward, each a graph on the same cache
    steps = {}
    for n_rows in (1, 16):
        graph = ForwardGraph(backend, model, cache, loops, n_rows)
        rows = list(range(position + 8, position + 8 + n_rows))
        for _ in range(2):
            graph([token] * n_rows, rows)
        steps[n_rows] = clock.replays(graph.replay, replays)
    figures["forward_1_row_graph_us"] = steps[1] * 1e6
    figures["forward_16_rows_graph_us"] = steps[16] * 1e6
    figures["verify16_over_decode"] = steps[16] / steps[1]

    figures.update(eager_step_figures(cp, clock, model, cache, token, position, loops))
    return figures


def eager_step_figures(cp, clock, model, cache, token: int, position: int, loops: int) -> dict:
    """One eager decode step's kernels, each timed between events on a busy stream: their sum,
    the launches, the largest rows, the time by kernel and attention's share of the sum."""
    backend = model.backend
    figures = {}
    inputs = StepInputs.allocate(backend.xp)
    row = int(cache.geometry.physical(position + 30))
    cache.ensure_rows(position + 30, 1)
    backend.device.upload_ints(inputs.values, [token, position + 30, row])
    cp.cuda.Device().synchronize()                   # the upload ran on the graph stream

    def eager_step():
        with backend.static_inputs(inputs):          # no uploads: the GPU stays ahead of the host
            return model.forward([token], [position + 30], cache, loops)
    backend.graphs = False
    table = clock.kernel_table(backend, eager_step)
    figures["kernels_sum_us"] = sum(r["total_us"] for r in table)
    figures["launches"] = sum(r["calls"] for r in table)
    figures["kernels"] = table[:24]
    by_kernel = defaultdict(float)
    for r in table:
        by_kernel[r["kernel"]] += r["total_us"]
    figures["by_kernel_us"] = dict(sorted(by_kernel.items(), key=lambda kv: -kv[1]))
    figures["attention_share"] = sum(v for k, v in by_kernel.items() if k.startswith("attention")) / \
        max(figures["kernels_sum_us"], 1e-9)
    backend.graphs = True
    return figures


def kv_mode_figures(cp, clock, model, loops: int, context: int, replays: int) -> dict:
    """The decode step at `context` tokens of the model's own KV cache mode (load it with the
    mode to measure): the captured step replayed back to back, and one eager step's kernels with
    attention's share (cuda/README.md's "Attention at 4,096 tokens" table gives the paper's)."""
    decode_us, _, cache, token = captured_decode(clock, model, context_prompt(model, context), loops, replays)
    figures = {"context": context, "kv_mode": cache.mode, "decode_graph_us": decode_us}
    figures.update(eager_step_figures(cp, clock, model, cache, token, context, loops))
    return figures


def attention_chunk_figures(xp, module_for, clock, contexts, calls: int, n_kv: int = 16, group: int = 1,
                            head_dim: int = 128, chunk_sizes=(1, 4)) -> dict:
    """One decode query's attention (fp16 KV, doc-407m's 16 kv heads of 128) at each context,
    with the kernel compiled at each chunk size S (-DATT_CHUNK_BLOCKS, the launcher set to match):
    a graph of `calls` launches each, the fused merge on. module_for(options) -> the attention
    module. What S = 1 (shipped) buys over S = 4 (before), side by side."""
    out = {}
    shipped = attention_launch.CHUNK_BLOCKS
    for context in contexts:
        rows = -(-(context + 1) // 64) * 64
        pool = DeviceKV.allocate("fp16", n_kv, rows, head_dim, xp)
        for array in pool.arrays():
            array[...] = 0.5 if array.dtype != xp.uint8 else 1
        table = np.arange(rows // 64, dtype=np.int32)[None]
        view = DeviceView(pool, table, xp.asarray(table), lambda buffer, values: None)
        q = xp.ones((1, n_kv * group, head_dim), xp.float32)
        result = xp.empty_like(q)
        positions = xp.asarray(np.array([context], np.int32))
        shared_end = xp.asarray(np.array([attention_launch.NO_TREE], np.int32))
        counters = xp.zeros(n_kv, xp.uint32)
        figures = {}
        for size in chunk_sizes:
            attention_launch.CHUNK_BLOCKS = size
            try:
                module = module_for(() if size == shipped else (f"-DATT_CHUNK_BLOCKS={size}",))
                chunks = attention_launch.max_chunks(rows, 0, 0)
                scratch = xp.empty(attention_launch.partial_floats(n_kv * group, head_dim, chunks), xp.float32)

                def call(module=module, chunks=chunks, scratch=scratch):
                    attention_launch.attention(module, view, q, 0, positions, 0, 0, shared_end, None, 0, 0.088,
                                               result, scratch=scratch, chunks=chunks, counters=counters)
                figures[f"S{size}_us"] = clock.captured_calls(call, calls) * 1e6
                figures[f"S{size}_blocks"] = n_kv * chunks
            finally:
                attention_launch.CHUNK_BLOCKS = shipped
        out[str(context)] = figures
    return out


def batch_figures(clock, model, loops: int, context: int, sizes, replays: int) -> dict:
    """B decode rows of B requests at `context` tokens each as one replayed batch graph, per B."""
    from tinyloop.kv.pool import KVPool
    from tinyloop.model.batch import Pass, run_passes
    backend = model.backend
    pool = KVPool.for_model(model, max(sizes) * model.cache_bytes(context + 64, loops) + (64 << 20))
    caches = [model.new_cache(context + 64, loops, pool=pool) for _ in range(max(sizes))]
    for cache in caches:
        cache.ensure_rows(0, context + 8)            # rows allocated; their values do not change the work
    coda = model.coda_base(loops)
    out = {"context": context}
    for step in range(2):                            # the one-request decode graph: warm-up, capture
        model.decode(1, context + step, caches[0], loops)
    one = clock.replays(backend.decode_runner(model, caches[0], loops).replay, replays)
    out["decode_graph_us"] = one * 1e6
    for n in sizes:
        for step in range(3):                        # warm-up, capture, a replay
            run_passes(model, [Pass(c, np.array([context + step]), context + step, loops, tokens=[1], coda=coda,
                                    head="all") for c in caches[:n]])
        graph = next(g for g in backend._batch_graphs.graphs.values() if g.n_rows == n)
        seconds = clock.replays(graph.replay, replays)
        out[n] = {"step_us": seconds * 1e6, "tokens_per_s": n / seconds, "step_over_one": seconds / one,
                  "throughput_over_one": n * one / seconds}
    for cache in caches:
        cache.release()
    return out


def context_prompt(model, context: int) -> list[int]:
    """`context` random token ids (seeded by the context): what the context stages prefill."""
    rng = np.random.default_rng(context)
    return [int(t) for t in rng.integers(3, model.config.vocab_size, context)]


def captured_decode(clock, model, prompt: list[int], loops: int, replays: int):
    """On a cache of its own filled by `prompt` (prefilled eagerly): the decode step at positions
    len(prompt) and + 1 (a warm-up, then the capture), the captured graph replayed back to back.
    -> (us a replay, the captured step's logits on the host, the cache, the prompt's next token)."""
    backend, context = model.backend, len(prompt)
    cache = model.new_cache(context + 64, loops)
    backend.graphs = False
    token = int(backend.argmax(prefill(model, prompt, cache, loops))[0])
    backend.graphs = True
    for step in range(2):                       # warm-up, then capture
        step_logits = model.decode(token, context + step, cache, loops)
    logits = backend.to_host(step_logits)
    seconds = clock.replays(backend.decode_runner(model, cache, loops).replay, replays)
    return seconds * 1e6, logits, cache, token


def replayed_decode_step(clock, model, prompt: list[int], loops: int, replays: int) -> tuple[float, np.ndarray]:
    """captured_decode on a cache released after it -> (us a replay, the captured step's logits),
    for the side-by-side stages below that compare two ways of running one step."""
    us, logits, cache, _ = captured_decode(clock, model, prompt, loops, replays)
    cache.release()
    return us, logits


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return bool(np.array_equal(a.view(np.uint32), b.view(np.uint32)))


def toggled_figures(clock, model, attribute: str, loops: int, context: int, replays: int) -> dict:
    """The decode step replayed as a graph with the backend's `attribute` (a fold: fuses_kv_write,
    fuses_pair) on and off, side by side on one model at `context` tokens: each on a cache of its
    own, filled by the same prompt; the two steps' logits must be the same bits. The attribute is
    left as it was."""
    backend = model.backend
    original = getattr(backend, attribute)
    prompt = context_prompt(model, context)
    out, logits = {"context": context}, []
    try:
        for on in (True, False):
            setattr(backend, attribute, on)
            us, step_logits = replayed_decode_step(clock, model, prompt, loops, replays)
            out["on_us" if on else "off_us"] = us
            logits.append(step_logits)
    finally:
        setattr(backend, attribute, original)
    out["on_over_off"] = out["on_us"] / out["off_us"]
    out["same_bits"] = same_bits(*logits)
    return out


def kv_fold_figures(clock, model, loops: int, context: int, replays: int) -> dict:
    """toggled_figures for the KV write folded into the qkv linear (the default) or a launch of
    its own: folded_us, apart_us, their ratio, same_bits."""
    f = toggled_figures(clock, model, "fuses_kv_write", loops, context, replays)
    return {"context": f["context"], "folded_us": f["on_us"], "apart_us": f["off_us"],
            "folded_over_apart": f["on_over_off"], "same_bits": f["same_bits"]}


def dependent_launch_figures(clock, plain, dependent, loops: int, context: int, replays: int) -> dict:
    """The decode step replayed as a graph on `plain` (kernels launched plainly) and on `dependent`
    (the same model file on a device launching with programmatic dependent launch), side by
    side: each on a cache of its own, filled by the same prompt; the two steps' logits must be
    the same bits (every kernel waits for the previous grid before it touches memory)."""
    prompt = context_prompt(plain, context)
    out, logits = {"context": context}, []
    for label, model in (("plain", plain), ("dependent", dependent)):
        out[f"{label}_us"], step_logits = replayed_decode_step(clock, model, prompt, loops, replays)
        logits.append(step_logits)
    out["dependent_over_plain"] = out["dependent_us"] / out["plain_us"]
    out["same_bits"] = same_bits(*logits)
    return out


def speculative_figures(model, loops: int, n_tokens: int) -> dict:
    prompt = list(range(1, 33))
    out = {}
    t0 = time.perf_counter()
    generate(model, GenerationRequest(prompt, n_tokens, loops=loops))
    out["plain_tokens_per_s"] = n_tokens / (time.perf_counter() - t0)
    for label, params in (("chain d2 a4", SpeculativeParams(2, loops, 4, 1)),
                          ("tree d2 a4 K2", SpeculativeParams(2, loops, 4, 2))):
        t0 = time.perf_counter()
        result = speculative_generate(model, GenerationRequest(prompt, n_tokens), params)
        seconds = time.perf_counter() - t0
        stats = result.speculative.to_dict() if getattr(result, "speculative", None) else {}
        out[label] = {"tokens_per_s": len(result.tokens) / seconds, "stats": stats}
    return out


KV_MODES_TIMED = ("int8", "int4")      # beside the fp16 cache of the contexts stage


def summary_lines(report: dict) -> list[str]:
    """The figures a reader wants first, one line each."""
    lines = []
    for key, value in report.items():
        if isinstance(value, dict) and "error" in value:
            lines.append(f"{key}: FAILED {value['error']}")
    for key in ("linear_1_row", "linear_16_rows", "linear_mma_1_row", "linear_mma_16_rows"):
        figures = report.get(key, {})
        for name, r in figures.items() if "error" not in figures else ():
            lines.append(f"{key} {name}: {r['graph_us']:.1f} us in a graph ({r['eager_us']:.1f} eager), "
                         f"{r['GB_s']:.0f} GB/s = {r['share_of_peak']:.0%} of 4.8 TB/s"
                         + (f", row-invariant: {r['row_invariant']}" if "row_invariant" in r else "")
                         + (f", uncapped grid {r['uncapped_graph_us']:.1f} us" if "uncapped_graph_us" in r else ""))
    chunks = report.get("attention_chunk_sizes", {})
    for context, r in chunks.items() if isinstance(chunks, dict) and "error" not in chunks else ():
        lines.append(f"attention, one query at {context}: " + ", ".join(
            f"S = {k[1:-3]} {v:.1f} us ({r[k[:-3] + '_blocks']} blocks)" for k, v in r.items() if k.endswith("_us")))
    for c in report.get("contexts", []) if isinstance(report.get("contexts"), list) else ():
        lines.append(f"context {c['context']}: decode {c['decode_graph_us']:.0f} us/token as a graph "
                     f"({c['decode_tokens_per_s']:.0f} tok/s; wall {c['decode_wall_us']:.0f} us), "
                     f"16 rows / 1 row {c['verify16_over_decode']:.2f}, {c['launches']} launches, "
                     f"kernels sum {c['kernels_sum_us']:.0f} us, attention {c['attention_share']:.0%}")
    for key, modes in report.items():
        if key.startswith("kv_modes_") and isinstance(modes, dict) and "error" not in modes:
            for mode, m in modes.items():
                lines.append(f"{mode} KV cache at {m['context']}: decode {m['decode_graph_us']:.0f} us/token as a "
                             f"graph, attention {m['attention_share']:.0%} of the kernels' {m['kernels_sum_us']:.0f} us")
    fold = report.get("kv_fold_1k", {})
    if isinstance(fold, dict) and "folded_us" in fold:
        lines.append(f"KV write at 1k: folded into qkv {fold['folded_us']:.0f} us a step, its own launch "
                     f"{fold['apart_us']:.0f} us ({fold['folded_over_apart']:.3f}x), same bits: {fold['same_bits']}")
    pdl = report.get("dependent_launch_1k", {})
    if isinstance(pdl, dict) and "plain_us" in pdl:
        lines.append(f"programmatic dependent launch at 1k: {pdl['dependent_us']:.0f} us a step against "
                     f"{pdl['plain_us']:.0f} us plain ({pdl['dependent_over_plain']:.3f}x), same bits: {pdl['same_bits']}")
    batch = report.get("batch_decode_1k", {})
    for n, r in batch.items() if isinstance(batch, dict) and "error" not in batch else ():
        if isinstance(r, dict):
            lines.append(f"batch of {n} at 1k: {r['step_us']:.0f} us a step, {r['tokens_per_s']:.0f} tok/s "
                         f"({r['throughput_over_one']:.2f}x one request's, a step {r['step_over_one']:.2f}x)")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=".", help="directory for bench_gpu.json")
    parser.add_argument("--quick", action="store_true", help="fewer replays and steps")
    parser.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096])
    args = parser.parse_args()
    import cupy as cp
    calls, replays, wall_steps = (10, 10, 8) if args.quick else (20, 50, 32)
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        make_test_model(Path(tmp) / "doc.tinyloop", "doc-407m", seed=0)
        quantize_file(Path(tmp) / "doc.tinyloop", Path(tmp) / "doc-int4.tinyloop", 4, 32, "rtn", progress=False)
        report["model_build_s"] = time.perf_counter() - t0
        backend = CudaBackend(CupyDevice(), graphs=True)
        report["device"] = backend.device.describe()
        loaded = load_model(Path(tmp) / "doc-int4.tinyloop", backend, kv_mode="fp16")
        try:                                 # the same file on a device that launches with PDL
            dependent = load_model(Path(tmp) / "doc-int4.tinyloop",
                                   CudaBackend(CupyDevice(dependent_launch=True), graphs=True), kv_mode="fp16").model
        except Exception as error:           # noqa: BLE001 - reported as the stage's error below
            dependent = error
        # the same file with quantized KV caches, for attention at the longest context by cache mode
        quantized_kv = {mode: load_model(Path(tmp) / "doc-int4.tinyloop", backend, kv_mode=mode).model
                        for mode in KV_MODES_TIMED}
    model = loaded.model
    clock = EventClock(cp, backend.device)
    layer = model.weights.layers["core"][0]
    stages = [
        ("linear_1_row", lambda: linear_figures(cp, clock, backend, layer, 1, calls)),
        ("linear_16_rows", lambda: linear_figures(cp, clock, backend, layer, 16, calls)),
        ("linear_mma_1_row", lambda: mma_linear_figures(cp, clock, backend, layer, 1, calls)),
        ("linear_mma_16_rows", lambda: mma_linear_figures(cp, clock, backend, layer, 16, calls)),
        ("prefill_512_rows", lambda: prefill_linear(cp, clock, backend, layer, 512)),
        ("contexts", lambda: [context_figures(cp, clock, model, 8, c, replays, wall_steps) for c in args.contexts]),
        ("attention_chunk_sizes", lambda: attention_chunk_figures(
            cp, lambda options: cp.RawModule(code=kernel_path("attention").read_text(),
                                             options=(*compile_options(), *options)),
            clock, args.contexts, calls)),
        ("kv_fold_1k", lambda: kv_fold_figures(clock, model, 8, 1024, replays)),
        ("pair_1k", lambda: toggled_figures(clock, model, "fuses_pair", 8, 1024, replays)),
        ("dependent_launch_1k", lambda: dependent_launch_figures(clock, model, dependent, 8, 1024, replays)
         if not isinstance(dependent, Exception) else {"error": f"{type(dependent).__name__}: {dependent}"}),
        (f"kv_modes_{max(args.contexts)}", lambda: {
            mode: kv_mode_figures(cp, clock, m, 8, max(args.contexts), replays) for mode, m in quantized_kv.items()}),
        ("batch_decode_1k", lambda: batch_figures(clock, model, 8, 1024, (1, 2, 4, 8, 16), replays)),
        ("speculative_loops_8", lambda: speculative_figures(model, 8, 32 if args.quick else 64)),
    ]
    for key, run in stages:            # a stage that fails is reported and the rest still run
        t0 = time.perf_counter()
        try:
            report[key] = run()
        except Exception as error:     # noqa: BLE001 - the report says which stage and why
            report[key] = {"error": f"{type(error).__name__}: {error}"}
        report.setdefault("stage_seconds", {})[key] = round(time.perf_counter() - t0, 1)
        Path(args.out, "bench_gpu.json").write_text(json.dumps(report, indent=2))
    report["summary"] = summary_lines(report)
    Path(args.out, "bench_gpu.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    print("\n".join(report["summary"]))
    return 0 if not any(isinstance(v, dict) and "error" in v for v in report.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
