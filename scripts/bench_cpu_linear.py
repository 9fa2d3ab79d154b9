"""The CPU linear kernels against NumPy/OpenBLAS on the default model's weights, side by side.

    python scripts/bench_cpu_linear.py [MODEL.tinyloop] [--rows 1 16 512] [--seconds 1]

For every linear of one layer (q|k|v, out, gate|up, down) and the head, the best time of
TinyLoop's kernel on the packed weights (what the CPU backend runs) against the
float32 product the backend used before: one `x @ W` per row (gemv: the old exact path,
row-invariant) and one GEMM for all rows (the old prefill path, not row-invariant), the
weights dequantized to float32. Ratios above 1: the kernel is faster.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tinyloop.backends.cpu.linear import linear, prepare_linear  # noqa: E402
from tinyloop.convert.pull import default_model_path  # noqa: E402
from tinyloop.model.modelfile import ModelFile  # noqa: E402
from tinyloop.model.quant import QuantizedTensor, dequantize  # noqa: E402
from tinyloop.model.weights import linear_parts  # noqa: E402


def best(fn, seconds: float) -> float:
    fn()
    fastest, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        t = time.perf_counter()
        fn()
        fastest = min(fastest, time.perf_counter() - t)
    return fastest


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=None)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 512])
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args(argv)
    path = Path(args.model) if args.model else default_model_path()
    mf = ModelFile(path)
    c = mf.config
    prefix = "core.0" if c.n_core else "prelude.0"
    weights = {name: [mf.get(f"{prefix}.{part}.weight") for part in linear_parts(c, name)]
               for name in ("qkv", "out", "up", "down")}
    weights["head"] = [mf.get("embed.weight" if c.tied_head else "head.weight")]
    rng = np.random.default_rng(0)
    print(f"{path.name}: {c.dim} wide; kernel vs float32 NumPy/OpenBLAS (best of {args.seconds:.1f} s each)")
    print(f"{'linear':<6} {'rows':>5} {'kernel ms':>10} {'gemv ms':>9} {'gemm ms':>9} {'vs gemv':>8} {'vs gemm':>8}")
    for name, parts in weights.items():
        packed = prepare_linear(parts)
        dense = np.ascontiguousarray(np.concatenate(
            [dequantize(p) if isinstance(p, QuantizedTensor) else np.asarray(p, np.float32) for p in parts]).T)
        for rows in args.rows:
            x = rng.standard_normal((rows, dense.shape[0])).astype(np.float32)
            ours = best(lambda: linear(x, packed), args.seconds)
            gemv = best(lambda: x[:, None, :] @ dense, args.seconds)
            gemm = best(lambda: x @ dense, args.seconds)
            print(f"{name:<6} {rows:>5} {ours * 1e3:>10.3f} {gemv * 1e3:>9.3f} {gemm * 1e3:>9.3f} "
                  f"{gemv / ours:>8.2f} {gemm / ours:>8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
