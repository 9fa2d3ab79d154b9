"""Prefill and decode speed on this machine's CPU, side by side.

    python scripts/bench_cpu.py                          # tiny-looped and doc-407m (loops 1, 8), the default model
    python scripts/bench_cpu.py --baseline DIR           # the same figures from the checkout in DIR, interleaved
    python scripts/bench_cpu.py --presets default --long-context 4399 --llama-cpp MODEL.gguf

Each checkout measured (this one, and --baseline's) runs in a worker process of its
own that imports tinyloop from that checkout; the workers, and llama.cpp's when
--llama-cpp is given (needs `llama_cpp` importable), take turns within every round,
so drift on a noisy machine hits all of them alike, with a pause before each
measurement (--settle) while the previous worker's BLAS threads stop spinning. Each
figure is the median of --rounds rounds, with min and max.

Caches come from the KV pool where the checkout has one (the server's engine carves
every request's cache from it), else fresh arrays per request, as each serves.

Rows:
- prefill tok/s: the GEMM path over a --prompt-tokens prompt;
- decode tok/s: the row-invariant single-token path (what generation, drafting and
  verifying use), after a --context token prompt;
- for the default model (SmolLM2-135M-Instruct, if pulled): "matrix products alone",
  one row through every linear weight and the head per step, timed in the same
  rounds; decode / that is the share of decode time the matrix products take, also
  measured with decode steps and matrix-product passes alternating one by one (the
  row "decode / matmuls, step by step" is that ratio, not a speed);
- with --long-context N: prefill of an N-token prompt, then decode at that context.

Random-weight presets are written once to --cache-dir (seed 0).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------- worker side
MIN_SECONDS = 0.25           # a measurement repeats until its timed part adds up to this


def repeated(once) -> dict:
    """Run once() -> (tokens, seconds) until MIN_SECONDS of timed work: tokens per second
    over all of it (a 2 ms prefill timed once says more about the scheduler than the code)."""
    tokens = seconds = 0.0
    while seconds < MIN_SECONDS:
        done, spent = once()
        tokens, seconds = tokens + done, seconds + spent
    return {"tok_s": tokens / seconds}


def _import_tinyloop(root: str):
    sys.path.insert(0, root)
    try:                                                   # this layout
        from tinyloop.kv.pool import KVPool, default_pool_bytes
        from tinyloop.model.loader import load_model
        from tinyloop.model.testmodels import make_test_model
        pool = (KVPool, default_pool_bytes)
    except ImportError:                                    # the flat layout of earlier checkouts
        from tinyloop.loader import load_model
        from tinyloop.testmodels import make_test_model
        pool = None
    return load_model, make_test_model, pool


class TinyLoopWorker:
    def __init__(self, root: str):
        import numpy as np
        self.np = np
        self.load_model, self.make_test_model, self.pool_type = _import_tinyloop(root)
        self.models, self.pools = {}, {}

    def load(self, key: str, path: str, preset: str | None):
        np = self.np
        if preset and not Path(path).exists():
            self.make_test_model(path, preset, seed=0, dtype=np.float16 if preset == "doc-407m" else np.float32)
        model = self.models[key] = self.load_model(path).model
        if self.pool_type:                     # caches come from the KV pool, as the server's engine takes them
            pool_class, size = self.pool_type
            self.pools[key] = pool_class(model.backend, size(model))
        return {"ok": True}

    def _cache(self, key, capacity, loops):
        model = self.models[key]
        if key in self.pools:
            return model.new_cache(capacity, loops, alloc=self.pools[key].allocator())
        return model.new_cache(capacity, loops)              # checkouts before the pool: fresh arrays

    def _prompt(self, model, n):
        return (self.np.arange(n) * 7919 + 100) % model.config.vocab_size

    def prefill(self, key, loops, tokens):
        np, model = self.np, self.models[key]

        def once():
            cache = self._cache(key, tokens + 1, loops)
            start = time.perf_counter()
            model.forward(self._prompt(model, tokens), np.arange(tokens), cache, loops, exact=False, last_only=True)
            return tokens, time.perf_counter() - start
        return repeated(once)

    def decode(self, key, loops, context, steps):
        np, model = self.np, self.models[key]

        def once():
            cache = self._cache(key, context + steps, loops)
            model.forward(self._prompt(model, context), np.arange(context), cache, loops, exact=False,
                          last_only=True)
            start = time.perf_counter()
            for step in range(steps):
                model.forward([5], [context + step], cache, loops)
            return steps, time.perf_counter() - start
        return repeated(once)

    def _matmul_operands(self, model):
        """(row, weight) for every linear weight of the model and the head."""
        weights = []
        for stage in ("prelude", "core", "coda"):
            for layer in model.weights.layers[stage]:
                weights += [getattr(getattr(layer, name), "weight", getattr(layer, name))
                            for name in ("qkv", "out", "up", "down")]
        head = model.weights.head
        weights.append(getattr(head, "weight", head))
        return [(self.np.ones((1, 1, w.shape[0]), self.np.float32), w) for w in weights]

    def matmuls(self, key, steps):
        """One row through every linear weight of the model and the head, per step."""
        operands = self._matmul_operands(self.models[key])

        def once():
            start = time.perf_counter()
            for _ in range(steps):
                for row, weight in operands:
                    row @ weight
            return steps, time.perf_counter() - start
        return repeated(once)


    def interleaved(self, key, context, steps):
        """Decode steps and matrix-product passes alternating one by one, timed apart: the
        share of a decode step the matrix products take, with both on the same machine state."""
        np, model = self.np, self.models[key]
        rows_weights = self._matmul_operands(model)
        cache = self._cache(key, context + steps, 1)
        model.forward(self._prompt(model, context), np.arange(context), cache, 1, exact=False, last_only=True)
        decode = matmuls = 0.0
        for step in range(steps):
            start = time.perf_counter()
            model.forward([5], [context + step], cache, 1)
            middle = time.perf_counter()
            for row, weight in rows_weights:
                row @ weight
            decode, matmuls = decode + middle - start, matmuls + time.perf_counter() - middle
        return {"tok_s": matmuls / decode}


class LlamaWorker:
    def __init__(self, gguf: str, threads: int):
        from llama_cpp import Llama
        self.Llama, self.gguf, self.threads = Llama, gguf, threads
        self.llama, self.n_ctx = None, 0

    def _model(self, n_ctx):
        if self.llama is None or self.n_ctx < n_ctx:
            self.llama = self.Llama(self.gguf, n_ctx=n_ctx, n_threads=self.threads, n_batch=512, verbose=False)
            self.n_ctx = n_ctx
        return self.llama

    def prefill(self, key, loops, tokens):
        llama = self._model(tokens + 64)

        def once():
            llama.reset()
            start = time.perf_counter()
            llama.eval(self._ids(tokens))
            return tokens, time.perf_counter() - start
        return repeated(once)

    def decode(self, key, loops, context, steps):
        llama = self._model(context + steps + 64)

        def once():
            llama.reset()
            llama.eval(self._ids(context))
            start = time.perf_counter()
            for _ in range(steps):
                llama.eval([5])
            return steps, time.perf_counter() - start
        return repeated(once)

    @staticmethod
    def _ids(n):
        return [(i * 7919 + 100) % 49152 for i in range(n)]


def worker_main(kind: str, arg: str, threads: int):
    worker = TinyLoopWorker(arg) if kind == "tinyloop" else LlamaWorker(arg, threads)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        try:
            result = getattr(worker, op)(**command)
        except Exception as exc:                # noqa: BLE001 - reported to the parent
            result = {"error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result), flush=True)


# ----------------------------------------------------------------------------------- parent side
class Worker:
    def __init__(self, name: str, kind: str, arg: str, threads: int):
        self.name = name
        self.process = subprocess.Popen([sys.executable, __file__, "--worker", kind, arg, "--threads", str(threads)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._read()

    def _read(self):
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.name} ended")
        return json.loads(line)

    def ask(self, **command):
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        result = self._read()
        if "error" in result:
            raise RuntimeError(f"{self.name}: {result['error']}")
        return result

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def summary(values):
    return statistics.median(values), min(values), max(values)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["tiny-looped", "doc-407m", "default"],
                        help="random-weight presets, and/or 'default' for the pulled SmolLM2 (skipped if absent)")
    parser.add_argument("--loops", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--context", type=int, default=64, help="prompt before the decode steps")
    parser.add_argument("--decode-tokens", type=int, default=24)
    parser.add_argument("--long-context", type=int, default=0, help="also prefill N tokens and decode after them")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--baseline", default=None, help="another checkout to measure side by side")
    parser.add_argument("--llama-cpp", default=None, metavar="GGUF",
                        help="llama.cpp on this GGUF (the default model's) side by side, via llama_cpp")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="llama.cpp threads")
    parser.add_argument("--settle", type=float, default=0.3,
                        help="seconds of quiet before each measurement, so the previous worker's BLAS threads "
                             "stop spinning (default 0.3)")
    parser.add_argument("--cache-dir", default=os.environ.get("TMPDIR", "/tmp"))
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(*args.worker, args.threads)
        return

    sys.path.insert(0, str(HERE))
    import numpy as np

    from tinyloop.convert.pull import default_model_path
    workers = [Worker("this", "tinyloop", str(HERE), args.threads)]
    if args.baseline:
        workers.append(Worker("baseline", "tinyloop", str(Path(args.baseline).resolve()), args.threads))
    llama = Worker("llama.cpp", "llama", args.llama_cpp, args.threads) if args.llama_cpp else None

    items = []               # (label, model key, measurement command, include llama.cpp?)
    for preset in args.presets:
        if preset == "default":
            path = default_model_path()
            if not path.exists():
                print(f"default model not pulled ({path}): skipped; run `tinyloop pull`", file=sys.stderr)
                continue
            key, loops_list = "default", [1]
        else:
            path, key, loops_list = Path(args.cache_dir) / f"bench-{preset}-seed0.tinyloop", preset, args.loops
        for worker in workers:
            worker.ask(op="load", key=key, path=str(path), preset=None if preset == "default" else preset)
        steps = args.decode_tokens if preset != "doc-407m" else max(4, args.decode_tokens // 4)
        with_llama = preset == "default"
        for loops in loops_list:
            items.append((f"{preset} loops {loops}: prefill {args.prompt_tokens}", key,
                          dict(op="prefill", key=key, loops=loops, tokens=args.prompt_tokens), with_llama))
            items.append((f"{preset} loops {loops}: decode at {args.context}", key,
                          dict(op="decode", key=key, loops=loops, context=args.context, steps=steps), with_llama))
        if preset == "default":
            items.append(("default: matrix products alone", key, dict(op="matmuls", key=key, steps=steps), False))
            items.append(("default: decode / matmuls, step by step", key,
                          dict(op="interleaved", key=key, context=args.context, steps=4 * steps), False))
            if args.long_context:
                n = args.long_context
                items.append((f"default: prefill {n}", key, dict(op="prefill", key=key, loops=1, tokens=n), True))
                items.append((f"default: decode at {n}", key,
                              dict(op="decode", key=key, loops=1, context=n, steps=steps), True))

    results = {}             # (label, worker) -> [tok/s]
    for _ in range(args.rounds):
        for label, key, command, with_llama in items:
            for worker in workers + ([llama] if llama and with_llama else []):
                time.sleep(args.settle)
                results.setdefault((label, worker.name), []).append(worker.ask(**command)["tok_s"])

    print(f"numpy {np.__version__}, {os.cpu_count()} CPUs; median of {args.rounds} rounds (min-max), tok/s")
    names = [w.name for w in workers] + (["llama.cpp"] if llama else [])
    header = f"{'measurement':<36}" + "".join(f"{n:>24}" for n in names)
    if args.baseline:
        header += f"{'this/baseline':>15}"
    if llama:
        header += f"{'this/llama.cpp':>16}"
    print(header)
    for label, *_ in items:
        row = f"{label:<36}"
        medians = {}
        for name in names:
            values = results.get((label, name))
            if values:
                median, low, high = summary(values)
                medians[name] = median
                row += f"{median:>10.2f} ({low:.1f}-{high:.1f})".rjust(24)
            else:
                row += f"{'':>24}"
        if args.baseline:
            row += f"{medians['this'] / medians['baseline']:>15.2f}"
        if llama and "llama.cpp" in medians:
            row += f"{medians['this'] / medians['llama.cpp']:>16.2f}"
        print(row, flush=True)
    for label, key, command, _ in items:
        if command["op"] == "matmuls":
            decode = f"default loops 1: decode at {args.context}"
            for name in [w.name for w in workers]:
                ratios = [d / m for d, m in zip(results[(decode, name)], results[(label, name)])]
                median, low, high = summary(ratios)
                print(f"{name}: default-model decode / matrix products alone = {median:.3f} "
                      f"(rows above, per round {low:.3f}-{high:.3f})")
        if command["op"] == "interleaved":
            for name in [w.name for w in workers]:
                median, low, high = summary(results[(label, name)])
                print(f"{name}: the same, decode steps and matrix-product passes alternating one by one = "
                      f"{median:.3f} ({low:.3f}-{high:.3f})")
    for worker in workers + ([llama] if llama else []):
        worker.close()


if __name__ == "__main__":
    main()
