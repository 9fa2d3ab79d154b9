"""Prefill and decode speed on this machine's CPU, per preset and loop count.

    python scripts/bench_cpu.py                       # tiny-looped and doc-407m, loops 1 and 8
    python scripts/bench_cpu.py --presets tiny-looped --loops 1 4 8 --prompt-tokens 256

Models are written once to --cache-dir (random weights, seed 0). Prefill runs the
GEMM path over the prompt; decode runs the row-invariant single-token path, which
is what generation, drafting and verifying use.
"""
import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tinyloop.model.loader import load_model  # noqa: E402
from tinyloop.model.testmodels import make_test_model  # noqa: E402


def bench(loaded, loops, prompt_tokens, decode_tokens, repeats):
    model = loaded.model
    vocab = model.config.vocab_size
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, vocab, prompt_tokens)
    prefill_best, decode_best = float("inf"), float("inf")
    for _ in range(repeats):
        cache = model.new_cache(prompt_tokens + decode_tokens, loops)
        start = time.perf_counter()
        model.forward(prompt, np.arange(prompt_tokens), cache, loops, exact=False, last_only=True)
        prefill_best = min(prefill_best, time.perf_counter() - start)
        start = time.perf_counter()
        for step in range(decode_tokens):
            position = prompt_tokens + step
            model.forward(rng.integers(0, vocab, 1), np.array([position]), cache, loops)
        decode_best = min(decode_best, time.perf_counter() - start)
    return prompt_tokens / prefill_best, decode_tokens / decode_best


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["tiny-looped", "doc-407m"])
    parser.add_argument("--loops", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2, help="best of N runs")
    parser.add_argument("--cache-dir", default=os.environ.get("TMPDIR", "/tmp"))
    args = parser.parse_args()

    print(f"numpy {np.__version__}, {os.cpu_count()} CPUs")
    print(f"{'preset':<14} {'loops':>5} {'layers/token':>12} {'prefill tok/s':>14} {'decode tok/s':>13}")
    for preset in args.presets:
        path = Path(args.cache_dir) / f"bench-{preset}-seed0.tinyloop"
        if not path.exists():
            make_test_model(path, preset, seed=0, dtype=np.float16 if preset == "doc-407m" else np.float32)
        loaded = load_model(path)
        for loops in args.loops:
            loops = min(loops, loaded.config.max_loops)
            decode = args.decode_tokens if preset.startswith("tiny") else max(4, args.decode_tokens // 4)
            prefill_tps, decode_tps = bench(loaded, loops, args.prompt_tokens, decode, args.repeats)
            print(f"{preset:<14} {loops:>5} {loaded.config.n_layer_instances(loops):>12} "
                  f"{prefill_tps:>14.1f} {decode_tps:>13.2f}", flush=True)
        del loaded


if __name__ == "__main__":
    main()
