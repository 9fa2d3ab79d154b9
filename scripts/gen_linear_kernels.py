"""Write tinyloop/backends/cpu/kernels/linear_generated.py: the linear kernels, unrolled.

Why generated: numba vectorises a loop over 16 outputs well only when it is written out
(LLVM's SLP vectoriser packs the 16 isomorphic statements into one AVX-512 or two AVX2
registers and keeps the accumulators in registers across the k loop); a loop over a small
array does its loads and stores through memory, at half the speed. Writing 16 x 4
statements by hand would be unreadable, so this script writes them, and
tests/test_cpu_linear_kernels.py checks that the file is what this script writes.

    python scripts/gen_linear_kernels.py            # rewrite the file
    python scripts/gen_linear_kernels.py --check    # exit 1 if it is stale

The arithmetic every generated kernel performs is defined in kernels/linear.py.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

TARGET = Path(__file__).resolve().parent.parent / "tinyloop" / "backends" / "cpu" / "kernels" / "linear_generated.py"
TILE = 16                       # outputs per tile (kernels/linear.py TILE)
ROW_BLOCKS = (4, 1)             # rows sharing one unpack of a weight byte, then single rows
# int2 unpacks 4 codes a byte: blocks of 2 rows keep its written-out loop (and numba's compile
# time) the size of int4's
ROW_BLOCKS_OF = {"q2": (2, 1)}
QUANT_BITS = (8, 4, 2)
FLOAT_KINDS = ("f32", "f16")


def unpack_lines(bits: int, indent: str) -> list[str]:
    """Statements giving q{j}_{o} (float32 codes, j = position in the byte) from byte tl[o]."""
    lines = []
    per_byte = 8 // bits
    for o in range(TILE):
        lines.append(f"{indent}c = F(tl[{o}])")
        if per_byte == 1:
            lines.append(f"{indent}q0_{o} = c")
            continue
        # peel the codes off the top with exact float steps: c = sum_j q_j 2**(bits j)
        for j in range(per_byte - 1, 0, -1):
            lines.append(f"{indent}q{j}_{o} = np.floor(c * F({1.0 / (1 << (bits * j))!r}))")
            lines.append(f"{indent}c = c - F({float(1 << (bits * j))!r}) * q{j}_{o}")
        lines.append(f"{indent}q0_{o} = c")
    return lines


def quant_block(bits: int, rows: int) -> list[str]:
    per_byte = 8 // bits
    name = f"_q{bits}_rows{rows}"
    out = [f"@njit(inline='always', cache=True)",
           f"def {name}(x, xg, tiles, scale, mins, group_bytes, t, r0, n_valid, out, col):",
           f'    """Rows r0 .. r0 + {rows} of tile t: int{bits} codes, {per_byte} per byte."""',
           "    n_groups = scale.shape[1]"]
    for r in range(rows):
        for o in range(TILE):
            out.append(f"    a{r}_{o} = F(0.0)")
    out.append("    for g in range(n_groups):")
    for r in range(rows):
        for o in range(TILE):
            out.append(f"        p{r}_{o} = F(0.0)")
    out.append("        for kb in range(g * group_bytes, (g + 1) * group_bytes):")
    out.append("            tl = tiles[t, kb]")
    for r in range(rows):
        for j in range(per_byte):
            out.append(f"            x{r}_{j} = x[r0 + {r}, kb * {per_byte} + {j}]")
    out.extend(unpack_lines(bits, "            "))
    for r in range(rows):
        for o in range(TILE):
            terms = f"p{r}_{o}"
            for j in range(per_byte):
                terms = f"({terms} + x{r}_{j} * q{j}_{o})" if j < per_byte - 1 else f"{terms} + x{r}_{j} * q{j}_{o}"
            out.append(f"            p{r}_{o} = {terms}")
    for r in range(rows):
        out.append(f"        s{r} = xg[r0 + {r}, g]")
    for o in range(TILE):
        out.append(f"        sc{o} = scale[t, g, {o}]")
        out.append(f"        mn{o} = mins[t, g, {o}]")
    for r in range(rows):
        for o in range(TILE):
            out.append(f"        a{r}_{o} = a{r}_{o} + (sc{o} * p{r}_{o} + mn{o} * s{r})")
    out.extend(store_lines(rows))
    return out


def store_lines(rows: int) -> list[str]:
    out = []
    for r in range(rows):
        for o in range(TILE):
            out.append(f"    if {o} < n_valid:")
            out.append(f"        out[r0 + {r}, col + {o}] = a{r}_{o}")
    return out


def float_block(kind: str, rows: int) -> list[str]:
    name = f"_{kind}_rows{rows}"
    load = "F(tl[{o}])" if kind == "f32" else "half_to_float(tl[{o}])"
    out = [f"@njit(inline='always', cache=True)",
           f"def {name}(x, tiles, t, r0, n_valid, out, col):",
           f'    """Rows r0 .. r0 + {rows} of tile t: {kind} weights."""',
           "    k_dim = tiles.shape[1]"]
    for r in range(rows):
        for o in range(TILE):
            out.append(f"    a{r}_{o} = F(0.0)")
    out.append("    for k in range(k_dim):")
    out.append("        tl = tiles[t, k]")
    for o in range(TILE):
        out.append(f"        w{o} = " + load.format(o=o))
    for r in range(rows):
        out.append(f"        x{r} = x[r0 + {r}, k]")
    for r in range(rows):
        for o in range(TILE):
            out.append(f"        a{r}_{o} = a{r}_{o} + x{r} * w{o}")
    out.extend(store_lines(rows))
    return out


def driver(kind: str, quant: bool) -> list[str]:
    """The prange kernel: (row chunk, tile) pairs split between threads; in a chunk, blocks
    of 4 rows (2 for int2), then single rows (the same arithmetic per row either way)."""
    big, small = ROW_BLOCKS_OF.get(kind, ROW_BLOCKS)
    args = "x, xg, tiles, scale, mins, group_bytes" if quant else "x, tiles"
    call = f"(x, xg, tiles, scale, mins, group_bytes, t, {{r}}, n_valid, out, col)" if quant else \
        f"(x, tiles, t, {{r}}, n_valid, out, col)"
    return [
        "@njit(parallel=True, cache=True)",
        f"def linear_{kind}({args}, n_out, out, col0):",
        f'    """{kind}: out[:, col0 .. col0 + n_out] = x W.T (kernels/linear.py gives the arithmetic)."""',
        "    n_rows, n_tiles = x.shape[0], tiles.shape[0]",
        "    n_chunks = (n_rows + ROW_CHUNK - 1) // ROW_CHUNK",
        "    for i in prange(n_chunks * n_tiles):",
        "        chunk, t = i // n_tiles, i % n_tiles",
        "        start, stop = chunk * ROW_CHUNK, min(n_rows, chunk * ROW_CHUNK + ROW_CHUNK)",
        f"        n_valid = min({TILE}, n_out - t * {TILE})",
        f"        col = col0 + t * {TILE}",
        f"        whole = start + (stop - start) // {big} * {big}",
        f"        for r in range(start, whole, {big}):",
        f"            _{kind}_rows{big}" + call.format(r="r"),
        "        for r in range(whole, stop):",
        f"            _{kind}_rows{small}" + call.format(r="r"),
        "    return n_chunks",
    ]


def source() -> str:
    parts = ['"""GENERATED by scripts/gen_linear_kernels.py: do not edit. The arithmetic is defined in',
             'kernels/linear.py; the generator says why the loops are written out."""',
             "import numpy as np",
             "from numba import njit, prange",
             "",
             "from tinyloop.backends.cpu.kernels.halves import half_to_float",
             "",
             "F = np.float32",
             "ROW_CHUNK = 64                  # rows of x one task reads (in L2 beside its weight tile)",
             ""]
    for bits in QUANT_BITS:
        for rows in ROW_BLOCKS_OF.get(f"q{bits}", ROW_BLOCKS):
            parts += ["", *quant_block(bits, rows), ""]
        parts += ["", *driver(f"q{bits}", True), ""]
    for kind in FLOAT_KINDS:
        for rows in ROW_BLOCKS:
            parts += ["", *float_block(kind, rows), ""]
        parts += ["", *driver(kind, False), ""]
    return "\n".join(parts).rstrip() + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from what would be written")
    args = parser.parse_args(argv)
    text = source()
    if args.check:
        current = TARGET.read_text() if TARGET.exists() else ""
        if current != text:
            print(f"{TARGET} is stale: run python scripts/gen_linear_kernels.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text)
    print(f"wrote {TARGET} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
