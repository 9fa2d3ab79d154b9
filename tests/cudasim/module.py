"""Launching compiled kernels from Python with CuPy's RawModule call shape:
`module.get_function(name)(grid, block, args, shared_mem=0)` on NumPy arrays."""

import ctypes
import os
import threading
from pathlib import Path

import numpy as np

from .build import build

ORDERS = ("id", "reverse", "random:SEED")
_ORDER_KINDS = {"id": 0, "reverse": 1}
# One launch at a time in the process: the fault handlers a launch installs are process-wide.
_LAUNCH_LOCK = threading.Lock()
_LIBRARIES = {}  # shared library path -> ctypes.CDLL
DEFAULT_MAX_DYNAMIC_SHARED = 48 * 1024  # the GPU's limit until a kernel opts in to more
DEFAULT_TIMEOUT_SECONDS = 60  # a launch running longer fails (CUDASIM_TIMEOUT overrides; 0: never)


class KernelError(RuntimeError):
    """A launch failed: assert, trap, fault, deadlock, divergent barrier, bad warp call."""


class LaunchConfig(ctypes.Structure):  # mirrors cudasim::LaunchConfig (include/cudasim/launch.h)
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shared_mem", ctypes.c_ulonglong),
                ("order", ctypes.c_int), ("timeout_seconds", ctypes.c_int), ("seed", ctypes.c_ulonglong)]


def parse_order(order: str) -> tuple:
    if order in _ORDER_KINDS:
        return _ORDER_KINDS[order], 0
    if order.startswith("random:") and order[7:].isdigit():
        return 2, int(order[7:])
    raise ValueError(f"thread order must be one of {', '.join(ORDERS)} (SEED a non-negative integer), "
                     f"got {order!r}")


def _dims(what: str, value, limits: tuple) -> tuple:
    dims = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool)
                                          for d in dims):
        raise TypeError(f"{what} must be an int or a tuple of 1 to 3 ints, got {value!r}")
    dims = tuple(int(d) for d in dims) + (1,) * (3 - len(dims))
    for axis, (d, limit) in enumerate(zip(dims, limits)):
        if not 1 <= d <= limit:
            raise ValueError(f"{what}[{axis}] must be in [1, {limit}], got {d}")
    return dims


def _describe(value) -> str:
    if isinstance(value, np.ndarray):
        return f"a {value.dtype} array of shape {value.shape}"
    if isinstance(value, np.generic):
        return f"np.{value.dtype}"
    return f"a Python {type(value).__name__}"


class Function:
    """One kernel of a loaded module, called like cupy.RawKernel / RawModule functions."""

    def __init__(self, module, name: str, library: ctypes.CDLL, decl):
        self.name = name
        self._module = module
        self._launch = getattr(library, f"cudasim_launch_{name}")
        self._launch.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p]
        self._launch.restype = ctypes.c_int
        self._error = library.cudasim_error
        self._error.restype = ctypes.c_char_p
        codes_fn = getattr(library, f"cudasim_params_{name}")
        codes_fn.restype = ctypes.c_char_p
        codes = codes_fn().decode()
        params = list(decl.params)
        if len(params) != len(codes):  # the source parse disagreed with the compiler: trust g++
            params = [None] * len(codes)
        self.params = [(p.name if p else f"arg{i}", p.declaration if p else code, None if code == "p" else
                        np.dtype(code)) for i, (p, code) in enumerate(zip(params, codes))]
        # CuPy's attribute; launches asking for more dynamic shared memory fail, as on the GPU.
        self.max_dynamic_shared_size_bytes = DEFAULT_MAX_DYNAMIC_SHARED

    def _pack(self, args) -> tuple:
        """Argument slots (8 bytes each: a pointer or a scalar's bytes) and pointers to them."""
        if not isinstance(args, (tuple, list)):
            raise TypeError(f"{self.name}: args must be a tuple, got {_describe(args)}")
        if len(args) != len(self.params):
            names = ", ".join(name for name, _, _ in self.params)
            raise TypeError(f"{self.name} takes {len(self.params)} arguments ({names}), got {len(args)}")
        slots = (ctypes.c_uint64 * max(1, len(args)))()
        for i, ((name, declaration, dtype), value) in enumerate(zip(self.params, args)):
            where = f"{self.name}: argument {i} '{name}' ({declaration})"
            if dtype is None:
                if not isinstance(value, np.ndarray):
                    raise TypeError(f"{where} needs a NumPy array, got {_describe(value)}")
                slots[i] = value.__array_interface__["data"][0]  # its first element, as CuPy passes
            else:
                if not isinstance(value, np.generic) or value.dtype != dtype:
                    raise TypeError(f"{where} needs a np.{dtype} scalar, got {_describe(value)}")
                slots[i] = int.from_bytes(value.tobytes().ljust(8, b"\0"), "little")
        base = ctypes.addressof(slots)
        pointers = (ctypes.c_void_p * max(1, len(args)))(*[base + 8 * i for i in range(len(args))])
        return slots, pointers

    def __call__(self, grid, block, args, shared_mem=0, stream=None):
        grid = _dims("grid", grid, (2**31 - 1, 65535, 65535))
        block = _dims("block", block, (1024, 1024, 64))
        if block[0] * block[1] * block[2] > 1024:
            raise ValueError(f"a block has at most 1024 threads, got {block}")
        if not 0 <= int(shared_mem) <= self.max_dynamic_shared_size_bytes:
            raise ValueError(f"shared_mem must be in [0, {self.max_dynamic_shared_size_bytes}] (raise "
                             f"max_dynamic_shared_size_bytes as on CuPy, up to 227 KiB), got {shared_mem}")
        _slots, pointers = self._pack(args)  # the slots back the pointers: alive until we return
        kind, seed = self._module.order_kind
        timeout = int(os.environ.get("CUDASIM_TIMEOUT", DEFAULT_TIMEOUT_SECONDS))
        config = LaunchConfig((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block), int(shared_mem), kind,
                              timeout, seed)
        with _LAUNCH_LOCK:
            failed = self._launch(ctypes.byref(config), pointers)
            message = self._error().decode(errors="replace") if failed else ""
        if failed:
            raise KernelError(f"{self.name}<<<{grid}, {block}>>> ({self._module.order} order) failed: {message}")


class Module:
    """A compiled .cu file run in one thread order; get_function as on cupy.RawModule."""

    def __init__(self, path, order: str = "id", options=()):
        self.path = Path(path)
        self.order = order
        self.order_kind = parse_order(order)
        library_path, kernels = build(self.path, options)
        if library_path not in _LIBRARIES:
            _LIBRARIES[library_path] = ctypes.CDLL(str(library_path))
        self._library = _LIBRARIES[library_path]
        self._decls = {k.name: k for k in kernels}
        self._functions = {}

    @property
    def kernel_names(self) -> list:
        return list(self._decls)

    def get_function(self, name: str) -> Function:
        if name not in self._functions:
            if name not in self._decls:
                raise LookupError(f"no kernel {name!r} in {self.path} (kernels: {', '.join(self._decls) or 'none'})")
            self._functions[name] = Function(self, name, self._library, self._decls[name])
        return self._functions[name]


def load_module(path, order: str = "id", options=()) -> Module:
    """Compiles (or reuses from the cache) the .cu file at `path` for the CPU."""
    return Module(path, order, tuple(options))
