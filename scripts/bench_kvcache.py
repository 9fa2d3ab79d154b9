"""KV cache modes: quality, memory and speed, side by side in one run.

    python scripts/bench_kvcache.py [--model PATH] [--ppl-tokens 8192]

1. Perplexity of the model (default: the pulled SmolLM2) on the shipped text per mode
   (fp16 is the reference; int4 and int4-h show what the Hadamard rotation buys).
2. Logit differences against fp16, teacher-forced over a few texts: the maximum and
   mean absolute difference, and how often the top-1 token agrees.
3. Cache bytes per token per layer instance, and decode tokens/s at a 1k context.
4. The document-shaped preset at 8 loops: cache memory at a 4k context per mode
   (real allocations, KVCache.nbytes).
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tinyloop.backends.cpu import CpuBackend  # noqa: E402
from tinyloop.convert.pull import ensure_default_model  # noqa: E402
from tinyloop.kv.cache import KVCache  # noqa: E402
from tinyloop.model.config import ModelConfig  # noqa: E402
from tinyloop.model.evaluate import perplexity  # noqa: E402
from tinyloop.model.loader import load_model  # noqa: E402
from tinyloop.model.testmodels import PRESETS  # noqa: E402

MODES = ["fp16", "fp32", "int8", "int4", "int4-h"]
TEXT = ROOT / "tests" / "data" / "jargon-4.4.7-excerpt.txt"
PROMPTS = ["The capital of France is a city of art, food and history. Its museums",
           "def quicksort(items):\n    if len(items) <= 1:\n        return items\n",
           "Once upon a time, in a small village by the sea, there lived an old fisherman who"]


def teacher_forced_logits(loaded, ids):
    model = loaded.model
    cache = model.new_cache(len(ids), 1)
    return model.forward(ids, np.arange(len(ids)), cache, 1, exact=False)


def decode_speed(loaded, context, steps=32):
    model = loaded.model
    ids = np.arange(context) % loaded.config.vocab_size
    cache = model.new_cache(context + steps, 1)
    model.forward(ids, np.arange(context), cache, 1, exact=False, last_only=True)
    start = time.perf_counter()
    for step in range(steps):
        model.forward([5], [context + step], cache, 1)
    return steps / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--ppl-tokens", type=int, default=8192)
    args = parser.parse_args()
    path = args.model or ensure_default_model()
    text = TEXT.read_text(encoding="utf-8")
    texts = PROMPTS + [text[:3000]]

    reference = load_model(path, kv_mode="fp16")
    ref_logits = [teacher_forced_logits(reference, reference.tokenizer.encode(t)) for t in texts]
    c = reference.config
    print(f"model {path}: {c.n_layer_instances(1)} layer instances, n_kv {c.n_kv_heads}, head_dim {c.head_dim}")
    print(f"{'mode':<7} {'ppl':>9} {'vs fp16':>8} {'max|dlogit|':>11} {'mean|dlogit|':>12} {'top-1 agree':>11} "
          f"{'B/token/inst':>12} {'decode tok/s @1k':>17}")
    ppl_ref = None
    for mode in MODES:
        loaded = load_model(path, kv_mode=mode)
        result = perplexity(loaded, text, 512, 256, max_tokens=args.ppl_tokens, progress=False)
        ppl_ref = ppl_ref or result.perplexity
        logits = [teacher_forced_logits(loaded, loaded.tokenizer.encode(t)) for t in texts]
        diffs = np.concatenate([np.abs(a - r).ravel() for a, r in zip(logits, ref_logits)])
        agree = np.mean(np.concatenate([a.argmax(1) == r.argmax(1) for a, r in zip(logits, ref_logits)]))
        per_instance = loaded.backend.kv_bytes_per_row(mode, c.n_kv_heads, c.head_dim)
        print(f"{mode:<7} {result.perplexity:>9.4f} {result.perplexity / ppl_ref:>8.4f} {diffs.max():>11.4f} "
              f"{diffs.mean():>12.4f} {agree:>11.4f} {per_instance:>12} {decode_speed(loaded, 1024):>17.1f}",
              flush=True)
    print(f"(perplexity over the first {result.tokens_scored} scored tokens of {TEXT.name}, window 512, stride 256)")

    doc = PRESETS["doc-407m"]
    config = ModelConfig(name="doc", eos_token_ids=(), **doc)
    slots = config.n_layer_instances(8)
    print(f"\ndoc-407m at 8 loops ({slots} layer instances, n_kv {config.n_kv_heads}, head_dim {config.head_dim}), "
          "4096-token context:")
    for mode in MODES:
        backend = CpuBackend()
        cache = KVCache(backend, slots, config.n_kv_heads, config.head_dim, 4096, mode)
        print(f"  {mode:<7} {cache.nbytes / 2**30:7.3f} GiB "
              f"({backend.kv_bytes_per_row(mode, config.n_kv_heads, config.head_dim)} bytes per token per "
              f"layer instance on the CPU)")
        del cache


if __name__ == "__main__":
    main()
