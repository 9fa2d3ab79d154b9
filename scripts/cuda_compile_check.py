"""Compile every kernel source in cuda/ for sm_80 and sm_90, as the GPU will, and record
each kernel's registers, shared memory and spills.

    python scripts/cuda_compile_check.py                 # NVRTC and nvcc where found; table to stdout
    python scripts/cuda_compile_check.py --write         # also rewrite cuda/RESOURCES.md
    python scripts/cuda_compile_check.py --require nvrtc,nvcc    # CI: a missing compiler fails too

NVRTC (what CuPy's RawModule uses at run time) is loaded with ctypes from a CUDA toolkit
or the nvidia-cuda-nvrtc-cu12 wheel: it needs no GPU and no driver. nvcc -cubin -Xptxas -v
gives the resource figures. A compile error, a spill (any bytes of spill stores or
loads) or a stack frame fails the check (exit 1).
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tinyloop.backends.cuda.compile import KERNEL_DIR, NvrtcError, compile_options, nvrtc_compile, nvrtc_library  # noqa: E402

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite cuda/RESOURCES.md from the nvcc figures")
    parser.add_argument("--require", default="", help="comma list of compilers that must be present: nvrtc,nvcc")
    args = parser.parse_args()
    required = {r for r in args.require.split(",") if r}
    failures = []

    library = nvrtc_library()
    if library is None:
        (failures.append if "nvrtc" in required else print)("NVRTC not found (pip install nvidia-cuda-nvrtc-cu12 "
                                                            "nvidia-cuda-runtime-cu12)")
    else:
        for source in sources():
            for arch in ARCHES:
                try:
                    size, log = nvrtc_compile(source, arch, library)
                    print(f"nvrtc {source.name} sm_{arch}: ok, cubin {size} bytes" + (f"\n{log}" if log else ""))
                except NvrtcError as error:
                    failures.append(str(error))

    nvcc = shutil.which("nvcc")
    rows = []
    if nvcc is None:
        (failures.append if "nvcc" in required else print)("nvcc not found: no resource figures")
    else:
        for source in sources():
            for arch in ARCHES:
                try:
                    rows += ptxas_figures(source, arch, nvcc)
                except RuntimeError as error:
                    failures.append(str(error))
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
