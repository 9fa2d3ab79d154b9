"""Progress lines on stderr: redrawn in place on a terminal, every ~10% otherwise."""
from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, total: int, enabled: bool = True, unit: str = ""):
        self.label, self.total, self.unit = label, max(total, 1), unit
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.start = time.perf_counter()
        self._last_decile = -1

    def update(self, done: int, detail: str = "") -> None:
        if not self.enabled:
            return
        fraction = done / self.total
        if self.tty:
            print(f"\r{self.label}: {done}/{self.total}{self.unit} ({fraction:.0%}) {detail:<40}", end="",
                  file=sys.stderr, flush=True)
        elif int(fraction * 10) > self._last_decile:
            self._last_decile = int(fraction * 10)
            print(f"{self.label}: {done}/{self.total}{self.unit} ({fraction:.0%})", file=sys.stderr, flush=True)

    def finish(self, message: str) -> None:
        if self.enabled:
            elapsed = time.perf_counter() - self.start
            print(("\r" if self.tty else "") + f"{message} ({elapsed:.1f}s)" + (" " * 40 if self.tty else ""),
                  file=sys.stderr, flush=True)
