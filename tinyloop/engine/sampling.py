"""Sampling: penalties, logit bias, grammar, temperature, top-k, top-p, min-p, and a
seeded random stream per request.

Order of operations on a logits vector (float64), the "shaped" scores:
1. repetition_penalty r (CTRL-style) on every token id seen so far, prompt included:
   a positive logit is divided by r, a negative one multiplied by r;
2. presence/frequency penalties (OpenAI's definition) on tokens generated so far:
   logit -= frequency_penalty * count + presence_penalty * (count > 0);
3. logit_bias: added to the listed ids (OpenAI: -100 bans a token, +100 forces it);
4. a grammar constraint (response_format, tools): refused tokens get -inf;
then:
5. temperature 0 -> greedy argmax (lowest id on ties), no randomness consumed;
6. otherwise scores / temperature -> top_k (k largest, ties to lower ids; 0 = off)
   -> softmax -> top_p (the smallest most-probable prefix whose mass reaches top_p;
   top_p = 0 keeps only the most likely token) -> min_p (drop tokens whose probability
   is below min_p times the most likely one's) -> one uniform draw from the request's
   own generator picks the token.

Logprobs report log_softmax(shaped / temperature) (temperature 1 when greedy): the
distribution after every step that changes the scores (penalties, bias, grammar,
temperature), before the truncations (top-k, top-p, min-p), which would make most
entries -inf (every entry but one under greedy decoding).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from tinyloop.backends.reference.topk import log_normalizer, top_k_ids
from tinyloop.errors import RequestError

MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True)
class TokenLogprobs:
    """One generated token's log-probability and its best alternatives ((id, logprob), best first)."""
    token: int
    logprob: float
    top: tuple = ()


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    min_p: float = 0.0
    logit_bias: tuple = ()            # ((token_id, bias), ...), bias in [-100, 100]

    def __post_init__(self):
        _check_number("temperature", self.temperature, 0.0, 2.0)
        _check_number("top_p", self.top_p, 0.0, 1.0)
        _check_number("repetition_penalty", self.repetition_penalty, 0.0, 10.0, low_open=True)
        _check_number("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_number("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
        _check_number("min_p", self.min_p, 0.0, 1.0)
        for token_id, bias in self.logit_bias:
            _check_number("logit_bias", bias, -100.0, 100.0)
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise RequestError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}", "top_k")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed < 2**64):
            raise RequestError(f"seed must be an integer in [0, 2^64), got {self.seed!r}", "seed")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    @property
    def shapes_scores(self) -> bool:
        """Anything that changes the raw logits before the greedy argmax."""
        return self.has_penalties or bool(self.logit_bias)


def _check_number(name, value, low, high, low_open=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise RequestError(f"{name} must be a number, got {value!r}", name)
    if value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise RequestError(f"{name} must be in {bracket}{low}, {high}], got {value}", name)


class Sampler:
    """Per-request sampling state: the random generator and the token history."""

    def __init__(self, params: SamplingParams, vocab_size: int, prompt_ids=(), constraint=None,
                 top_logprobs: int | None = None):
        """constraint: a GrammarConstraint (tinyloop/grammar) or None; top_logprobs: None
        for no logprobs, else how many alternatives each token reports (0..20)."""
        self.params = params
        self.vocab_size = vocab_size
        self.constraint = constraint
        self.top_logprobs = top_logprobs
        self.bias_ids = np.array([t for t, _ in params.logit_bias], dtype=np.int64)     # (B,)
        self.bias_values = np.array([b for _, b in params.logit_bias], dtype=np.float64)  # (B,)
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.seen = np.zeros(vocab_size, bool)            # (V,) prompt + generated
        self.generated_counts = np.zeros(vocab_size, np.int64)
        self.seen[np.asarray(list(prompt_ids), dtype=np.int64)] = True

    @property
    def needs_host(self) -> bool:
        """Greedy steps must bring the logits to the host (not just the argmax)."""
        return self.params.shapes_scores or self.constraint is not None or self.top_logprobs is not None

    def observe(self, token_id: int) -> None:
        """Record a generated token (for the penalties and the grammar)."""
        self.seen[token_id] = True
        self.generated_counts[token_id] += 1
        if self.constraint is not None:
            self.constraint.advance(token_id)

    @contextmanager
    def assuming(self, tokens):
        """Scores computed inside see `tokens` as generated too (a draft path not yet
        accepted): penalties and grammar; the history is restored on exit."""
        tokens = list(tokens)
        if self.constraint is not None:
            with self.constraint.assuming(tokens), self._assuming_penalties(tokens):
                yield
            return
        with self._assuming_penalties(tokens):
            yield

    @contextmanager
    def _assuming_penalties(self, tokens):
        if not tokens or not self.params.has_penalties:
            yield
            return
        ids = np.asarray(tokens, dtype=np.int64)
        saved_seen, saved_counts = self.seen[ids].copy(), self.generated_counts[ids].copy()
        for token in tokens:
            self.seen[token] = True
            self.generated_counts[token] += 1
        try:
            yield
        finally:
            self.seen[ids] = saved_seen
            self.generated_counts[ids] = saved_counts

    def shaped(self, logits) -> np.ndarray:
        """logits: (V,) -> float64 (V,) after penalties, logit bias and the grammar."""
        p = self.params
        out = np.array(logits, dtype=np.float64)
        if p.repetition_penalty != 1.0:
            seen = self.seen
            out[seen] = np.where(out[seen] > 0, out[seen] / p.repetition_penalty,
                                 out[seen] * p.repetition_penalty)
        if p.presence_penalty or p.frequency_penalty:
            counts = self.generated_counts
            out -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
        if self.bias_ids.size:
            out[self.bias_ids] += self.bias_values
        if self.constraint is not None:
            self.constraint.apply(out)
        return out

    def probabilities(self, logits) -> np.ndarray:
        """The distribution the next token is drawn from: (V,) float64, zeros outside
        top-k/top-p/min-p. At temperature 0, all mass on the greedy token."""
        return self.distribution(self.shaped(logits))

    def distribution(self, scores: np.ndarray) -> np.ndarray:
        """probabilities() from already shaped scores (V,) float64 (modified in place)."""
        probs = np.zeros(scores.shape[0], np.float64)
        if self.params.greedy:
            probs[int(np.argmax(scores))] = 1.0
            return probs
        scores /= self.params.temperature
        candidates = self._top_k_candidates(scores)               # ids, best first
        weights = np.exp(scores[candidates] - scores[candidates[0]])
        weights /= weights.sum()
        if self.params.top_p < 1.0:
            reach = np.cumsum(weights)
            keep = int(np.searchsorted(reach, self.params.top_p, side="left")) + 1
            candidates, weights = candidates[:keep], weights[:keep]
            weights = weights / weights.sum()
        if self.params.min_p > 0.0:
            keep = int(np.count_nonzero(weights >= self.params.min_p * weights[0]))   # weights: best first
            candidates, weights = candidates[:keep], weights[:keep] / weights[:keep].sum()
        probs[candidates] = weights
        return probs

    def _top_k_candidates(self, scores: np.ndarray) -> np.ndarray:
        return top_k_ids(scores, self.params.top_k)

    def greedy_token(self, logits) -> int:
        return int(np.argmax(self.shaped(logits)))

    def sample(self, logits) -> int:
        """Pick the next token id. Greedy consumes no randomness; sampling one uniform."""
        return self.sample_with_logprobs(logits)[0]

    def sample_with_logprobs(self, logits) -> tuple:
        """(token id, TokenLogprobs or None): the grammar mask is computed once for both."""
        scores = self.shaped(logits)
        report = self.top_logprobs is not None
        kept = scores.copy() if report else scores
        if self.params.greedy:
            token = int(np.argmax(scores))
        else:
            token = self.draw(self.distribution(scores))
        return token, (self.logprobs_of(kept, token) if report else None)

    def logprobs_of(self, scores: np.ndarray, token: int) -> "TokenLogprobs":
        """The reported logprobs of `token` from shaped scores (V,) float64 (see the module doc)."""
        temperature = self.params.temperature if not self.params.greedy else 1.0
        scaled = scores / temperature
        log_probs = scaled - log_normalizer(scaled)                      # (V,)
        top = []
        if self.top_logprobs:
            ids = top_k_ids(log_probs, self.top_logprobs)[:self.top_logprobs]
            top = [(int(i), float(log_probs[i])) for i in ids if np.isfinite(log_probs[i])]
        return TokenLogprobs(token, float(log_probs[token]), tuple(top))

    def draw(self, probs: np.ndarray, rng: np.random.Generator | None = None) -> int:
        """Inverse-CDF draw from a (V,) distribution with one uniform (of `rng`, by
        default the request's own stream)."""
        cumulative = np.cumsum(probs)
        u = (rng or self.rng).random() * cumulative[-1]
        index = int(np.searchsorted(cumulative, u, side="right"))
        if index >= probs.shape[0]:          # u rounded up onto the total
            index = int(np.flatnonzero(probs)[-1])
        return index


def next_tokens_with_logprobs(sampler: Sampler, backend, logits) -> list[tuple]:
    """[(token id, TokenLogprobs or None)] per row of device logits (T, V). Greedy without
    penalties, bias, grammar or logprobs asks the backend for the argmax, so only ids cross
    to the host; anything else brings the rows over and uses the float64 host sampler (the
    reference)."""
    if sampler.params.greedy and not sampler.needs_host:
        return [(int(t), None) for t in backend.argmax(logits)]
    return [sampler.sample_with_logprobs(row) for row in backend.to_host(logits)]
