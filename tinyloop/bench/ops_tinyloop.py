"""TinyLoop's measurements, run inside a worker process (worker.py).

Every op takes the prompt as token ids (the parent sends every engine the same ones)
and returns plain JSON. A measurement repeats until `min_seconds` of timed work, so a
few-millisecond prefill is not timed once. Caches are carved from a KV pool, as the
server's engine carves them (the single-forward measurements use caches of their own). Model code is imported inside the ops, after the worker
has chosen which checkout to measure.
"""
from __future__ import annotations

import time
from importlib import resources

from tinyloop.bench.stats import repeat_for


class TinyLoopOps:
    def __init__(self):
        self.loaded = None
        self.models = {}                    # KV cache mode -> model (one set of weights)
        self.pools = {}

    def load(self, path: str, device: str | None = None, kv_modes: list | None = None) -> dict:
        from tinyloop.kv.pool import KVPool, default_pool_bytes
        from tinyloop.model.loader import load_model
        from tinyloop.model.transformer import LoopedTransformer

        self.loaded = load_model(path, device)
        base = self.loaded.model
        self.models = {base.kv_mode: base}
        for mode in kv_modes or ():
            if mode not in self.models:        # the same weights, another cache mode
                self.models[mode] = LoopedTransformer(base.config, base.weights, base.backend, kv_mode=mode)
        # one pool per cache mode (a pool stores one mode), as the server's engine has one
        self.pools = {mode: KVPool.for_model(m, default_pool_bytes(m)) for mode, m in self.models.items()}
        c = base.config
        return {"name": c.name, "dim": c.dim, "vocab_size": c.vocab_size, "max_seq_len": c.max_seq_len,
                "min_loops": c.min_loops, "default_loops": c.default_loops, "max_loops": c.max_loops,
                "kv_mode": base.kv_mode, "load_s": self.loaded.load_s,
                "backend": getattr(self.loaded.backend, "description", self.loaded.backend.name),
                "quantization": self.loaded.file.quant_summary()}

    def prompt_ids(self, count: int, prompts: int = 1) -> dict:
        """`prompts` different prompts of exactly `count` ids each: consecutive slices of a
        shipped English text, tokenized by the model (BOS first where the model has one)."""
        text = resources.files("tinyloop.data").joinpath("bpe_corpus.txt").read_text("utf-8")
        ids = self.loaded.tokenizer.encode(text)
        need = count * prompts
        ids = (ids * (need // max(len(ids), 1) + 1))[:need]
        return {"prompts": [self.loaded.with_bos(ids[i * count:(i + 1) * count])[:count] for i in range(prompts)]}

    def _model(self, kv_mode):
        return self.models[kv_mode] if kv_mode else self.loaded.model

    def prefill(self, prompt: list, loops: int, min_seconds: float, kv_mode: str | None = None) -> dict:
        """Prompt tokens per second through the prefill (GEMM) path, to the first token's id."""
        from tinyloop.engine.decode import prefill
        model = self._model(kv_mode)

        def once():
            cache = model.new_cache(len(prompt) + 1, loops)
            start = time.perf_counter()
            model.backend.argmax(prefill(model, prompt, cache, loops))
            return len(prompt), time.perf_counter() - start
        tokens, seconds = repeat_for(min_seconds, once)
        return {"value": tokens / seconds}

    def _generate(self, model, prompt, tokens, loops, speculative=None):
        from tinyloop.engine.generate import GenerationRequest, generate, speculative_generate
        request = GenerationRequest(list(prompt), tokens, loops=loops, ignore_eos=True)
        if speculative is None:
            return generate(model, request, pool=self.pools[model.kv_mode])
        from tinyloop.engine.speculative import SpeculativeParams
        return speculative_generate(model, request, SpeculativeParams(*speculative), pool=self.pools[model.kv_mode])

    def generate(self, prompt: list, tokens: int, loops: int, min_seconds: float,
                 kv_mode: str | None = None) -> dict:
        """Greedy generation of `tokens` tokens (end-of-sequence ignored), as a request
        runs: decode tokens per second after the first token, and the time to first token."""
        model = self._model(kv_mode)
        firsts = []

        def once():
            result = self._generate(model, prompt, tokens, loops)
            firsts.append(result.time_to_first_token_s)
            return result.completion_tokens - 1, result.wall_s - result.prefill_s
        steps, seconds = repeat_for(min_seconds, once)
        return {"decode_tok_s": steps / seconds, "ttft_ms": 1000 * sum(firsts) / len(firsts)}

    def speculative(self, prompts: list, tokens: int, draft_loops: int, verify_loops: int, draft_ahead: int,
                    branches: int, min_seconds: float) -> dict:
        """Plain greedy decoding at verify_loops and the same prompts drafted at draft_loops
        (a chain, or a tree of `branches`), alternating prompt by prompt; decode tokens per
        second of both, and every speculative output compared token for token with plain's."""
        model = self.loaded.model
        setting = (draft_loops, verify_loops, draft_ahead, branches)
        plain_steps = plain_seconds = steps = seconds = accepted = tried = rounds = 0
        equal = True
        while seconds < min_seconds or not steps:
            for prompt in prompts:
                reference = self._generate(model, prompt, tokens, verify_loops)
                plain_steps += reference.completion_tokens - 1
                plain_seconds += reference.wall_s - reference.prefill_s
                result = self._generate(model, prompt, tokens, verify_loops, setting)
                steps += result.completion_tokens - 1
                seconds += result.wall_s - result.prefill_s
                stats = result.speculative
                accepted, tried, rounds = accepted + stats.accepted, tried + sum(stats.drafted_at_depth), \
                    rounds + stats.rounds
                equal = equal and result.tokens == reference.tokens
        return {"tok_s": steps / seconds, "plain_tok_s": plain_steps / plain_seconds,
                "acceptance": accepted / max(tried, 1), "accepted_per_round": accepted / max(rounds, 1),
                "equal_to_plain": equal}

    def cost_model(self, draft_loops: int, verify_loops: int, context: int, sizes: list, repeats: int) -> dict:
        """Seconds of one plain decode step at verify_loops, of one draft step at draft_loops,
        and of a verify pass over n tokens (the part after the reused draft state), each the
        best of `repeats`, at a `context`-token cache."""
        import numpy as np

        from tinyloop.model.transformer import Trunk
        model = self.loaded.model
        c = model.config
        cache = model.new_cache(context + max(sizes) + 1, verify_loops, extra_slots=c.n_coda)
        model.forward(np.arange(context) % c.vocab_size, np.arange(context), cache, verify_loops, exact=False,
                      last_only=True)
        draft_coda = c.n_layer_instances(verify_loops)

        def plain():
            model.forward([1], [context], cache, verify_loops)

        def draft():
            plan = model.contiguous_plan(context, 1, cache)
            model.head(model.coda(model.trunk([1], plan, cache, draft_loops).hidden, plan, cache, draft_coda))

        def verify_pass(n):
            state = model.trunk(np.arange(n) % c.vocab_size, model.contiguous_plan(context, n, cache), cache,
                                draft_loops)

            def verify():
                plan = model.contiguous_plan(context, n, cache)
                trunk = model.resume(Trunk(state.hidden, state.injected, draft_loops), plan, cache, verify_loops)
                model.backend.to_host(model.head(model.coda(trunk.hidden, plan, cache,
                                                            model.coda_base(verify_loops))))
            return verify
        costs = {"plain": _best(plain, repeats), "draft": _best(draft, repeats)}
        costs["verify"] = {str(n): _best(verify_pass(n), repeats) for n in sizes}
        return costs

    def verify_cost(self, prompt: list, rows: int, repeats: int) -> dict:
        """Seconds of one decode step and of one exact forward over `rows` new tokens (a
        verify pass's shape) after `prompt`, each the best of `repeats`; the cache is rolled
        back between runs by rewriting the same rows."""
        import numpy as np
        model = self.loaded.model
        loops = model.config.default_loops
        cache = model.new_cache(len(prompt) + rows + 1, loops)
        model.forward(prompt, np.arange(len(prompt)), cache, loops, exact=False, last_only=True)
        start = len(prompt)
        tokens = (np.arange(rows) * 7 + 11) % model.config.vocab_size

        def step(n):
            return lambda: model.backend.to_host(model.forward(tokens[:n], np.arange(start, start + n), cache, loops))
        step(rows)()                                     # warm: the kernels and the cache's pages
        one, many = _best(step(1), repeats), _best(step(rows), repeats)
        return {"decode_s": one, "verify_s": many, "rows": rows, "ratio": many / one}

    def memory(self) -> dict:
        """This worker's resident memory now and at its peak, in MB (the model loaded and run)."""
        return _memory()

    def matmul_share(self, prompt: list, steps: int, loops: int) -> dict:
        """Decode steps and passes of one row through every linear weight a step uses (the
        core's once per loop, and the head) alternating one by one: the matrix products'
        share of a decode step's time, both timed on the same machine state."""
        import numpy as np
        model = self.loaded.model
        backend, layers = model.backend, model.weights.layers
        handles = [getattr(layer, name) for stage, count in (("prelude", 1), ("core", loops), ("coda", 1))
                   for _ in range(count) for layer in layers[stage] for name in ("qkv", "out", "up", "down")]
        handles.append(model.weights.head)
        rows = [backend.asarray(np.ones((1, _in_features(h)), np.float32)) for h in handles]
        cache = model.new_cache(len(prompt) + steps, loops)
        model.forward(prompt, np.arange(len(prompt)), cache, loops, exact=False, last_only=True)
        decode = products = 0.0
        for step in range(steps):
            start = time.perf_counter()
            backend.to_host(model.forward([5], [len(prompt) + step], cache, loops))
            middle = time.perf_counter()
            for row, handle in zip(rows, handles):
                out = backend.linear(row, handle, True)
            backend.to_host(out)
            decode, products = decode + middle - start, products + time.perf_counter() - middle
        return {"value": products / decode}


def _memory() -> dict:
    import resource
    current = None
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                current = int(line.split()[1]) / 1024
    except OSError:
        pass
    return {"rss_mb": current, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def _in_features(handle) -> int:
    return getattr(handle, "in_features", None) or handle.weight.shape[0]


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
