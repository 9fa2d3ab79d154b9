"""Backend choice (`TINYLOOP_DEVICE=auto|cpu|cuda`)."""
from __future__ import annotations

import os

from tinyloop.backends.base import Backend
from tinyloop.errors import TinyLoopError

DEVICES = ("auto", "cpu", "cuda")


def select_backend(device: str | None = None) -> Backend:
    device = (device or os.environ.get("TINYLOOP_DEVICE") or "auto").lower()
    if device not in DEVICES:
        raise TinyLoopError(f"TINYLOOP_DEVICE must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cuda":
        # The CUDA kernels are not part of this release: say so instead of half-working.
        raise TinyLoopError("the CUDA backend is not available in this build of TinyLoop; "
                            "use TINYLOOP_DEVICE=cpu")
    from tinyloop.backends.cpu import CpuBackend
    return CpuBackend()          # "auto" is the CPU until the CUDA backend exists
