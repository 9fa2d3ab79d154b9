"""Adaptive depth per token (loops "auto"): each generated token runs core iterations
until an exit criterion says it is done, up to the model's default_loops (its full depth).

Criteria, after iteration n (1-based) of a token:
- a model with an exit gate (Ouro): lambda_n = sigmoid(gate(final_norm(h_n))); the exit
  probability of step n is lambda_n * prod_{j<n} (1 - lambda_j), the last step taking the
  rest; the token exits at the first n whose cumulative exit probability reaches the
  threshold (Ouro's rule; threshold 1.0 = always full depth).
- any other model (Huginn): the KL divergence KL(p_{n-1} || p_n) between the output
  distributions of successive iterations (p_0 uniform) falls below the threshold
  (Huginn's zero-shot rule; its default 1e-3). Computing p_n runs the coda and head after
  every iteration; the coda's KV rows end up those of the exit state.

Skipped iterations still have KV slots that later tokens read. A token that exits after
n < D iterations gets, in every skipped slot (iteration j >= n, core layer c), a copy of
the keys and values its core layer c wrote at iteration n - 1: "the last computed
state's KV", which equals Huginn's latest-per-layer lookup. (Ouro's reference code, given
a threshold, still runs all steps and only picks which step's output to use, so its
later tokens read full-depth KV; here the skipped iterations are really skipped.)

The prompt is prefilled at full depth. loops_used records every generated token's depth
(the first token, from the prefill, at full depth).
"""
from __future__ import annotations

import numpy as np

from tinyloop.engine.decode import prefill
from tinyloop.engine.sampling import next_tokens_with_logprobs

KL_DEFAULT = 1e-3


class AdaptiveDecoder:
    def __init__(self, model, request, loops: int, sampler, sink, alloc=None):
        self.model, self.depth, self.sampler, self.sink = model, loops, sampler, sink
        self.prompt = list(request.prompt_ids)
        self.threshold = request.exit_threshold if request.exit_threshold is not None \
            else model.config.exit_threshold
        self.cache = model.new_cache(len(self.prompt) + request.max_tokens, loops, window=request.cache_window,
                                     alloc=alloc)
        self.loops_used: list[int] = []

    @staticmethod
    def capacity(model, request) -> tuple[int, int]:
        return len(request.prompt_ids) + request.max_tokens, 0

    def prefill(self) -> None:
        logits = prefill(self.model, self.prompt, self.cache, self.depth)
        self.loops_used.append(self.depth)
        self.sink.push(*next_tokens_with_logprobs(self.sampler, self.model.backend, logits)[0])

    def step(self) -> None:
        position = self.cache.length
        logits, used = self.decode(self.sink.tokens[-1], position)
        self.cache.length = position + 1
        self.loops_used.append(used)
        self.sink.push(*next_tokens_with_logprobs(self.sampler, self.model.backend, logits)[0])

    def decode(self, token: int, position: int):
        """One token, iterating until the criterion exits -> (logits (1, V), iterations run)."""
        model, depth = self.model, self.depth
        plan = model.plan(np.array([position]), position, self.cache)
        trunk = model.trunk([token], plan, self.cache, 0)
        coda_base = model.coda_base(depth)
        kept: list = []
        gate = model.config.exit_gate
        remaining, cumulative = 1.0, 0.0
        previous = None                                        # log-probabilities of the previous iteration
        logits = None
        for n in range(1, depth + 1):
            trunk = model.resume(trunk, plan, self.cache, n, kept=kept)
            if gate:
                lam = float(model.exit_lambda(trunk.hidden)[0])
                step = remaining if n == depth else lam * remaining
                remaining *= 1.0 - lam
                cumulative += step
                done = cumulative >= self.threshold
            else:
                logits = model.head(model.coda(trunk.hidden, plan, self.cache, coda_base))
                log_p = _log_softmax(model.backend.to_host(logits)[0])
                if previous is None:
                    previous = np.full_like(log_p, -np.log(log_p.shape[0]))
                done = _kl(previous, log_p) < self.threshold
                previous = log_p
            if done or n == depth:
                break
        self._fill_skipped(plan, kept, n)
        if gate:
            logits = model.head(model.coda(trunk.hidden, plan, self.cache, coda_base))
        return logits, n

    def _fill_skipped(self, plan, kept: list, iterations: int) -> None:
        """The KV of iterations [iterations, depth): copies of the last iteration run's."""
        model, storage = self.model, self.cache.storage
        for iteration in range(iterations, self.depth):
            for index, (keys, values) in enumerate(kept):
                model.backend.kv_write(storage, model.core_slot(iteration, index), plan, keys, values)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    shifted = x - x.max()
    return shifted - np.log(np.exp(shifted).sum())


def _kl(log_p: np.ndarray, log_q: np.ndarray) -> float:
    """KL(p || q) of two log-probability vectors."""
    return float(np.sum(np.exp(log_p) * (log_p - log_q)))


def loops_summary(loops_used: list) -> dict:
    """{"mean": ..., "histogram": {"depth": tokens}} of a request's per-token depths."""
    depths, counts = np.unique(np.asarray(loops_used, np.int64), return_counts=True)
    return {"mean": round(float(np.mean(loops_used)), 4) if loops_used else 0.0,
            "histogram": {str(int(d)): int(c) for d, c in zip(depths, counts)}}
