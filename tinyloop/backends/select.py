"""Backend choice (`TINYLOOP_DEVICE=auto|cpu|cuda`) and its activation dtype
(`TINYLOOP_ACTIVATIONS=fp32|fp16`, backends/base.py).

auto: the CUDA backend when CuPy is installed and sees a GPU, else the CPU. The chosen
backend's `description` says which and why; the server logs it at startup.

On the CPU, `TINYLOOP_CPU_KERNELS=numba` (the default) chooses the backend of our own
compiled kernels (backends/cpu/: row-invariant by construction, the weights kept packed);
`numpy`, the NumPy/OpenBLAS reference backend (backends/reference/).
"""
from __future__ import annotations

import os

from tinyloop.backends.base import Backend, check_activations
from tinyloop.errors import TinyLoopError

DEVICES = ("auto", "cpu", "cuda")
CPU_KERNELS = ("numpy", "numba")


def check_device(value: str) -> str:
    """A device name, lowercased; a TinyLoopError naming TINYLOOP_DEVICE when it is none of DEVICES."""
    device = value.lower()
    if device not in DEVICES:
        raise TinyLoopError(f"TINYLOOP_DEVICE must be one of {', '.join(DEVICES)}, got {value!r}")
    return device


def activations_from_env() -> str:
    return check_activations(os.environ.get("TINYLOOP_ACTIVATIONS") or "fp32")


def cpu_backend_class():
    """The CPU backend TINYLOOP_CPU_KERNELS names: numba (default) or numpy (the reference)."""
    kernels = (os.environ.get("TINYLOOP_CPU_KERNELS") or "numba").lower()
    if kernels not in CPU_KERNELS:
        raise TinyLoopError(f"TINYLOOP_CPU_KERNELS must be one of {', '.join(CPU_KERNELS)}, got {kernels!r}")
    if kernels == "numba":
        from tinyloop.backends.cpu import CpuBackend
    else:
        from tinyloop.backends.reference import NumpyBackend as CpuBackend
    return CpuBackend


def select_backend(device: str | None = None, activations: str | None = None) -> Backend:
    device = check_device(device or os.environ.get("TINYLOOP_DEVICE") or "auto")
    activations = check_activations(activations) if activations else activations_from_env()
    half = ", fp16 activations" if activations == "fp16" else ""
    CpuBackend = cpu_backend_class()
    if CpuBackend.__module__.startswith("tinyloop.backends.reference"):
        half += ", numpy reference kernels"
    if device == "cpu":
        return CpuBackend(description=f"cpu (TINYLOOP_DEVICE=cpu{half})", activations=activations)
    from tinyloop.backends.cuda.device import cuda_unavailable
    reason = cuda_unavailable()
    if reason is None:
        from tinyloop.backends.cuda.backend import CudaBackend
        from tinyloop.backends.cuda.device import CupyDevice
        backend = CudaBackend(CupyDevice(), activations=activations)
        why = "TINYLOOP_DEVICE=cuda" if device == "cuda" else "auto"
        backend.description = f"cuda ({why}: {backend.device.describe()}{half})"
        return backend
    if device == "cuda":
        raise TinyLoopError(f"TINYLOOP_DEVICE=cuda, but {reason}")
    return CpuBackend(description=f"cpu (auto: {reason}{half})", activations=activations)
