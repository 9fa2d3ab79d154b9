"""Backend choice: the array module the model runs on (`TINYLOOP_DEVICE=auto|cpu|cuda`)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from tinyloop.errors import TinyLoopError

DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class Backend:
    name: str      # "cpu" or "cuda"
    xp: object     # numpy or cupy

    def to_host(self, array) -> np.ndarray:
        return array if self.xp is np else self.xp.asnumpy(array)


def select_backend(device: str | None = None) -> Backend:
    device = (device or os.environ.get("TINYLOOP_DEVICE") or "auto").lower()
    if device not in DEVICES:
        raise TinyLoopError(f"TINYLOOP_DEVICE must be one of {', '.join(DEVICES)}, got {device!r}")
    if device == "cuda":
        # The CUDA kernels are not part of this release: say so instead of half-working.
        raise TinyLoopError("the CUDA backend is not available in this build of TinyLoop; "
                            "use TINYLOOP_DEVICE=cpu")
    return Backend("cpu", np)          # "auto" is the CPU until the CUDA backend exists
