"""The loops of each kernel's machine code (SASS), for the paper model in scripts/cuda_estimates.py.

    python scripts/sass_loops.py [--arch 90] [--kernel linear_rows_int4] [--write]

Compiles cuda/*.cu with nvcc (-lineinfo, and -DTL_MODEL_COMMON_PATH: the launch flags that
pick a rare path, such as an act-order permutation, fixed to the common case, so the counts
are those of the path a GGUF or RTN model runs) to a cubin for sm_ARCH, disassembles it with
nvdisasm -g (found on PATH, in $NVDISASM, or in an installed Triton package, which ships
one), and for each source line tagged `// sass: NAME` (the line of a load in a kernel's
hot loop carries one) takes the smallest loop around its instructions (a backward branch
closes a loop), so the estimates pick the loop they model by name. Per iteration of one
warp:
- instructions issued (every SASS instruction of the body, an inner loop's once);
- global loads and their bytes per lane (LDG width: .U8/.S8 1, .U16/.S16 2, none 4,
  .64 8, .128 16), and asynchronous copies (LDGSTS, cp.async) with theirs;
- rounds: dependent memory round trips. In-order issue means a warp stalls at the first
  instruction that reads a register a pending load writes; the loads issued before that
  stall travel together. A round is a run of global loads that ends at the first use of
  any of their results (or at a load whose address comes from one of them). Copies
  into shared memory (LDGSTS) never stall the warp: they end a round only at a wait.
- float operations (FFMA, FADD, FMUL) and shared-memory loads and stores;
- by_tag: the instructions that come from each tagged line. The counts are static: both arms
  of a branch that remains (a tile's edge, a masked row) count, so `instructions` bounds
  what an iteration issues from above.
--write saves the figures to cuda/SASS.md, which scripts/cuda_estimates.py reads (so the
estimates can be regenerated on a machine without nvdisasm, as RESOURCES.md is for ptxas).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tinyloop.backends.cuda.compile import compile_options  # noqa: E402

SECTION = re.compile(r"^\.text\.(\w+):")
LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
LABEL = re.compile(r"^(\.L_x_\d+):")
TARGET = re.compile(r"`\((\.L_x_\d+)\)")
TAG = re.compile(r"//\s*sass:\s*([\w-]+)")
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)\s*([^;]*);")
OFFSET = re.compile(r"0x([0-9a-f]+)")
REGISTER = re.compile(r"\bR(\d+)\b")
LOAD_BYTES = {"U8": 1, "S8": 1, "U16": 2, "S16": 2, "64": 8, "128": 16}


@dataclass
class Loop:
    start: int                      # byte offsets of the body's first instruction and its branch
    end: int
    tags: list = field(default_factory=list)       # the `// sass:` names of its source lines
    instructions: int = 0
    global_loads: int = 0
    load_bytes_per_lane: int = 0    # per iteration, LDG
    async_bytes_per_lane: int = 0   # per iteration, LDGSTS
    rounds: int = 0
    float_ops: int = 0
    shared_loads: int = 0
    shared_stores: int = 0
    widths: dict = field(default_factory=dict)
    by_tag: dict = field(default_factory=dict)     # instructions from each tagged line's source


def nvdisasm() -> str | None:
    found = os.environ.get("NVDISASM") or shutil.which("nvdisasm")
    if found:
        return found
    for site in sys.path:
        hits = glob.glob(os.path.join(site, "triton", "backends", "nvidia", "bin", "nvdisasm"))
        if hits:
            return hits[0]
    return None


def disassemble(source: Path, arch: str, tool: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        subprocess.run(["nvcc", f"-arch=sm_{arch}", "-cubin", "-lineinfo", "-DTL_MODEL_COMMON_PATH", "-o", str(cubin),
                        *compile_options(with_headers=False), str(source)], check=True, capture_output=True, text=True)
        return subprocess.run([tool, "-g", "-c", str(cubin)], check=True, capture_output=True, text=True).stdout


def parse(sass: str) -> dict[str, list[tuple[int, str, str, str, int]]]:
    """nvdisasm -g text -> {kernel: [(offset, opcode, operands, file, line)]}, branch targets
    (labels) rewritten as the offsets they stand for."""
    raw, labels = {}, {}
    name, where, waiting = None, ("", 0), []
    for text in sass.splitlines():
        if m := SECTION.match(text):
            name, waiting = m.group(1), []
            raw.setdefault(name, [])
            labels.setdefault(name, {})
        elif name is None:
            continue
        elif m := LINE.search(text):
            where = (Path(m.group(1)).name, int(m.group(2)))
        elif m := LABEL.match(text):
            waiting.append(m.group(1))
        elif m := INSTRUCTION.search(text):
            offset = int(m.group(1), 16)
            for label in waiting:
                labels[name][label] = offset
            waiting = []
            raw[name].append((offset, m.group(3), m.group(4), *where))
    return {kernel: [(o, op, TARGET.sub(lambda m, k=kernel: hex(labels[k].get(m.group(1), -1)), args), f, n)
                     for o, op, args, f, n in code] for kernel, code in raw.items()}


def tags(source: Path) -> dict[int, str]:
    """{line: NAME} for the `// sass: NAME` comments of a source file."""
    return {n: m.group(1) for n, text in enumerate(source.read_text().splitlines(), 1) if (m := TAG.search(text))}


def load_width(opcode: str) -> int:
    for part in opcode.split(".")[1:]:
        if part in LOAD_BYTES:
            return LOAD_BYTES[part]
    return 4


def registers(operand: str, width: int = 4) -> set[int]:
    """Registers an operand names; a 64- or 128-bit destination names 2 or 4 consecutive."""
    found = {int(r) for r in REGISTER.findall(operand)}
    if width > 4 and found:
        first = min(found)
        found = set(range(first, first + width // 4))
    return found


def loops_of(code, tagged: dict) -> tuple[list[Loop], int]:
    """The loops that hold a tagged source line: for each instruction from a line with a
    `// sass:` tag (tagged: {(file, line): NAME}), the smallest loop body [target, branch]
    of a backward branch around it; where no loop holds it, the straight run from it to the
    kernel's last tensor-core instruction (HMMA). -> (those loops, how many loops the kernel has)."""
    spans = set()
    for offset, opcode, operands, _file, _line in code:
        if opcode.startswith("BRA") and (m := OFFSET.search(operands)):
            target = int(m.group(1), 16)
            if 0 <= target <= offset:
                spans.add((target, offset))
    chosen = set()
    mma = [offset for offset, opcode, *_ in code if opcode.startswith("HMMA")]
    for offset, _opcode, _operands, file, line in code:
        if (file, line) in tagged:
            around = [s for s in spans if s[0] <= offset <= s[1]]
            if around:
                chosen.add(min(around, key=lambda s: s[1] - s[0]))
            elif mma and offset < mma[-1]:
                # a tagged load in no loop (linear_mma.cu: a warp's loads all issued at once, the
                # products fully unrolled): the straight run from it to the last mma, once
                chosen.add((offset, mma[-1]))
    # straight runs that start inside another keep the outer one
    chosen = {c for c in chosen if not any(o != c and o[0] <= c[0] and c[1] <= o[1] and o[1] == c[1]
                                           for o in chosen)}
    return [measure(code, start, end, tagged) for start, end in sorted(chosen)], len(spans)


def measure(code, start: int, end: int, tagged: dict) -> Loop:
    loop = Loop(start, end)
    pending: set[int] = set()       # registers the current round's loads write
    in_round = False
    for offset, opcode, operands, file, line in code:
        if not start <= offset <= end:
            continue
        if (file, line) in tagged:
            tag = tagged[(file, line)]
            if tag not in loop.tags:
                loop.tags.append(tag)
            loop.by_tag[tag] = loop.by_tag.get(tag, 0) + 1
        loop.instructions += 1
        parts = [p.strip() for p in operands.split(",")] if operands.strip() else []
        sources = set().union(*(registers(p) for p in parts[1:])) if len(parts) > 1 else set()
        base = opcode.split(".")[0]
        if base == "LDG":
            width = load_width(opcode)
            if pending & sources:                        # its address needs this round's data
                in_round, pending = False, set()
            if not in_round:
                loop.rounds += 1
                in_round = True
            loop.global_loads += 1
            loop.load_bytes_per_lane += width
            loop.widths[str(width)] = loop.widths.get(str(width), 0) + 1
            pending |= registers(parts[0], width)
            continue
        every = set().union(*(registers(p) for p in parts)) if parts else set()
        reads = every if base.startswith(("ST", "RED", "ATOM")) else sources
        if pending & reads:
            in_round, pending = False, set()             # the warp waits here for the round
        if base == "LDGSTS":
            width = load_width(opcode)
            loop.async_bytes_per_lane += width
            loop.widths[f"async {width}"] = loop.widths.get(f"async {width}", 0) + 1
        elif base in ("FFMA", "FADD", "FMUL"):
            loop.float_ops += 1
        elif base == "LDS":
            loop.shared_loads += 1
        elif base == "STS":
            loop.shared_stores += 1
    return loop


def analyse(arch: str, only: str | None = None) -> dict:
    tool = nvdisasm()
    if tool is None:
        raise SystemExit("nvdisasm not found: put it on PATH, set NVDISASM, or pip install triton (it ships one)")
    tagged = {}
    for source in (ROOT / "cuda").iterdir():
        if source.suffix in (".cu", ".cuh"):
            tagged.update({(source.name, line): name for line, name in tags(source).items()})
    out = {}
    for source in sorted((ROOT / "cuda").glob("*.cu")):
        if only and only not in source.read_text():          # --kernel: only the files naming it
            continue
        for kernel, code in parse(disassemble(source, arch, tool)).items():
            if only and kernel != only:
                continue
            loops, n_loops = loops_of(code, tagged)
            out[kernel] = {"file": source.name, "instructions": len(code), "loops_in_kernel": n_loops,
                           "loops": [asdict(loop) for loop in loops]}
    return out


def read_saved() -> dict:
    """The figures cuda/SASS.md holds ({} when it is absent)."""
    path = ROOT / "cuda" / "SASS.md"
    if not path.exists():
        return {}
    text = path.read_text()
    return json.loads(text[text.index("```json") + 7:text.rindex("```")])


def compact_json(figures: dict) -> str:
    """One line per loop: short enough to read, and diffs show which loop changed."""
    lines = ['{"arch": ' + json.dumps(figures["arch"]) + ', "kernels": {']
    kernels = list(figures["kernels"].items())
    for i, (kernel, f) in enumerate(kernels):
        head = {k: v for k, v in f.items() if k != "loops"}
        loops = ",\n    ".join(json.dumps(loop) for loop in f["loops"])
        lines.append(f' {json.dumps(kernel)}: {json.dumps(head)[:-1]}, "loops": [\n    {loops}]}}'
                     + ("," if i < len(kernels) - 1 else ""))
    lines.append("}}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="90")
    parser.add_argument("--kernel")
    parser.add_argument("--write", action="store_true", help="save cuda/SASS.md")
    args = parser.parse_args()
    figures = analyse(args.arch, args.kernel)
    for kernel, f in figures.items():
        if f["loops"]:
            print(f"{kernel}: {f['instructions']} instructions, {f['loops_in_kernel']} loops")
        for loop in f["loops"]:
            print("   ", json.dumps(loop))
    if args.write:
        version = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
        kept = {k: {**f, "loops": f["loops"]} for k, f in figures.items() if f["loops"]}
        text = ("# Kernel loops from the machine code (written by `python scripts/sass_loops.py --write`)\n\n"
                f"nvcc `-arch=sm_{args.arch} -cubin -lineinfo`, {version}, disassembled by nvdisasm -g. Per "
                "kernel, its smallest loops around each `// sass:` tagged source line, per iteration of one "
                "warp (scripts/sass_loops.py says how each figure is counted). scripts/cuda_estimates.py "
                "reads the JSON below.\n\n```json\n" + compact_json({"arch": args.arch, "kernels": kept})
                + "\n```\n")
        (ROOT / "cuda" / "SASS.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
