"""Where a cold prefill's time goes on a backend: its linear, attention and KV-write calls
against the whole forward, at several prompt lengths.

    python scripts/profile_prefill.py                       # the default model, 128 512 1536 4096
    python scripts/profile_prefill.py MODEL --lengths 1024 --chunk 128

Each length: one warm-up prefill, then one timed (random token ids, one generated token,
loops 1, the engine's chunked prefill). The backend's methods are wrapped with timers, so
the shares are of wall time spent inside those calls; "other" is everything else (norms,
RoPE, embedding, head, Python). A profile, not a benchmark: `tinyloop bench` gives the
figures to compare.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from tinyloop.engine.engine import default_prefill_chunk
from tinyloop.engine.generate import GenerationRequest, generate
from tinyloop.model.loader import load_model

TIMED = ("linear", "attention", "attention_parts", "kv_write", "kv_write_parts")


def wrap_backend(backend, spent: dict) -> None:
    """Replace each of the backend's TIMED methods by one that adds its wall time to spent[name]."""
    for name in TIMED:
        method = getattr(backend, name, None)
        if method is None:
            continue

        def timed(*args, _method=method, _name=name, **kwargs):
            started = time.perf_counter()
            try:
                return _method(*args, **kwargs)
            finally:
                spent[_name] = spent.get(_name, 0.0) + time.perf_counter() - started
        setattr(backend, name, timed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model", nargs="?", help="a .tinyloop file (default: the default model, pulled if needed)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 1536, 4096])
    parser.add_argument("--chunk", type=int, help="prefill chunk (default: the engine's on this backend: 32 on "
                                                  "the CPU, 128 on CUDA)")
    args = parser.parse_args()
    if args.model is None:
        from tinyloop.convert.pull import ensure_default_model
        args.model = str(ensure_default_model())
    model = load_model(args.model).model
    chunk = args.chunk or default_prefill_chunk(model.backend)
    spent: dict = {}
    wrap_backend(model.backend, spent)
    rng = np.random.default_rng(0)
    print(f"{'tokens':>7} {'seconds':>8} {'tok/s':>7}  " + "  ".join(f"{n:>15}" for n in ("linear", "attention",
                                                                                            "kv write", "other")))
    for length in args.lengths:
        prompt = [int(t) for t in rng.integers(100, model.config.vocab_size - 100, length)]
        request = GenerationRequest(prompt, 1, loops=1, ignore_eos=True)
        generate(model, request, prefill_chunk=chunk)                  # warm-up
        spent.clear()
        started = time.perf_counter()
        generate(model, request, prefill_chunk=chunk)
        total = time.perf_counter() - started
        linear = spent.get("linear", 0.0)
        attention = spent.get("attention", 0.0) + spent.get("attention_parts", 0.0)
        write = spent.get("kv_write", 0.0) + spent.get("kv_write_parts", 0.0)
        other = total - linear - attention - write
        cells = [f"{v:6.2f} s ({v / total:4.0%})" for v in (linear, attention, write, other)]
        print(f"{length:>7} {total:>8.2f} {length / total:>7.0f}  " + "  ".join(f"{c:>15}" for c in cells))


if __name__ == "__main__":
    main()
