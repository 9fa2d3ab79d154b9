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

from tinyloop.engine.decode import CachedPrompt, prefill_passes
from tinyloop.kv.prefix import slot_keys
from tinyloop.engine.sampling import next_tokens_with_logprobs
from tinyloop.limits import DEFAULT_PREFILL_CHUNK
from tinyloop.model.batch import Pass

KL_DEFAULT = 1e-3


class AdaptiveDecoder:
    def __init__(self, model, request, loops: int, sampler, sink, pool=None, chunk: int = DEFAULT_PREFILL_CHUNK):
        self.model, self.depth, self.sampler, self.sink = model, loops, sampler, sink
        self.prompt = list(request.prompt_ids)
        self.chunk = chunk
        self.prefilled = None                   # called once the prompt is in the cache
        self.threshold = request.exit_threshold if request.exit_threshold is not None \
            else model.config.exit_threshold
        self.cache = model.new_cache(len(self.prompt) + request.max_tokens, loops, window=request.cache_window,
                                     pool=pool)
        self.cached = CachedPrompt(pool, self.cache, self.prompt, slot_keys(model.config, loops))
        self.loops_used: list[int] = []

    def publish(self) -> None:
        """The prompt's blocks only: generated tokens' skipped iterations hold copied keys and
        values, not what a full-depth forward computes (kv/prefix.py)."""
        self.cached.publish()

    @staticmethod
    def capacity(model, request) -> tuple[int, int]:
        return len(request.prompt_ids) + request.max_tokens, 0

    def passes(self):
        """Generator of the forwards this request needs, to its end."""
        backend = self.model.backend
        logits = yield from prefill_passes(self.model, self.prompt, self.cache, self.depth, self.chunk,
                                           start=self.cached.rows)
        self.cached.publish()
        if self.prefilled is not None:
            self.prefilled()
        self.loops_used.append(self.depth)
        self.sink.push(*next_tokens_with_logprobs(self.sampler, backend, logits)[0])
        while self.sink.finish_reason is None:
            position = self.cache.length
            logits, used = yield from self.decode(self.sink.tokens[-1], position)
            self.cache.length = position + 1
            self.loops_used.append(used)
            self.sink.push(*next_tokens_with_logprobs(self.sampler, backend, logits)[0])

    def decode(self, token: int, position: int):
        """Generator: one token, iterating until the criterion exits -> (logits (1, V), iterations run)."""
        model, depth = self.model, self.depth
        coda_base = model.coda_base(depth)
        criterion = _GateExit(model, self.threshold, depth) if model.config.exit_gate else \
            _KLExit(model, self.threshold, depth, self.cache, coda_base)
        kept: list = []
        step = Pass(self.cache, np.array([position]), position, depth, tokens=[token], exit_check=criterion,
                    kept=kept)
        criterion.step = step
        yield step
        n = step.iterations_run
        self._fill_skipped(step.plan, kept, n)
        logits = criterion.logits
        if logits is None:                    # the gate decides without the coda: run it on the exit state now
            finish = Pass(self.cache, np.array([position]), position, n, trunk=step.trunk_out, coda=coda_base,
                          head="all")
            yield finish
            logits = finish.logits
        return logits, n

    def _fill_skipped(self, plan, kept: list, iterations: int) -> None:
        """The KV of iterations [iterations, depth): copies of the last iteration run's."""
        model, storage = self.model, self.cache.storage
        for iteration in range(iterations, self.depth):
            for index, (keys, values) in enumerate(kept):
                model.backend.kv_write(storage, model.core_slot(iteration, index), plan, keys, values)


class _GateExit:
    """Ouro's rule, after iteration n: the exit gate's lambda_n; exit at the first n whose
    cumulative exit probability reaches the threshold (the last iteration takes the rest)."""

    def __init__(self, model, threshold: float, depth: int):
        self.model, self.threshold, self.depth = model, threshold, depth
        self.remaining, self.cumulative = 1.0, 0.0
        self.logits = None

    def __call__(self, n: int, hidden) -> bool:
        lam = float(self.model.exit_lambda(hidden)[0])
        step = self.remaining if n == self.depth else lam * self.remaining
        self.remaining *= 1.0 - lam
        self.cumulative += step
        return self.cumulative >= self.threshold


class _KLExit:
    """Huginn's rule, after iteration n: the coda and head on the state (whose coda KV rows are
    then those of the exit state), and exit when KL(p_{n-1} || p_n) < threshold (p_0 uniform)."""

    def __init__(self, model, threshold: float, depth: int, cache, coda_base: int):
        self.model, self.threshold, self.depth, self.cache, self.coda_base = model, threshold, depth, cache, coda_base
        self.previous = None                  # log-probabilities after the previous iteration
        self.logits = None
        self.step = None                      # the Pass being run (its plan, once planned)

    def __call__(self, n: int, hidden) -> bool:
        model = self.model
        self.logits = model.head(model.coda(hidden, self.step.plan, self.cache, self.coda_base))
        log_p = _log_softmax(model.backend.to_host(self.logits)[0])
        if self.previous is None:
            self.previous = np.full_like(log_p, -np.log(log_p.shape[0]))
        done = _kl(self.previous, log_p) < self.threshold
        self.previous = log_p
        return done


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
