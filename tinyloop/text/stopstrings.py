"""Stop strings matched on decoded text across token boundaries.

Text is fed in deltas as tokens decode. The matcher releases text as soon as it can
no longer be the start of a stop string, and holds back only a tail that could still
grow into one. When a stop string appears, the output ends right before it.
"""
from __future__ import annotations


class StopStringMatcher:
    def __init__(self, stops):
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self.pending = ""          # decoded but not yet released
        self.stopped = False

    def feed(self, delta: str) -> str:
        """Add decoded text; return what can be released now ('' once stopped)."""
        if self.stopped:
            return ""
        if not self.stops:
            return delta
        self.pending += delta
        cut = self._first_match()
        if cut is not None:
            self.stopped = True
            out, self.pending = self.pending[:cut], ""
            return out
        keep = self._holdback()
        out = self.pending[:len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep:]
        return out

    def flush(self) -> str:
        """Generation ended without a stop string: release what was held back."""
        out, self.pending = ("" if self.stopped else self.pending), ""
        return out

    def _first_match(self) -> int | None:
        found = [i for i in (self.pending.find(s) for s in self.stops) if i >= 0]
        return min(found) if found else None

    def _holdback(self) -> int:
        """Length of the longest tail of pending that is a proper prefix of a stop."""
        text = self.pending
        for length in range(min(len(text), self.longest - 1), 0, -1):
            tail = text[-length:]
            if any(stop.startswith(tail) for stop in self.stops):
                return length
        return 0
