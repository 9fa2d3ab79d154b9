"""The CPU backend: our own compiled kernels of the forward pass (kernels/, numba), behind the
Backend interface of backends/base.py (backend.py).

One arithmetic per row, whatever the path: prefill, decode, draft, verify, tree and batched
rows call the same kernels, and a row's bits depend only on its own inputs and its absolute
position, never on how many rows share the call, where its operands came from, which
thread computes it, or which CPU (instruction set) runs it:
- linear (linear.py, kernels/linear*.py): the weights as stored (packed codes, float32
  scales and mins, or float weights) re-laid into 16-output tiles; each output summed over
  its inputs in order; rows share the unpacked weights, never an accumulator;
- attention (attention.py, kernels/attention.py): one query over its own keys, read from
  the KV cache's storage in every mode, in 64-position blocks fixed by logical position,
  merged in order; masked keys contribute nothing; a tree node sees its path's keys;
- KV write (kvstore.py, kernels/kv.py), the int4-h rotation (kernels/rotation.py), norms,
  RoPE, activations, argmax and top-k (kernels/rows.py and what it calls): per row, fixed
  order.
Why it holds (kernels/__init__.py): every sum's order is written in our code; threads split
outputs or queries, never a sum; no fast-math (LLVM may neither reorder nor fuse into FMA,
so vector code performs the scalar code's operations in order); no libm (exp, tanh, and the
float64 exp, log, sin, cos of the RoPE table and the log-normalizer are our own). Each
kernel has a NumPy oracle (kernels/*_oracle.py) the tests compare bit for bit, and
scripts/logit_fingerprint.py writes the logits of every forward path, to compare compile
targets (NUMBA_CPU_NAME) and CPUs bit for bit.

The default CPU backend (TINYLOOP_CPU_KERNELS=numba, or unset; backends/select.py).
TINYLOOP_CPU_KERNELS=numpy chooses backends/reference/ (NumPy/OpenBLAS), kept as the
reference implementation the tests compare against; reference/twins/ holds the NumPy twins
of the CUDA kernels (cuda/*.cu).
"""
from tinyloop.backends.cpu.backend import CpuBackend
from tinyloop.backends.cpu.linear import PackedLinear

__all__ = ["CpuBackend", "PackedLinear"]
