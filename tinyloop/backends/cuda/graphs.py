"""A decode step captured once as a CUDA graph and replayed per token.

A decode step launches a few hundred small kernels (34 layer instances x ~10 for
doc-407m at 8 loops): from Python each launch costs microseconds of host time, more
than the kernel itself takes on an H200. A CUDA graph records the whole step once and
replays it with one launch. What a replay may change lives in device buffers that the
step reads (StepInputs: the token, its position, its physical cache row); everything
else the step allocates comes from one arena kept with the graph (so the addresses the
graph recorded stay valid), and the kernels find blocks, masks and RoPE rows from the
position on the device. Nothing in the step may copy from the host, synchronise or
call cuBLAS: the CUDA backend's kernels are all our own.

Life cycle per request (one cache, one loop count): the first step runs as usual
(compiling and loading every kernel), the second is captured, and every later one is
a replay. TINYLOOP_CUDA_GRAPHS=0 turns capture off.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np


def graphs_enabled() -> bool:
    return os.environ.get("TINYLOOP_CUDA_GRAPHS", "1") not in ("0", "false", "no")


@dataclass
class StepInputs:
    """The per-step values of a one-token forward: one (3,) int32 device array, uploaded in
    one copy per token, and a (1,) view of it per value."""
    values: object
    tokens: object
    positions: object
    rows: object

    @classmethod
    def allocate(cls, xp):
        values = xp.zeros(3, np.int32)
        return cls(values, values[0:1], values[1:2], values[2:3])


class DecodeGraph:
    """model.forward([token], [position], cache, loops) for one request, as a replayed graph."""

    def __init__(self, backend, model, cache, loops: int):
        xp = backend.xp
        self.backend, self.model, self.cache, self.loops = backend, model, cache, loops
        self.inputs = StepInputs.allocate(xp)
        self.steps = 0
        self.replay = None
        self.logits = None                   # (1, V): where every replay leaves its logits

    def __call__(self, token: int, position: int):
        self.steps += 1
        if self.steps == 1:                  # warm-up: compile and load every kernel, set attributes
            return self.model.forward([token], [position], self.cache, self.loops)
        row = int(self.cache.geometry.physical(position))
        self.backend.device.upload_ints(self.inputs.values, [token, position, row])
        with self.backend.static_inputs(self.inputs):
            if self.replay is None:
                # the closure's token and position are frozen, as in a recorded graph: only
                # the host-side checks see them; the kernels read self.inputs
                self.replay, self.logits = self.backend.device.capture(
                    lambda: self.model.forward([token], [position], self.cache, self.loops))
            else:
                self.replay()
        return self.logits
