"""KV cache modes: quality and memory, side by side in one run, and speed from `tinyloop bench`.

    python scripts/eval_kvcache.py [--model PATH] [--ppl-tokens 8192]

1. Perplexity of the model (default: the pulled SmolLM2) on the shipped text per mode
   (fp16 is the reference; int4 and int4-h show what the Hadamard rotation buys).
2. Logit differences against fp16, teacher-forced over a few texts: the maximum and
   mean absolute difference, and how often the top-1 token agrees.
3. Cache bytes per token per layer instance, and decode tokens/s at a 1k context, measured
   by `tinyloop bench MODEL --kv-cache MODES ...` (run at the end, in processes of its own).
4. The document-shaped preset at 8 loops: cache memory at a 4k context per mode
   (real allocations, KVCache.nbytes).
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tinyloop.backends.reference import NumpyBackend  # noqa: E402
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


def decode_speeds(path, loops: int, context: int = 1024) -> dict:
    """Decode tokens/s per KV mode after a `context`-token prompt, by `tinyloop bench`."""
    command = [sys.executable, "-m", "tinyloop", "bench", str(path), "--no-http", "--json", "--kv-cache", *MODES,
               "--loops", str(loops), "--prompt-lengths", str(context), "--context", str(context),
               "--decode-tokens", "32", "--rounds", "3", "--no-speculative"]
    report = json.loads(subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT).stdout)
    return {row["params"]["kv_mode"]: row["engines"]["TinyLoop"]["median"]
            for row in report["figures"] if row["figure"] == "decode"}


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
    rows = []
    for mode in MODES:
        loaded = load_model(path, kv_mode=mode)
        result = perplexity(loaded, text, 512, 256, max_tokens=args.ppl_tokens, progress=False)
        logits = [teacher_forced_logits(loaded, loaded.tokenizer.encode(t)) for t in texts]
        diffs = np.concatenate([np.abs(a - r).ravel() for a, r in zip(logits, ref_logits)])
        agree = np.mean(np.concatenate([a.argmax(1) == r.argmax(1) for a, r in zip(logits, ref_logits)]))
        rows.append((mode, result.perplexity, diffs.max(), diffs.mean(), agree,
                     loaded.backend.kv_bytes_per_row(mode, c.n_kv_heads, c.head_dim)))
        print(f"  {mode}: perplexity {result.perplexity:.4f}", file=sys.stderr, flush=True)
    speeds = decode_speeds(path, c.default_loops)
    print(f"{'mode':<7} {'ppl':>9} {'vs fp16':>8} {'max|dlogit|':>11} {'mean|dlogit|':>12} {'top-1 agree':>11} "
          f"{'B/token/inst':>12} {'decode tok/s @1k':>17}")
    ppl_ref = rows[0][1]
    for mode, ppl, max_diff, mean_diff, agree, per_instance in rows:
        print(f"{mode:<7} {ppl:>9.4f} {ppl / ppl_ref:>8.4f} {max_diff:>11.4f} {mean_diff:>12.4f} {agree:>11.4f} "
              f"{per_instance:>12} {speeds[mode]:>17.1f}", flush=True)
    print(f"(perplexity over the first {result.tokens_scored} scored tokens of {TEXT.name}, window 512, stride 256)")

    doc = PRESETS["doc-407m"]
    config = ModelConfig(name="doc", eos_token_ids=(), **doc)
    slots = config.n_layer_instances(8)
    print(f"\ndoc-407m at 8 loops ({slots} layer instances, n_kv {config.n_kv_heads}, head_dim {config.head_dim}), "
          "4096-token context:")
    for mode in MODES:
        backend = NumpyBackend()
        cache = KVCache(backend, slots, config.n_kv_heads, config.head_dim, 4096, mode)
        print(f"  {mode:<7} {cache.nbytes / 2**30:7.3f} GiB "
              f"({backend.kv_bytes_per_row(mode, config.n_kv_heads, config.head_dim)} bytes per token per "
              f"layer instance on the CPU)")
        del cache


if __name__ == "__main__":
    main()
