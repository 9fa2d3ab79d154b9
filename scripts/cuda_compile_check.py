"""Compile every kernel source in cuda/ for sm_80 and sm_90, as the GPU will, and record
each kernel's registers, shared memory and spills.

    python scripts/cuda_compile_check.py                 # NVRTC and nvcc where found; table to stdout
    python scripts/cuda_compile_check.py --write         # also rewrite cuda/RESOURCES.md
    python scripts/cuda_compile_check.py --require nvrtc,nvcc    # CI: a missing compiler fails too
    python scripts/cuda_compile_check.py --jobs 1        # one compile at a time (default: one per CPU)

NVRTC (what CuPy's RawModule uses at run time) is loaded with ctypes from a CUDA toolkit
or the nvidia-cuda-nvrtc-cu12 wheel: it needs no GPU and no driver. nvcc -cubin -Xptxas -v
gives the resource figures. A compile error, a spill (any bytes of spill stores or
loads) or a stack frame fails the check (exit 1).

Two checks of programmatic dependent launch (tinyloop/backends/cuda/dependent_launch.py) ride
along: the PTX NVRTC writes for sm_90 (what its ptxas turns into the cubin) must hold
griddepcontrol.wait and .launch_dependents in every entry (ptxas refuses them below sm_90, so
the sm_80 compile checks their guard); and a C program compiled against the toolkit's cuda.h must
find the launch structures at the sizes and offsets the ctypes mirrors use.

Every (compiler, file, arch) compile is a job of its own, run in a pool of processes (so
compiles run side by side whatever NVRTC does inside one process: not measured). The
longest sources go first, so linear.cu's compiles do not start last and leave the other
workers idle. Output is printed as jobs finish; the table and RESOURCES.md keep the
sources' order, so they do not depend on which job finished first.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tinyloop.backends.cuda.compile import (KERNEL_DIR, NvrtcError, compile_options, header_dirs,  # noqa: E402
                                            nvrtc_compile, nvrtc_library)
from tinyloop.backends.cuda import dependent_launch  # noqa: E402

ARCHES = ("80", "90")
ENTRY = re.compile(r"Compiling entry function '(\w+)' for 'sm_(\d+)'")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(?:, used \d+ barriers)?(?:, (\d+) bytes smem)?")


def sources() -> list[Path]:
    return sorted(KERNEL_DIR.glob("*.cu"))


def ptxas_figures(source: Path, arch: str, nvcc: str) -> list[dict]:
    """nvcc -cubin -Xptxas -v -> one row per kernel: registers, static shared bytes, stack, spills."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [nvcc, f"-arch=sm_{arch}", "-cubin", "-Xptxas", "-v", *compile_options(with_headers=False),
                   "-o", str(Path(tmp) / "out.cubin"), str(source)]
        done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"nvcc failed on {source.name} sm_{arch}:\n{done.stderr}")
    rows, current = [], None
    for line in done.stderr.splitlines():
        if m := ENTRY.search(line):
            current = {"file": source.name, "kernel": m.group(1), "arch": m.group(2)}
            rows.append(current)
        elif current and (m := FRAME.search(line)):
            current.update(stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3)))
        elif current and (m := USED.search(line)):
            current.update(registers=int(m.group(1)), smem=int(m.group(2) or 0))
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| file | kernel | arch | registers | static smem (B) | stack (B) | spill stores / loads (B) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['file']} | `{r['kernel']}` | sm_{r['arch']} | {r.get('registers', '?')} | "
                     f"{r.get('smem', 0)} | {r.get('stack', 0)} | "
                     f"{r.get('spill_stores', 0)} / {r.get('spill_loads', 0)} |")
    return "\n".join(lines)


def entry_failures(source: Path, ptx: str) -> list[str]:
    """Every entry of the sm_90 PTX waits for the previous grid and releases the next. (Below
    sm_90 the guard in cuda/common.cuh leaves both out: ptxas refuses them there, so the sm_80
    compile would fail.)"""
    failures = []
    entries = re.findall(r"\.entry\s+(\w+)\((.*?)(?=\.entry|\Z)", ptx, re.S)
    if not entries:
        failures.append(f"{source.name} sm_90: no entry found in the PTX")
    for name, body in entries:
        for instruction in ("griddepcontrol.wait", "griddepcontrol.launch_dependents"):
            if instruction not in body:
                failures.append(f"{source.name} {name} sm_90: {instruction} missing")
    return failures


LAYOUT_PROGRAM = r"""
#include <stddef.h>
#include <stdio.h>
#include <cuda.h>
#define FIELD(T, f) printf("%s.%s %zu\n", #T, #f, offsetof(T, f))
int main(void) {
    printf("CUlaunchConfig %zu\nCUlaunchAttribute %zu\nCUlaunchAttributeValue %zu\n",
           sizeof(CUlaunchConfig), sizeof(CUlaunchAttribute), sizeof(CUlaunchAttributeValue));
    FIELD(CUlaunchConfig, gridDimX); FIELD(CUlaunchConfig, gridDimY); FIELD(CUlaunchConfig, gridDimZ);
    FIELD(CUlaunchConfig, blockDimX); FIELD(CUlaunchConfig, blockDimY); FIELD(CUlaunchConfig, blockDimZ);
    FIELD(CUlaunchConfig, sharedMemBytes); FIELD(CUlaunchConfig, hStream); FIELD(CUlaunchConfig, attrs);
    FIELD(CUlaunchConfig, numAttrs); FIELD(CUlaunchAttribute, id); FIELD(CUlaunchAttribute, value);
    FIELD(CUlaunchAttributeValue, programmaticStreamSerializationAllowed);
    printf("PROGRAMMATIC_STREAM_SERIALIZATION %d\n", (int)CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION);
    return 0;
}
"""


def launch_layout() -> dict[str, int]:
    """What the ctypes mirrors say, named as the C program prints it."""
    d = dependent_launch
    out = {"CUlaunchConfig": ctypes.sizeof(d.LaunchConfig), "CUlaunchAttribute": ctypes.sizeof(d.LaunchAttribute),
           "CUlaunchAttributeValue": ctypes.sizeof(d.LaunchAttributeValue),
           "CUlaunchAttribute.id": d.LaunchAttribute.id.offset,
           "CUlaunchAttribute.value": d.LaunchAttribute.value.offset,
           "CUlaunchAttributeValue.programmaticStreamSerializationAllowed":
               d.LaunchAttributeValue.programmatic_stream_serialization_allowed.offset,
           "PROGRAMMATIC_STREAM_SERIALIZATION": d.PROGRAMMATIC_STREAM_SERIALIZATION}
    for name, _type in d.LaunchConfig._fields_:
        out[f"CUlaunchConfig.{name}"] = getattr(d.LaunchConfig, name).offset
    return out


def layout_failures(required: bool) -> list[str]:
    """Compile LAYOUT_PROGRAM against the cuda.h beside cuda_fp16.h (a toolkit's, or the
    nvidia-cuda-runtime wheel's) and compare every figure with launch_layout()."""
    headers = [d for d in header_dirs() if (d / "cuda.h").is_file()]
    compiler = shutil.which("cc") or shutil.which("gcc")
    if not headers or compiler is None:
        message = f"launch layout: {'no cuda.h' if not headers else 'no C compiler'} to check against"
        if required:
            return [message]
        print(message)
        return []
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "layout.c").write_text(LAYOUT_PROGRAM)
        build = subprocess.run([compiler, f"-I{headers[0]}", "-o", f"{tmp}/layout", f"{tmp}/layout.c"],
                               capture_output=True, text=True)
        if build.returncode:
            return [f"launch layout: the C program did not compile: {build.stderr.strip()}"]
        printed = subprocess.run([f"{tmp}/layout"], capture_output=True, text=True, check=True).stdout
    header = {name: int(value) for name, value in (line.split() for line in printed.splitlines())}
    ours = launch_layout()
    wrong = [f"launch layout {k}: cuda.h {header.get(k)}, ctypes {ours.get(k)}"
             for k in sorted(set(header) | set(ours)) if header.get(k) != ours.get(k)]
    print(f"launch layout against {headers[0]}/cuda.h: " + ("ok" if not wrong else f"{len(wrong)} differ"))
    return wrong


def cost_rank(source: Path) -> int:
    """Bytes of the source and every local header it includes (once): a stand-in for how long it
    compiles, so the pool starts the longest jobs first."""
    seen, pending, total = set(), [source], 0
    while pending:
        path = pending.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        text = path.read_text()
        total += len(text)
        pending += [KERNEL_DIR / name for name in re.findall(r'#include\s+"([^"]+)"', text)]
    return total


def run_job(job: tuple) -> tuple:
    """One compile in a worker process -> (job, outcome, seconds). The outcome: NVRTC's (cubin size,
    log, the sm_90 PTX's entry failures or None below sm_90), nvcc's rows, or an exception's text
    prefixed with "FAIL " (text, so no failure is lost crossing the process boundary)."""
    kind, source, arch, tool = job
    start = time.perf_counter()
    try:
        if kind == "nvrtc":
            size, ptx, log = nvrtc_compile(source, arch, tool)
            outcome = (size, log, entry_failures(source, ptx) if arch == "90" else None)
        else:
            outcome = ptxas_figures(source, arch, tool)
    except (NvrtcError, RuntimeError, OSError) as error:
        outcome = f"FAIL {error}"
    return job, outcome, time.perf_counter() - start


def plan(library: str | None, nvcc: str | None) -> list[tuple]:
    """Every compile as (kind, source, arch, library or nvcc), the longest sources first."""
    jobs = []
    for source in sorted(sources(), key=cost_rank, reverse=True):
        if library is not None:
            jobs += [("nvrtc", source, arch, library) for arch in ARCHES]
        if nvcc is not None:
            jobs += [("nvcc", source, arch, nvcc) for arch in ARCHES]
    return jobs


def report(job: tuple, outcome, seconds: float, failures: list[str]) -> None:
    """Print one finished job's line; collect its failures."""
    kind, source, arch, _tool = job
    if isinstance(outcome, str) and outcome.startswith("FAIL "):
        failures.append(outcome[5:])
        print(f"{kind} {source.name} sm_{arch}: failed ({seconds:.0f} s)", flush=True)
    elif kind == "nvrtc":
        size, log, entries = outcome
        pdl = "" if entries is None else ("; programmatic dependent launch in every entry: "
                                          + ("ok" if not entries else f"{len(entries)} wrong"))
        print(f"nvrtc {source.name} sm_{arch}: ok, cubin {size} bytes{pdl} ({seconds:.0f} s)"
              + (f"\n{log}" if log else ""), flush=True)
        failures += entries or []
    else:
        print(f"nvcc {source.name} sm_{arch}: {len(outcome)} kernels ({seconds:.0f} s)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite cuda/RESOURCES.md from the nvcc figures")
    parser.add_argument("--require", default="", help="comma list of compilers that must be present: nvrtc,nvcc")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="compiles at once (default: one per CPU)")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    required = {r for r in args.require.split(",") if r}
    failures = []

    library = nvrtc_library()
    if library is None:
        (failures.append if "nvrtc" in required else print)("NVRTC not found (pip install nvidia-cuda-nvrtc-cu12 "
                                                            "nvidia-cuda-runtime-cu12)")
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        (failures.append if "nvcc" in required else print)("nvcc not found: no resource figures")

    jobs = plan(library, nvcc)
    outcomes = {}
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for future in as_completed([pool.submit(run_job, job) for job in jobs]):
            job, outcome, seconds = future.result()
            outcomes[job] = outcome
            report(job, outcome, seconds, failures)
    print(f"{len(jobs)} compiles, {args.jobs} at a time: {time.perf_counter() - started:.0f} s", flush=True)
    if library is not None:
        failures += layout_failures("nvrtc" in required)

    if nvcc is not None:
        rows = []
        for source in sources():        # the table in the sources' order, whatever finished first
            for arch in ARCHES:
                outcome = outcomes[("nvcc", source, arch, nvcc)]
                if isinstance(outcome, list):
                    rows += outcome
        print(table(rows))
        for r in rows:
            if r.get("spill_stores") or r.get("spill_loads") or r.get("stack"):
                failures.append(f"{r['file']} {r['kernel']} sm_{r['arch']}: stack {r.get('stack')} B, "
                                f"spills {r.get('spill_stores')} / {r.get('spill_loads')} B")
        if args.write:
            version = subprocess.run([nvcc, "--version"], capture_output=True,
                                     text=True).stdout.strip().splitlines()[-1]
            (KERNEL_DIR / "RESOURCES.md").write_text(
                "# Kernel resources (written by `python scripts/cuda_compile_check.py --write`)\n\n"
                f"`nvcc -cubin -Xptxas -v`, {version}. Static shared memory only: kernels that take\n"
                "dynamic shared memory say how much in their launcher (`tinyloop/backends/cuda/launch/`).\n\n"
                + table(rows) + "\n")
    for failure in failures:
        print("FAIL:", failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
