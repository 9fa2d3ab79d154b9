"""Plain vs speculative vs tree decoding, side by side, plus the cost model.

    python scripts/bench_speculative.py                          # tiny-looped and doc-407m
    python scripts/bench_speculative.py --presets tiny-looped --max-tokens 128

For each preset: greedy generation at verify_loops, then speculative (chain) and
tree decoding for several (draft_loops, verify_loops, draft_ahead, K) settings on the
same prompts, in this one process: tokens/s, speedup over plain, acceptance. Every
run's tokens are checked equal to plain generation's.

The cost model times one plain step at verify_loops, one draft step at draft_loops,
and one verify pass over n tokens (the part after the reused draft state), each
relative to a plain step; with them the speedup at any acceptance rate a (i.i.d.
per token, chain of k drafts) is  E[tokens/round] * t_plain / (k t_draft + t_verify(k+1)),
E[tokens/round] = (1 - a^(k+1)) / (1 - a).
"""
import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tinyloop.engine.generate import (  # noqa: E402
    GenerationRequest,
    generate,
    speculative_generate,  # noqa: E402
)
from tinyloop.engine.speculative import SpeculativeParams  # noqa: E402
from tinyloop.model.loader import load_model  # noqa: E402
from tinyloop.model.testmodels import make_test_model  # noqa: E402
from tinyloop.model.transformer import Trunk  # noqa: E402

SETTINGS = {
    "tiny-looped": [(2, 8, 4, 1), (4, 8, 4, 1), (4, 8, 8, 1), (4, 8, 4, 4), (6, 8, 6, 1), (6, 8, 6, 4)],
    "doc-407m": [(2, 8, 4, 1), (4, 8, 4, 1), (4, 8, 4, 4), (6, 8, 4, 1)],
}


def best_time(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def cost_model(model, draft_loops, verify_loops, context, sizes, repeats):
    """Seconds of one plain step, one draft step, and verify passes of n tokens."""
    c = model.config
    cache = model.new_cache(context + max(sizes) + 1, verify_loops, extra_slots=c.n_coda)
    prompt = np.arange(context) % c.vocab_size
    model.forward(prompt, np.arange(context), cache, verify_loops, exact=False, last_only=True)
    draft_coda = c.n_layer_instances(verify_loops)

    def plain():
        model.forward([1], [context], cache, verify_loops)

    def draft():
        plan = model.contiguous_plan(context, 1, cache)
        trunk = model.trunk([1], plan, cache, draft_loops)
        model.head(model.coda(trunk.hidden, plan, cache, draft_coda))

    out = {"plain": best_time(plain, repeats), "draft": best_time(draft, repeats)}
    for n in sizes:
        tokens = np.arange(n) % c.vocab_size
        state = model.trunk(tokens, model.contiguous_plan(context, n, cache), cache, draft_loops)

        def verify():
            plan = model.contiguous_plan(context, n, cache)
            trunk = model.resume(Trunk(state.hidden, state.injected, draft_loops), plan, cache, verify_loops)
            model.head(model.coda(trunk.hidden, plan, cache, model.coda_base(verify_loops)))

        out[n] = best_time(verify, repeats)
    return out


def predicted_speedup(cost, k, rate):
    tokens = (1 - rate ** (k + 1)) / (1 - rate) if rate < 1 else k + 1
    return tokens * cost["plain"] / (k * cost["draft"] + cost[k + 1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["tiny-looped", "doc-407m"])
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=None,
                        help="tokens per prompt (default 64 tiny, 12 doc-407m)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="best of N timings per row (default 3 for tiny presets, 1 otherwise)")
    parser.add_argument("--cache-dir", default=os.environ.get("TMPDIR", "/tmp"))
    args = parser.parse_args()
    print(f"numpy {np.__version__}, {os.cpu_count()} CPUs; greedy; tokens checked equal to plain")

    for preset in args.presets:
        path = Path(args.cache_dir) / f"bench-{preset}-seed0.tinyloop"
        if not path.exists():
            make_test_model(path, preset, seed=0, dtype=np.float16 if preset == "doc-407m" else np.float32)
        model = load_model(path).model
        tiny = preset.startswith("tiny")
        max_tokens = args.max_tokens or (64 if tiny else 12)
        repeats = args.repeats or (3 if tiny else 1)
        rng = np.random.default_rng(0)
        prompts = [[int(t) for t in rng.integers(0, model.config.vocab_size, 16)] for _ in range(args.prompts)]
        print(f"\n== {preset}: {args.prompts} prompts x {max_tokens} tokens")
        print(f"{'mode':<17} {'d':>2} {'v':>2} {'ahead':>5} {'K':>2} {'tok/s':>8} {'vs plain':>8} "
              f"{'accept':>7} {'acc/round':>9}  by depth")
        plain_rates = {}
        for d, v, ahead, k in SETTINGS.get(preset, SETTINGS["tiny-looped"]):
            if v not in plain_rates:
                best = float("inf")
                for _ in range(repeats):
                    start, reference = time.perf_counter(), []
                    for prompt in prompts:
                        reference.append(generate(model, GenerationRequest(prompt, max_tokens, loops=v,
                                                                           ignore_eos=True)).tokens)
                    best = min(best, time.perf_counter() - start)
                plain_rates[v] = (len(prompts) * max_tokens / best, reference)
                print(f"{'generate':<17} {'':>2} {v:>2} {'':>5} {'':>2} {plain_rates[v][0]:>8.2f} {1.0:>8.2f}")
            rate, reference = plain_rates[v]
            best = float("inf")
            for _ in range(repeats):
                start, stats = time.perf_counter(), []
                for prompt, expected in zip(prompts, reference):
                    out = speculative_generate(model, GenerationRequest(prompt, max_tokens, ignore_eos=True),
                                               SpeculativeParams(d, v, ahead, k))
                    assert out.tokens == expected, "speculative output differs from plain generation"
                    stats.append(out.speculative)
                best = min(best, time.perf_counter() - start)
            spec_rate = len(prompts) * max_tokens / best
            accepted = sum(s.accepted for s in stats)
            tried = sum(sum(s.drafted_at_depth) for s in stats)
            rounds = sum(s.rounds for s in stats)
            depth_rates = np.mean([s.acceptance_by_depth for s in stats if s.acceptance_by_depth], axis=0)
            name = "speculative" if k == 1 else "tree_speculative"
            print(f"{name:<17} {d:>2} {v:>2} {ahead:>5} {k:>2} {spec_rate:>8.2f} {spec_rate / rate:>8.2f} "
                  f"{accepted / max(tried, 1):>7.2f} {accepted / max(rounds, 1):>9.2f}  "
                  f"{' '.join(f'{r:.2f}' for r in depth_rates)}", flush=True)

        d, v = SETTINGS.get(preset, SETTINGS["tiny-looped"])[1][:2]
        sizes = [1, 2, 3, 5, 9, 17, 33, 65] if tiny else [1, 2, 5, 9]
        cost = cost_model(model, d, v, 64, sizes, repeats=5 if tiny else 2)
        print(f"\ncost model at d={d}, v={v}, context 64 (relative to one plain step of "
              f"{cost['plain'] * 1000:.2f} ms):")
        print(f"  draft step: {cost['draft'] / cost['plain']:.2f}")
        print("  verify pass over n tokens: " + ", ".join(f"n={n}: {cost[n] / cost['plain']:.2f}" for n in sizes))
        for k in (2, 4, 8):
            if k + 1 in cost:
                print(f"  predicted speedup, chain k={k}: " + ", ".join(
                    f"a={a}: {predicted_speedup(cost, k, a):.2f}" for a in (0.5, 0.7, 0.9)))


if __name__ == "__main__":
    main()
