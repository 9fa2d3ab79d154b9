"""cudasim: run the project's CUDA kernel sources unchanged on the CPU (see README.md).

    from cudasim import load_module
    mod = load_module("cuda/linear.cu", order="reverse")
    mod.get_function("linear_rows_int4")((rows, 1, 1), (32, 1, 1), (out, x, np.int32(n)))
"""

from .build import CompileError
from .guarded import guarded_copy, guarded_empty, guarded_zeros
from .module import ORDERS, Function, KernelError, Module, load_module, parse_order

__all__ = [
           "ORDERS",
           "CompileError",
           "Function",
           "KernelError",
           "Module",
           "guarded_copy",
           "guarded_empty",
           "guarded_zeros",
           "load_module",
           "parse_order",
]
