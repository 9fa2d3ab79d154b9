"""Sampling: penalties, temperature, top-k, top-p, and a seeded random stream per request.

Order of operations on a logits vector (float64):
1. repetition_penalty r (CTRL-style) on every token id seen so far, prompt included:
   a positive logit is divided by r, a negative one multiplied by r;
2. presence/frequency penalties (OpenAI's definition) on tokens generated so far:
   logit -= frequency_penalty * count + presence_penalty * (count > 0);
3. temperature 0 -> greedy argmax (lowest id on ties), no randomness consumed;
4. otherwise logits / temperature -> top_k (k largest, ties to lower ids; 0 = off)
   -> softmax -> top_p (the smallest most-probable prefix whose mass reaches top_p;
   top_p = 0 keeps only the most likely token)
   -> one uniform draw from the request's own generator picks the token.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from tinyloop.backends.cpu.topk import top_k_ids
from tinyloop.errors import RequestError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None

    def __post_init__(self):
        _check_number("temperature", self.temperature, 0.0, 2.0)
        _check_number("top_p", self.top_p, 0.0, 1.0)
        _check_number("repetition_penalty", self.repetition_penalty, 0.0, 10.0, low_open=True)
        _check_number("presence_penalty", self.presence_penalty, -2.0, 2.0)
        _check_number("frequency_penalty", self.frequency_penalty, -2.0, 2.0)
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


def _check_number(name, value, low, high, low_open=False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise RequestError(f"{name} must be a number, got {value!r}", name)
    if value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise RequestError(f"{name} must be in {bracket}{low}, {high}], got {value}", name)


class Sampler:
    """Per-request sampling state: the random generator and the token history."""

    def __init__(self, params: SamplingParams, vocab_size: int, prompt_ids=()):
        self.params = params
        self.vocab_size = vocab_size
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self.seen = np.zeros(vocab_size, bool)            # (V,) prompt + generated
        self.generated_counts = np.zeros(vocab_size, np.int64)
        self.seen[np.asarray(list(prompt_ids), dtype=np.int64)] = True

    def observe(self, token_id: int) -> None:
        """Record a generated token (for the penalties)."""
        self.seen[token_id] = True
        self.generated_counts[token_id] += 1

    @contextmanager
    def assuming(self, tokens):
        """Penalties computed inside see `tokens` as generated too (a draft path
        not yet accepted); the history is restored on exit."""
        tokens = list(tokens)
        if not tokens or not self.params.has_penalties:
            yield
            return
        ids = np.asarray(tokens, dtype=np.int64)
        saved_seen, saved_counts = self.seen[ids].copy(), self.generated_counts[ids].copy()
        for token in tokens:
            self.observe(token)
        try:
            yield
        finally:
            self.seen[ids] = saved_seen
            self.generated_counts[ids] = saved_counts

    def penalized(self, logits) -> np.ndarray:
        """logits: (V,) -> float64 (V,) after repetition/presence/frequency penalties."""
        p = self.params
        out = np.array(logits, dtype=np.float64)
        if p.repetition_penalty != 1.0:
            seen = self.seen
            out[seen] = np.where(out[seen] > 0, out[seen] / p.repetition_penalty,
                                 out[seen] * p.repetition_penalty)
        if p.presence_penalty or p.frequency_penalty:
            counts = self.generated_counts
            out -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
        return out

    def probabilities(self, logits) -> np.ndarray:
        """The distribution the next token is drawn from: (V,) float64, zeros outside
        top-k/top-p. At temperature 0, all mass on the greedy token."""
        scores = self.penalized(logits)
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
        probs[candidates] = weights
        return probs

    def _top_k_candidates(self, scores: np.ndarray) -> np.ndarray:
        return top_k_ids(scores, self.params.top_k)

    def greedy_token(self, logits) -> int:
        return int(np.argmax(self.penalized(logits)))

    def sample(self, logits) -> int:
        """Pick the next token id. Greedy consumes no randomness; sampling one uniform."""
        if self.params.greedy:
            return self.greedy_token(logits)
        return self.draw(self.probabilities(logits))

    def draw(self, probs: np.ndarray, rng: np.random.Generator | None = None) -> int:
        """Inverse-CDF draw from a (V,) distribution with one uniform (of `rng`, by
        default the request's own stream)."""
        cumulative = np.cumsum(probs)
        u = (rng or self.rng).random() * cumulative[-1]
        index = int(np.searchsorted(cumulative, u, side="right"))
        if index >= probs.shape[0]:          # u rounded up onto the total
            index = int(np.flatnonzero(probs)[-1])
        return index


def next_tokens(sampler: Sampler, backend, logits) -> list[int]:
    """One token per row of device logits (T, V). Greedy without penalties asks the
    backend for the argmax, so only ids cross to the host; anything else brings the
    rows over and uses the float64 host sampler (the reference)."""
    if sampler.params.greedy and not sampler.params.has_penalties:
        return [int(t) for t in backend.argmax(logits)]
    return [sampler.sample(row) for row in backend.to_host(logits)]
