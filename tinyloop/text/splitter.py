"""Splitting a reply's text stream at a marker, releasing what is safe as it comes.

A streamed reply must not show a piece of text that later turns out to be the start of a
marker (a thinking section's closing tag, a tool call's opening line): the longest tail
that could still grow into the marker is held back, everything before it is released.
Used for thinking (`reasoning | content` at the closing tag) and tool calls
(`content | calls` at the first call's opening line).
"""
from __future__ import annotations


class MarkerSplitter:
    def __init__(self, marker: str, at_start: str | None = None):
        """marker: the text that ends the first part (not part of either part);
        at_start: the spelling it has when it opens the reply (e.g. without its leading newline)."""
        self.marker = marker
        self.at_start = at_start if at_start is not None else marker
        self.pending = ""               # held back: might be the marker's beginning
        self.released_any = False
        self.second: str | None = None  # once the marker is seen: the text after it

    @property
    def split(self) -> bool:
        return self.second is not None

    def feed(self, text: str) -> tuple[str, str]:
        """(first-part text to release now, second-part text to release now)."""
        if self.second is not None:
            self.second += text
            return "", text
        self.pending += text
        if not self.released_any:
            if self.pending.startswith(self.at_start):
                self.second = self.pending[len(self.at_start):]
                self.pending = ""
                return "", self.second
            if self.at_start.startswith(self.pending):
                return "", ""
        index = self.pending.find(self.marker)
        if index >= 0:
            first, self.second = self.pending[:index], self.pending[index + len(self.marker):]
            self.pending = ""
            self._released(first)
            return first, self.second
        keep = _held_tail(self.pending, self.marker)
        first = self.pending[:len(self.pending) - keep]
        self.pending = self.pending[len(self.pending) - keep:]
        self._released(first)
        return first, ""

    def finish(self) -> str:
        """The end of the reply: the held-back tail belongs to the first part after all."""
        tail, self.pending = self.pending, ""
        return tail if self.second is None else ""

    def _released(self, text: str) -> None:
        self.released_any = self.released_any or bool(text)


def _held_tail(text: str, marker: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of marker."""
    for length in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-length:]):
            return length
    return 0


def split_all(text: str, marker: str, at_start: str | None = None) -> tuple[str, str | None]:
    """A whole reply -> (first part, second part or None when the marker never came)."""
    splitter = MarkerSplitter(marker, at_start)
    first, second = splitter.feed(text)
    first += splitter.finish()
    return first, (splitter.second if splitter.split else None)
