"""One request's grammar state, applied to the scores the sampler draws from.

The matcher (llguidance) advances with every accepted token. A speculative round asks
for the scores of tree nodes that are not accepted yet: `assuming(path)` advances the
matcher along the drafted path and rolls it back afterwards, so every node is masked
exactly as plain decoding would mask it after the same tokens (constrained speculative
== constrained plain). A drafted path the grammar refuses can never be accepted (the
verifier's own scores give its tokens zero probability); its descendants are scored
with a mask that allows only end-of-sequence, so nothing downstream meets an empty
distribution.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from tinyloop.errors import RequestError


class GrammarConstraint:
    def __init__(self, matcher, vocab_size: int, eos_ids):
        """matcher: a fresh llguidance LLMatcher for this request; eos_ids: the model's
        end-of-sequence ids (the grammar allows them once it is complete)."""
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.eos_ids = np.asarray(sorted(eos_ids), dtype=np.int64)
        self.bitmask = np.full((1, (vocab_size + 31) // 32), -1, dtype=np.int32)  # (1, ceil(V/32)) bits
        self.refused = False          # inside assuming(): the assumed path left the grammar

    def allowed(self) -> np.ndarray:
        """(V,) bool: the tokens the grammar allows next."""
        if self.refused:
            allowed = np.zeros(self.vocab_size, bool)
            allowed[self.eos_ids] = True
            return allowed
        self.matcher.unsafe_compute_mask_ptr(self.bitmask.ctypes.data, self.bitmask.nbytes)
        self._check()
        bits = np.unpackbits(self.bitmask.view(np.uint8), bitorder="little")      # (32 * ceil(V/32),)
        return bits[:self.vocab_size].astype(bool)

    def apply(self, scores: np.ndarray) -> None:
        """scores: (V,) float64, in place: refused tokens get -inf."""
        scores[~self.allowed()] = -np.inf

    def advance(self, token: int) -> None:
        """An accepted token. The sampler never draws a refused one."""
        self.matcher.consume_token(int(token))
        self._check()

    def _check(self) -> None:
        """A matcher in its error state (a resource limit hit mid-reply, say) ends this
        request with a clear error; it is no reason to fail the engine."""
        if self.matcher.is_error():
            raise RequestError(f"constrained decoding stopped: {self.matcher.get_error()}", "response_format")

    @contextmanager
    def assuming(self, tokens: list[int]):
        """Scores computed inside see `tokens` as accepted; the matcher is rolled back on exit."""
        if not tokens:
            yield
            return
        valid = self.matcher.validate_tokens([int(t) for t in tokens])
        if valid:
            self.matcher.consume_tokens([int(t) for t in tokens[:valid]])
            self._check()
        self.refused = valid < len(tokens)
        try:
            yield
        finally:
            self.refused = False
            if valid:
                self.matcher.rollback(valid)

    @property
    def complete(self) -> bool:
        """The output so far is a whole sentence of the grammar."""
        return self.matcher.is_accepting()
