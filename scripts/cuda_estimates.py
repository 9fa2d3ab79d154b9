"""Paper estimates for the CUDA kernels, to be checked by the first GPU run.

    python scripts/cuda_estimates.py              # print the tables
    python scripts/cuda_estimates.py --write      # also replace the estimates section of cuda/README.md

Per kernel and call of one decode step (batch 1, fp16 KV cache, 1,024 tokens of context):
bytes read and written (by the layouts of cuda/README.md), the time those bytes take at
the H200's 4.8 TB/s, and launches per decoded token; per kernel the occupancy the ptxas
figures of cuda/RESOURCES.md allow on an H200 SM (65,536 registers, 228 KiB shared
memory, 64 warps, 32 blocks) at the launcher's block size. Memory time is a lower bound:
a kernel of a few KiB is bound by its launch (~2-4 us from Python, ~1 us in a graph).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HBM = 4.8e12
CONTEXT = 1024

SHAPES = {
    # SmolLM2-135M-Instruct as pulled: Q4_1 core weights (int4, group 32), Q8_0 tied embedding/head
    "SmolLM2-135M": dict(dim=576, heads=9, kv=3, hd=64, ffn=1536, mlp="swiglu", instances=30, vocab=49152,
                         core_bits=4, head_bits=8, bias=False),
    # doc-407m at 8 loops: 1 prelude + 4 core x 8 + 1 coda = 34 layer instances, int4 group 32
    "doc-407m (8 loops)": dict(dim=2048, heads=16, kv=16, hd=128, ffn=8192, mlp="gelu", instances=34, vocab=50257,
                               core_bits=4, head_bits=4, bias=True),
}
BLOCK_THREADS = {"linear_rows": 256, "linear_bulk": 256, "kv_write": 128, "attention_merge": 128, "attention": 128,
                 "rms_norm": 256, "layer_norm": 256, "rope_rows": 256,
                 "swiglu": 256, "gelu_tanh": 256, "embed_rows": 256, "argmax_rows": 256,
                 "linear_tc": 256, "mma_16816_lanes": 32}


def packed_linear_bytes(n_in: int, n_out: int, bits: int, bias: bool) -> int:
    """Codes + f16 scale and min per group of 32 (as GGUF and RTN store them) + activations in
    + outputs out (+ bias)."""
    return n_out * n_in * bits // 8 + n_out * (n_in // 32) * 4 + n_in * 4 + n_out * 4 + (n_out * 4 if bias else 0)


def step_rows(s: dict) -> list[tuple[str, int, int]]:
    """(kernel, bytes per call, calls per token) of one decode step."""
    d, hd, q, kv, ffn, n = s["dim"], s["hd"], s["heads"] * s["hd"], s["kv"] * s["hd"], s["ffn"], s["instances"]
    up_out = 2 * ffn if s["mlp"] == "swiglu" else ffn
    norm = "rms_norm" if s["mlp"] == "swiglu" else "layer_norm"
    chunk_partials = s["heads"] * (hd + 2) * (CONTEXT // 256) * 4       # written by pass 1, read by the merge
    rows = [
        ("embed_rows", 2 * d * 4, 1),
        (norm, 3 * d * 4, 2 * n + 1),
        ("linear_rows qkv", packed_linear_bytes(d, q + 2 * kv, s["core_bits"], s["bias"]), n),
        ("rope_rows", 2 * (q + kv) * 4 + hd // 2 * 8, n),
        ("kv_write_fp16", 2 * kv * 4 + 2 * kv * 2 + 4, n),
        ("attention_fp16 (pass 1, 256-key chunks)", 2 * CONTEXT * kv * 2 + q * 4 + chunk_partials + 4, n),
        ("attention_merge", chunk_partials + q * 4, n),
        # the residual add is fused into the out and down projections' epilogue: h read there
        ("linear_rows out (+ residual)", packed_linear_bytes(q, d, s["core_bits"], s["bias"]) + d * 4, n),
        ("linear_rows up", packed_linear_bytes(d, up_out, s["core_bits"], s["bias"]), n),
        ("swiglu" if s["mlp"] == "swiglu" else "gelu_tanh", (up_out + ffn) * 4, n),
        ("linear_rows down (+ residual)", packed_linear_bytes(ffn, d, s["core_bits"], s["bias"]) + d * 4, n),
        ("linear_rows head", packed_linear_bytes(d, s["vocab"], s["head_bits"], False), 1),
        ("argmax_rows", s["vocab"] * 4 + 4, 1),
    ]
    return rows


def resources() -> dict:
    """{kernel: (registers, static smem)} for sm_90 from cuda/RESOURCES.md."""
    path = ROOT / "cuda" / "RESOURCES.md"
    out = {}
    if path.exists():
        for m in re.finditer(r"\| \S+ \| `(\w+)` \| sm_90 \| (\d+) \| (\d+) \|", path.read_text()):
            out[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return out


def occupancy(registers: int, smem: int, threads: int) -> float:
    """Resident warps per SM / 64 on an H200 (registers allocated per warp in 256s)."""
    warps = -(-threads // 32)
    per_warp = -(-registers * 32 // 256) * 256
    by_registers = 65536 // (per_warp * warps)
    by_smem = (228 * 1024) // (smem + 1024) if smem else 32
    blocks = min(32, by_registers, by_smem, 64 // warps)
    return blocks * warps / 64


def tables() -> str:
    lines = [f"Decode step, batch 1, fp16 KV cache at {CONTEXT} tokens of context; memory time at 4.8 TB/s.", ""]
    for name, shape in SHAPES.items():
        rows = step_rows(shape)
        lines += [f"**{name}**", "", "| kernel | bytes / call | us / call at 4.8 TB/s | calls / token | "
                  "us / token |", "|---|---|---|---|---|"]
        total_bytes = total_calls = 0
        for kernel, nbytes, calls in rows:
            lines.append(f"| {kernel} | {nbytes:,} | {nbytes / HBM * 1e6:.2f} | {calls} | "
                         f"{nbytes * calls / HBM * 1e6:.1f} |")
            total_bytes, total_calls = total_bytes + nbytes * calls, total_calls + calls
        lines += [f"| **step** | {total_bytes:,} | | {total_calls} launches | {total_bytes / HBM * 1e6:.0f} "
                  f"(bound: {HBM / total_bytes:,.0f} tok/s) |", ""]
    found = resources()
    if found:
        lines += ["Occupancy on an H200 SM from the sm_90 ptxas figures (cuda/RESOURCES.md) at the "
                  "launchers' block sizes (dynamic shared memory not counted):", "",
                  "| kernel | threads / block | registers | static smem (B) | occupancy |", "|---|---|---|---|---|"]
        for kernel, (registers, smem) in sorted(found.items()):
            threads = next((t for prefix, t in BLOCK_THREADS.items() if kernel.startswith(prefix)), 256)
            lines.append(f"| `{kernel}` | {threads} | {registers} | {smem} | "
                         f"{occupancy(registers, smem, threads):.0%} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    text = tables()
    print(text)
    if args.write:
        readme = ROOT / "cuda" / "README.md"
        begin, end = "<!-- estimates: scripts/cuda_estimates.py --write -->", "<!-- end of estimates -->"
        content = readme.read_text()
        block = f"{begin}\n{text}\n{end}"
        if begin in content:
            content = content[:content.index(begin)] + block + content[content.index(end) + len(end):]
        else:
            content += f"\n## Estimates, before a GPU has run them\n\n{block}\n"
        readme.write_text(content)
    return 0


if __name__ == "__main__":
    sys.exit(main())
