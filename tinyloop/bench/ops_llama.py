"""llama.cpp's measurements through llama-cpp-python, run inside a worker process.

The same ops as ops_tinyloop.py on the same token ids: prefill by evaluating the
prompt, generation by llama.cpp's own greedy sampler (temperature 0), its cache reset
before every run so no prompt prefix is reused between runs.
"""
from __future__ import annotations

import time

from tinyloop.bench.stats import repeat_for


class LlamaOps:
    def __init__(self):
        self.llama = None

    def load(self, path: str, threads: int, n_ctx: int) -> dict:
        import llama_cpp
        start = time.perf_counter()
        self.llama = llama_cpp.Llama(path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, n_batch=512,
                                     verbose=False)
        return {"version": llama_cpp.__version__, "vocab_size": self.llama.n_vocab(),
                "load_s": time.perf_counter() - start, "threads": threads}

    def prefill(self, prompt: list, loops: int, min_seconds: float, kv_mode: str | None = None) -> dict:
        llama = self.llama

        def once():
            llama.reset()
            start = time.perf_counter()
            llama.eval(prompt)
            return len(prompt), time.perf_counter() - start
        tokens, seconds = repeat_for(min_seconds, once)
        return {"value": tokens / seconds}

    def generate(self, prompt: list, tokens: int, loops: int, min_seconds: float,
                 kv_mode: str | None = None) -> dict:
        llama = self.llama
        firsts = []

        def once():
            llama.reset()
            start = time.perf_counter()
            count, first = 0, None
            for _ in llama.generate(list(prompt), temp=0.0, repeat_penalty=1.0, reset=False):
                count += 1
                if first is None:
                    first = time.perf_counter()
                if count == tokens:
                    break
            firsts.append(first - start)
            return count - 1, time.perf_counter() - first
        steps, seconds = repeat_for(min_seconds, once)
        return {"decode_tok_s": steps / seconds, "ttft_ms": 1000 * sum(firsts) / len(firsts)}

    def verify_cost(self, prompt: list, rows: int, repeats: int) -> dict:
        """Seconds of one decode step and of one batch of `rows` tokens after `prompt`, each the
        best of `repeats`. llama.cpp evaluates the batch in one pass but, as loaded here,
        computes the head's logits for its last row only (a verify needs every row's)."""
        import numpy as np
        llama = self.llama
        tokens = [int(t) for t in (np.arange(rows) * 7 + 11) % llama.n_vocab()]
        llama.reset()
        llama.eval(prompt)

        def best(n):
            fastest = float("inf")
            for _ in range(repeats):
                llama.n_tokens = len(prompt)             # eval drops the cache past n_tokens: the same rows again
                start = time.perf_counter()
                llama.eval(tokens[:n])
                fastest = min(fastest, time.perf_counter() - start)
            return fastest
        best(rows)
        one, many = best(1), best(rows)
        return {"decode_s": one, "verify_s": many, "rows": rows, "ratio": many / one}

    def memory(self) -> dict:
        from tinyloop.bench.ops_tinyloop import _memory
        return _memory()
