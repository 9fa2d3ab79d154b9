"""Where the kernel sources and the CUDA headers are, and how every compiler is told.

The same options serve CuPy's RawModule at run time (NVRTC), the compile check in CI
(scripts/cuda_compile_check.py: NVRTC through ctypes, and nvcc -Xptxas -v) and nothing
else: kernels include only "common.cuh" and <cuda_fp16.h>, so the include path is the
kernel directory and one directory holding cuda_fp16.h (a CUDA toolkit's, or the
`nvidia-cuda-runtime-cu12` / CUDA 13 wheel's that CuPy's `[ctk]` extra installs).
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
from pathlib import Path

KERNEL_DIR = Path(__file__).resolve().parents[3] / "cuda"
KERNEL_FILES = ("linear", "kv", "attention", "elementwise", "sampling")


def kernel_path(name: str) -> Path:
    return KERNEL_DIR / f"{name}.cu"


def _site_dirs() -> list[Path]:
    return [Path(p) for p in sys.path if p and Path(p, "nvidia").is_dir()]


def header_dirs() -> list[Path]:
    """Directories holding cuda_fp16.h, best first: CUDA_PATH / CUDA_HOME, pip wheels, /usr/local/cuda."""
    candidates = [Path(os.environ[v], "include") for v in ("CUDA_PATH", "CUDA_HOME") if os.environ.get(v)]
    for site in _site_dirs():
        candidates += [site / "nvidia" / "cuda_runtime" / "include"]                  # CUDA 12 wheels
        candidates += sorted((site / "nvidia").glob("cu1*/include"))                    # CUDA 13 wheels
    candidates += [Path("/usr/local/cuda/include")]
    return [d for d in candidates if (d / "cuda_fp16.h").is_file()]


def compile_options(with_headers: bool = True) -> tuple[str, ...]:
    """NVRTC needs the header directory named; nvcc (with_headers=False) has its own."""
    headers = header_dirs() if with_headers else []
    return ("-std=c++17", f"-I{KERNEL_DIR}") + ((f"-I{headers[0]}",) if headers else ())


# ----------------------------------------------------------------------------------- NVRTC by ctypes
def nvrtc_library() -> str | None:
    """A libnvrtc to load without CuPy (no driver needed to compile)."""
    patterns = []
    for site in _site_dirs():
        patterns += [str(site / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so*"),
                     str(site / "nvidia" / "cu1*" / "lib" / "libnvrtc.so*")]
    for root in [os.environ.get("CUDA_PATH"), os.environ.get("CUDA_HOME"), "/usr/local/cuda"]:
        if root:
            patterns += [f"{root}/lib64/libnvrtc.so*", f"{root}/lib/libnvrtc.so*"]
    for pattern in patterns:
        found = sorted(p for p in glob.glob(pattern) if "builtins" not in p and ".alt." not in p)
        if found:
            return found[0]
    return None


class NvrtcError(RuntimeError):
    pass


def nvrtc_compile(source_path: Path, arch: str, library: str) -> tuple[int, str, str]:
    """Compile one .cu for sm_<arch> -> (cubin size in bytes, the PTX ptxas was given, log).
    NvrtcError with the log on failure. (The compile check reads the PTX to see which
    instructions a guarded inline asm left in every entry.)"""
    def cubin_and_ptx(lib, program, check):
        size = ctypes.c_size_t()
        check(lib.nvrtcGetCUBINSize(program, ctypes.byref(size)), "cubin size")
        ptx_size = ctypes.c_size_t()
        check(lib.nvrtcGetPTXSize(program, ctypes.byref(ptx_size)), "PTX size")
        text = ctypes.create_string_buffer(ptx_size.value)
        check(lib.nvrtcGetPTX(program, text), "PTX")
        return size.value, text.value.decode()
    (size, ptx), log = _nvrtc(source_path, f"sm_{arch}", library, cubin_and_ptx)
    return size, ptx, log


def _nvrtc(source_path: Path, target: str, library: str, fetch) -> tuple:
    """Compile for -arch=target; -> (fetch(lib, program, check), log)."""
    lib = ctypes.CDLL(library)
    program = ctypes.c_void_p()
    source = Path(source_path).read_bytes()
    check = _checker(lib)
    check(lib.nvrtcCreateProgram(ctypes.byref(program), source, str(source_path).encode(), 0, None, None), "create")
    try:
        options = [*compile_options(), f"-arch={target}", "--device-as-default-execution-space"]
        array = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        status = lib.nvrtcCompileProgram(program, len(options), array)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(program, log)
        text = log.value.decode(errors="replace").strip()
        if status != 0:
            raise NvrtcError(f"{source_path.name} {target}: {_error_string(lib, status)}\n{text}")
        return fetch(lib, program, check), text
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


def _error_string(lib, status: int) -> str:
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib.nvrtcGetErrorString(status).decode()


def _checker(lib):
    def check(status, what):
        if status != 0:
            raise NvrtcError(f"nvrtc {what}: {_error_string(lib, status)}")
    return check
