"""A short benchmark of the CUDA backend on the GPU at hand (run by scripts/gpu_check.sh).

    python scripts/bench_gpu.py --out DIR [--quick]

For the document-shaped preset (doc-407m, random weights quantized to int4, group 32)
at 8 loops, batch 1:
- the int4 linear's achieved bandwidth per core weight, 1 row and 16 rows (GB/s: packed
  codes + scales + mins + activations read, outputs written, over CUDA-event time);
- plain decode tokens/s after a 64-token prompt: wall time per token with a sync per
  step, GPU time per step (events), and the host's enqueue time per step — the host
  overhead a CUDA graph removes — kernel by kernel and with the step captured as a graph
  (with graphs the step's GPU time is the replay's, and "enqueue" is upload + replay,
  which waits for the replay);
- a 16-row verify forward against one decode step (the target is <= 1.2x);
- prefill GEMMs of 512 rows per core weight: linear_bulk_* on float32 inputs against
  linear_tc_* (tensor cores, fp16 activations), side by side: TFLOP/s each and the ratio;
- speculative (chain) and tree decoding tokens/s with their acceptance (random weights:
  acceptance says little about real models; the cost of a round is what is measured).
Writes DIR/bench_gpu.json and prints a table. Needs a GPU and CuPy.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tinyloop.backends.cuda.backend import CudaBackend  # noqa: E402
from tinyloop.backends.cuda.device import CupyDevice  # noqa: E402
from tinyloop.engine.decode import prefill  # noqa: E402
from tinyloop.engine.generate import GenerationRequest, generate, speculative_generate  # noqa: E402
from tinyloop.engine.speculative import SpeculativeParams  # noqa: E402
from tinyloop.model.loader import load_model  # noqa: E402
from tinyloop.model.testmodels import make_test_model  # noqa: E402
from tinyloop.quantize.pipeline import quantize_file  # noqa: E402

HBM_BYTES_PER_S = 4.8e12        # H200


def gpu_seconds(cp, fn, reps: int) -> float:
    """Median GPU time of fn() over reps, by CUDA events around each call."""
    times = []
    for _ in range(reps):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    return statistics.median(times)


def linear_bandwidth(cp, backend, layer, rows: int, reps: int) -> dict:
    out = {}
    for name in ("qkv", "out", "up", "down"):
        weight = getattr(layer, name)
        x = cp.asarray(np.random.default_rng(0).standard_normal((rows, weight.in_features)).astype(np.float32))
        backend.linear(x, weight, True)                                # compile and warm
        seconds = gpu_seconds(cp, lambda: backend.linear(x, weight, True), reps)
        moved = weight.nbytes + x.nbytes + rows * weight.out_features * 4
        out[name] = {"shape": [weight.in_features, weight.out_features], "rows": rows,
                     "us": seconds * 1e6, "GB_s": moved / seconds / 1e9,
                     "share_of_peak": moved / seconds / HBM_BYTES_PER_S}
    return out


def prefill_linear(cp, backend, layer, rows: int, reps: int) -> dict:
    """512-row bulk products: the float32 tiled kernel against the tensor-core one (half x)."""
    out = {}
    tensor_cores = backend.tensor_cores
    for name in ("qkv", "out", "up", "down"):
        weight = getattr(layer, name)
        x = cp.asarray(np.random.default_rng(1).standard_normal((rows, weight.in_features)).astype(np.float32))
        x_half = x.astype(cp.float16)
        flops = 2 * rows * weight.in_features * weight.out_features
        backend.linear(x, weight, False)
        backend.linear(x_half, weight, False)
        bulk = gpu_seconds(cp, lambda: backend.linear(x, weight, False), reps)
        tc = gpu_seconds(cp, lambda: backend.linear(x_half, weight, False), reps)
        reference, got = backend.linear(x_half.astype(cp.float32), weight, False), backend.linear(x_half, weight, False)
        out[name] = {"rows": rows, "bulk_TFLOP_s": flops / bulk / 1e12, "tc_TFLOP_s": flops / tc / 1e12,
                     "tc_speedup": bulk / tc, "tensor_cores": tensor_cores,
                     "max_rel_diff": float(cp.abs(got - reference).max() / cp.abs(reference).max())}
    return out


def decode_figures(cp, model, loops: int, steps: int, graphs: bool) -> dict:
    """Plain decode through model.decode: kernel by kernel, or a captured graph replayed."""
    model.backend.graphs = graphs
    prompt = list(range(1, 65))
    cache = model.new_cache(len(prompt) + steps + 70, loops)
    logits = prefill(model, prompt, cache, loops)
    token = int(model.backend.argmax(logits)[0])
    position = len(prompt)
    walls, gpus, enqueues = [], [], []
    for _ in range(steps):
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        t0 = time.perf_counter()
        start.record()
        logits = model.decode(token, position, cache, loops)
        stop.record()
        t1 = time.perf_counter()
        token = int(model.backend.argmax(logits)[0])                # syncs: the id crosses to the host
        t2 = time.perf_counter()
        walls.append(t2 - t0)
        enqueues.append(t1 - t0)
        gpus.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
        position += 1
    verify_tokens = list(range(100, 116))
    verify_positions = list(range(position, position + 16))
    verify = gpu_seconds(cp, lambda: model.forward(verify_tokens, verify_positions, cache, loops), 5)
    one = gpu_seconds(cp, lambda: model.forward([token], [position], cache, loops), 5)
    # with graphs the replay runs on the graph's own stream (events on this one time nothing)
    gpu = None if graphs else statistics.median(gpus)
    return {"tokens_per_s": 1 / statistics.median(walls), "wall_ms": statistics.median(walls) * 1e3,
            "gpu_ms": gpu and gpu * 1e3, "enqueue_ms": statistics.median(enqueues) * 1e3,
            "gpu_bound_tokens_per_s": gpu and 1 / gpu,
            "verify16_over_decode": verify / one, "verify16_ms": verify * 1e3, "decode_ms": one * 1e3}


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=".", help="directory for bench_gpu.json")
    parser.add_argument("--quick", action="store_true", help="fewer steps and repetitions")
    args = parser.parse_args()
    import cupy as cp
    steps, reps = (16, 10) if args.quick else (64, 30)
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        make_test_model(Path(tmp) / "doc.tinyloop", "doc-407m", seed=0)
        quantize_file(Path(tmp) / "doc.tinyloop", Path(tmp) / "doc-int4.tinyloop", 4, 32, "rtn", progress=False)
        report["model_build_s"] = time.perf_counter() - t0
        backend = CudaBackend(CupyDevice())
        report["device"] = backend.device.describe()
        loaded = load_model(Path(tmp) / "doc-int4.tinyloop", backend, kv_mode="fp16")
    model = loaded.model
    layer = model.weights.layers["core"][0]
    report["linear_1_row"] = linear_bandwidth(cp, backend, layer, 1, reps)
    report["linear_16_rows"] = linear_bandwidth(cp, backend, layer, 16, reps)
    report["prefill_512_rows"] = prefill_linear(cp, backend, layer, 512, reps)
    report["decode_loops_8"] = decode_figures(cp, model, 8, steps, graphs=False)
    report["decode_loops_8_graphs"] = decode_figures(cp, model, 8, steps, graphs=True)
    report["speculative_loops_8"] = speculative_figures(model, 8, 32 if args.quick else 64)
    Path(args.out, "bench_gpu.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
