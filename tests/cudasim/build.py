"""Compile a .cu file with g++ into a cached shared library the harness can launch.

The source is first preprocessed to find its kernels and `extern __shared__` arrays after
macro expansion. The generated translation unit is then: the shim prelude
(cuda_runtime.h), the kernel source included unchanged, the storage the `extern
__shared__` arrays alias, and per kernel two exported C functions (launch, parameter
codes). The runtime (runtime/*.cpp) is compiled once per harness version into objects
every kernel library links in.
"""

import contextlib
import hashlib
import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
INCLUDE_DIR = HERE / "include"
RUNTIME_DIR = HERE / "runtime"
CXX = os.environ.get("CUDASIM_CXX", "g++")
# -ffp-contract=off: a*b+c stays two roundings, as the kernels' explicit __fmul_rn/__fadd_rn
# promise; -mf16c: one-instruction half conversions; -fstack-clash-protection: a big
# kernel frame probes the fiber's guard page instead of jumping over it.
FLAGS = ["-O2", "-std=c++17", "-fno-strict-aliasing", "-ffp-contract=off", "-fvisibility=hidden", "-mf16c",
         "-fPIC", "-fno-math-errno", "-fstack-clash-protection", "-w"]
# Bytes of the region every `extern __shared__` array aliases: the GPU's largest opt-in size.
DYNAMIC_SHARED_CAPACITY = 227 * 1024
# NVRTC options that have no meaning for g++ and are dropped.
_IGNORED_OPTIONS = ("-arch", "--gpu-architecture", "-lineinfo", "--generate-line-info", "-G", "--device-debug",
                    "--use_fast_math", "-use_fast_math", "-rdc", "--relocatable-device-code")

_TYPE_WORDS = {"const", "volatile", "__restrict__", "__restrict", "restrict", "unsigned", "signed", "int", "char",
               "short", "long", "float", "double", "bool", "void", "__half", "half", "__half2", "__grid_constant__"}


class CompileError(RuntimeError):
    """g++ rejected the kernel source (the message carries its diagnostics)."""


@dataclass(frozen=True)
class Param:
    name: str
    declaration: str  # the parameter as written, for error messages


@dataclass(frozen=True)
class KernelDecl:
    name: str
    params: tuple


def _blank_comments(source: str) -> str:
    """Comments become spaces (line numbers kept); string literals stay."""
    pattern = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.DOTALL)
    return pattern.sub(lambda m: m.group(0) if m.group(0)[0] in "\"'" else re.sub(r"[^\n]", " ", m.group(0)),
                       source)


def _split_top_level(text: str) -> list:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _param(text: str, index: int) -> Param:
    text = " ".join(text.split("=")[0].split())
    words = [w for w in re.findall(r"[A-Za-z_]\w*", text) if w not in ("const", "volatile", "__restrict__")]
    named = len(words) >= 2 and words[-1] not in _TYPE_WORDS and not text.rstrip().endswith(("*", "&"))
    return Param(words[-1] if named else f"arg{index}", text)


def parse_kernels(source: str) -> list:
    """The `__global__` functions of a source: names and parameters (template kernels skipped)."""
    code = _blank_comments(source)
    code = re.sub(r"__launch_bounds__\s*\((?:[^()]|\([^()]*\))*\)", " ", code)
    kernels = {}
    for match in re.finditer(r"\b__global__\s+((?:\w+\s+|\*\s*)*?)(\w+)\s*\(", code):
        before = code[:match.start()]
        statement_start = max(before.rfind(c) for c in ";{}")
        if re.search(r"\btemplate\b", before[statement_start + 1:]):
            continue
        depth, i = 1, match.end()
        while depth and i < len(code):
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            i += 1
        inside = code[match.end():i - 1].strip()
        texts = [] if inside in ("", "void") else _split_top_level(inside)
        name = match.group(2)
        kernels.setdefault(name, KernelDecl(name, tuple(_param(t, k) for k, t in enumerate(texts))))
    return list(kernels.values())


def parse_dynamic_shared(source: str) -> list:
    """Names of the `extern __shared__ T name[];` arrays."""
    pattern = r"\bextern\s+__shared__\b[^;{}]*?\b(\w+)\s*\[\s*\]\s*;"
    return sorted(set(re.findall(pattern, _blank_comments(source))))


def _dynamic_shared_storage(names: list) -> list:
    """One TLS region of DYNAMIC_SHARED_CAPACITY bytes, and every `extern __shared__` name as
    an alias of it: CUDA starts all of a kernel's dynamic shared arrays at one address, and
    defining them in assembly needs no knowledge of their element types."""
    lines = ["asm(R\"(",
             '    .pushsection .tbss,"awT",@nobits',
             "    .balign 256"]
    for name in ["cudasim_dynamic_shared", *names]:
        lines += [f"    .globl {name}", f"    .hidden {name}", f"    .type {name}, @object",
                  f"    .size {name}, {DYNAMIC_SHARED_CAPACITY}"]
    lines += ["cudasim_dynamic_shared:", f"    .zero {DYNAMIC_SHARED_CAPACITY}"]
    lines += [f"    .set {name}, cudasim_dynamic_shared" for name in names]
    lines += ["    .popsection", ")\");", "extern thread_local unsigned char cudasim_dynamic_shared[];"]
    return lines


def generate_unit(path: Path, kernels: list, dynamic: list) -> str:
    """The C++ translation unit that wraps `path` for the harness."""
    lines = ["// Generated by tests/cudasim/build.py; do not edit.",
             '#include "cuda_runtime.h"',
             f'#include "{path}"',
             '#include "cudasim/launch.h"']
    if dynamic:
        lines += _dynamic_shared_storage(dynamic)
    region, capacity = ("cudasim_dynamic_shared", DYNAMIC_SHARED_CAPACITY) if dynamic else ("nullptr", 0)
    for k in kernels:
        lines += [
            f"static void cudasim_body_{k.name}(void** args) {{ cudasim::invoke(&{k.name}, args); }}",
            f"CUDASIM_EXPORT int cudasim_launch_{k.name}(const cudasim::LaunchConfig* config, void** args) {{",
            f"    return cudasim::launch(config, cudasim_body_{k.name}, args, {region}, {capacity});",
            "}",
            f"CUDASIM_EXPORT const char* cudasim_params_{k.name}() {{ return cudasim::param_codes(&{k.name}); }}",
        ]
    return "\n".join(lines) + "\n"


def check_options(options) -> list:
    """g++ equivalents of NVRTC-style options: -D/-U/-I/-std pass, GPU-only ones drop."""
    kept = []
    for option in options:
        if option.startswith(("-D", "-U", "-I", "-std=")):
            kept.append(option)
        elif not option.startswith(_IGNORED_OPTIONS):
            raise ValueError(f"option {option!r} is not supported by the CPU harness (allowed: -D, -U, -I, "
                             f"-std=, and the GPU-only {', '.join(_IGNORED_OPTIONS)} which are ignored)")
    return kept


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME")
    path = Path(root) / "tinyloop-cudasim" if root else Path(tempfile.gettempdir()) / f"cudasim-{os.getuid()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def prune_cache(max_age_days: float = 7.0) -> None:
    """Forgets kernel libraries nobody has loaded for a week (old sources, old harness versions)."""
    cutoff = time.time() - max_age_days * 86400
    for file in cache_dir().glob("*-*.*"):
        with contextlib.suppress(OSError):
            if file.is_file() and file.stat().st_atime < cutoff and file.stat().st_mtime < cutoff:
                file.unlink()


_harness_digest = None


def harness_digest() -> str:
    """Changes whenever the shim headers, the runtime, this builder or the compiler change."""
    global _harness_digest
    if _harness_digest is None:
        version = subprocess.run([CXX, "--version"], capture_output=True, text=True, check=True).stdout
        h = hashlib.sha256(version.encode())
        h.update(" ".join(FLAGS).encode())
        for file in sorted([*INCLUDE_DIR.rglob("*"), *RUNTIME_DIR.rglob("*"), Path(__file__).resolve()]):
            if file.is_file():
                h.update(str(file.relative_to(HERE)).encode() + b"\0" + file.read_bytes())
        _harness_digest = h.hexdigest()[:20]
    return _harness_digest


def _run(command: list, what: str) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise CompileError(f"{what} failed:\n{' '.join(command)}\n{result.stderr[-8000:]}")


def runtime_objects() -> list:
    """The runtime compiled once per harness version (in parallel, one g++ per file)."""
    out_dir = cache_dir() / f"runtime-{harness_digest()}"
    sources = sorted(RUNTIME_DIR.glob("*.cpp"))
    objects = [out_dir / (s.stem + ".o") for s in sources]
    if all(o.exists() for o in objects):
        return objects
    out_dir.mkdir(exist_ok=True)
    jobs = []
    for source, obj in zip(sources, objects):
        tmp = obj.with_suffix(f".{os.getpid()}.tmp.o")
        command = [CXX, *FLAGS, "-I", str(INCLUDE_DIR), "-c", str(source), "-o", str(tmp)]
        jobs.append((subprocess.Popen(command, stderr=subprocess.PIPE, text=True), command, tmp, obj))
    for process, command, tmp, obj in jobs:
        _, stderr = process.communicate()
        if process.returncode != 0:
            raise CompileError(f"building the cudasim runtime failed:\n{' '.join(command)}\n{stderr[-8000:]}")
        os.replace(tmp, obj)
    return objects


def scan(path: Path, options: list) -> tuple:
    """Kernels and dynamic shared arrays of the preprocessed source (so kernels whose
    parameter lists come from macros are understood too)."""
    command = [CXX, "-E", "-P", "-x", "c++", "-std=c++17", "-DCUDASIM_SCAN", "-I", str(INCLUDE_DIR), "-I",
               str(path.parent), *options, "-include", "cuda_runtime.h", str(path)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise CompileError(f"preprocessing {path.name} failed:\n{' '.join(command)}\n{result.stderr[-8000:]}")
    return parse_kernels(result.stdout), parse_dynamic_shared(result.stdout)


def build(path: Path, options=()) -> tuple:
    """Compiles `path` (cached by its text, its directory's headers, the options and the
    harness version); returns (shared library path, kernel declarations)."""
    path = Path(path).resolve()
    options = check_options(options)
    h = hashlib.sha256(harness_digest().encode())
    for file in sorted([path, *path.parent.glob("*.cuh"), *path.parent.glob("*.h")]):
        h.update(str(file).encode() + b"\0" + file.read_bytes())
    h.update("\0".join(options).encode())
    base = cache_dir() / f"{path.stem}-{h.hexdigest()[:20]}"
    library, listing = base.with_suffix(".so"), base.with_suffix(".json")
    if not (library.exists() and listing.exists()):
        prune_cache()
        kernels, dynamic = scan(path, options)
        # Per-process temporary names: concurrent test processes may build the same key.
        unit = base.with_suffix(f".{os.getpid()}.cpp")
        unit.write_text(generate_unit(path, kernels, dynamic))
        tmp = base.with_suffix(f".{os.getpid()}.tmp.so")
        command = [CXX, *FLAGS, "-shared", "-I", str(INCLUDE_DIR), "-I", str(path.parent), *options, str(unit),
                   *map(str, runtime_objects()), "-o", str(tmp), "-Wl,-z,defs"]
        _run(command, f"compiling {path.name} for the CPU harness")
        tmp_listing = listing.with_suffix(f".{os.getpid()}.tmp")
        tmp_listing.write_text(json.dumps([[k.name, [[p.name, p.declaration] for p in k.params]] for k in kernels]))
        os.replace(tmp, library)
        os.replace(tmp_listing, listing)
        os.replace(unit, base.with_suffix(".cpp"))  # kept next to the library, for debugging
    kernels = [KernelDecl(name, tuple(Param(*p) for p in params)) for name, params in json.loads(listing.read_text())]
    return library, kernels
