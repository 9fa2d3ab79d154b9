"""Argument types for the command line: a value outside its range is argparse's one-line
error (exit 2) before anything runs, never a traceback or a silently used default."""
from __future__ import annotations

import argparse
import math


def _checked(parse, allowed, expected: str):
    def check(text: str):
        try:
            value = parse(text)
        except ValueError:
            value = None
        if value is None or not math.isfinite(value) or not allowed(value):
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    return check


positive_int = _checked(int, lambda n: n >= 1, "a whole number >= 1")
non_negative_int = _checked(int, lambda n: n >= 0, "a whole number >= 0")
positive_float = _checked(float, lambda x: x > 0, "a number > 0")
non_negative_seconds = _checked(float, lambda x: x >= 0, "a number of seconds >= 0")
port_number = _checked(int, lambda n: 1 <= n <= 65535, "a TCP port, 1-65535")
