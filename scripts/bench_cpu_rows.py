"""Old (NumPy) against new (compiled row kernels) for the CPU backend's per-row and
elementwise ops, SmolLM2-135M shapes (D 576, ffn 1536, 9 heads of 64, vocab 49152), at
T = 1, 16 and 512 rows; prints microseconds per call and old / new side by side.

    .venv/bin/python scripts/bench_cpu_rows.py [--rows 1 16 512] [--seconds 0.3]

The old functions are the backend's NumPy code before the kernels, copied here verbatim."""
import argparse
import time

import numpy as np

from tinyloop.backends.cpu.kernels import rows
from tinyloop.backends.cpu.positions import inv_frequencies
from tinyloop.backends.cpu.topk import top_k_ids

F = np.float32
D, FFN, HEADS, HEAD_DIM, VOCAB, TOP_K = 576, 1536, 9, 64, 49152, 8


# ---------------------------------------------------------------- the old NumPy path
def old_rms_norm(x, weight, eps):
    x = np.ascontiguousarray(x, dtype=F)
    mean_square = np.add.reduce(x * x, axis=-1, keepdims=True) / F(x.shape[-1])
    return x * (F(1.0) / np.sqrt(mean_square + F(eps))) * weight


def old_layer_norm(x, weight, bias, eps):
    x = np.ascontiguousarray(x, dtype=F)
    width = F(x.shape[-1])
    mean = np.add.reduce(x, axis=-1, keepdims=True) / width
    centered = x - mean
    variance = np.add.reduce(centered * centered, axis=-1, keepdims=True) / width
    out = centered * (F(1.0) / np.sqrt(variance + F(eps))) * weight
    if bias is not None:
        out += bias
    return out


def old_silu(x):
    out = np.negative(x)
    np.exp(out, out=out)
    out += F(1.0)
    np.divide(x, out, out=out)
    return out


def old_swiglu(up, ffn_dim):
    out = old_silu(up[:, :ffn_dim])
    out *= up[:, ffn_dim:]
    return out


def old_gelu(x):
    inner = F(0.7978845608028654) * (x + F(0.044715) * x * x * x)
    return F(0.5) * x * (F(1.0) + np.tanh(inner))


def old_apply_rope(x, rotation):
    pairs = np.ascontiguousarray(x).view(np.complex64)
    return (pairs * rotation[:, None, :]).view(F)


def old_rope_table(max_positions, inv_freq):
    angles = np.arange(max_positions, dtype=np.float64)[:, None] * np.asarray(inv_freq, np.float64)[None, :]
    return (np.cos(angles) + 1j * np.sin(angles)).astype(np.complex64)


def old_log_normalizer(scores):
    top = scores.max()
    return float(top + np.log(np.exp(scores - top).sum()))


def old_argmax(logits):
    return np.argmax(logits, axis=-1)


def old_top_k(logits, k):
    rows_ = [np.asarray(row, np.float64) for row in logits]
    ids = np.stack([top_k_ids(row, k)[:k] for row in rows_])
    values = np.stack([row[i] for row, i in zip(rows_, ids)])
    return ids, values, np.array([old_log_normalizer(row) for row in rows_])


# ------------------------------------------------------------------------ timing
def per_call(fn, seconds: float) -> float:
    """Median seconds per call over repeats filling about `seconds` (at least 5)."""
    fn()
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    repeats = max(5, min(2000, int(seconds / once)))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def cases(t: int, rng):
    x = rng.standard_normal((t, D)).astype(F)
    weight, bias = rng.standard_normal((2, D)).astype(F)
    up = (rng.standard_normal((t, 2 * FFN)) * 3).astype(F)
    hidden = up[:, :FFN].copy()
    table = rows.rope_table(8192, inv_frequencies(HEAD_DIM, 100000.0))
    rotation = table[rng.integers(0, 8192, t)]
    q = rng.standard_normal((t, HEADS, HEAD_DIM)).astype(F)
    logits = (rng.standard_normal((t, VOCAB)) * 4).astype(F)
    return [
        ("rms_norm", lambda: old_rms_norm(x, weight, 1e-5), lambda: rows.rms_norm(x, weight, 1e-5)),
        ("layer_norm", lambda: old_layer_norm(x, weight, bias, 1e-5), lambda: rows.layer_norm(x, weight, bias, 1e-5)),
        ("swiglu", lambda: old_swiglu(up, FFN), lambda: rows.swiglu(up, FFN)),
        ("gelu", lambda: old_gelu(hidden), lambda: rows.gelu(hidden)),
        ("rope (q, 9 heads)", lambda: old_apply_rope(q, rotation), lambda: rows.apply_rope(q, rotation)),
        ("argmax", lambda: old_argmax(logits), lambda: rows.argmax(logits)),
        (f"top_k (k={TOP_K}) + logZ", lambda: old_top_k(logits, TOP_K), lambda: rows.top_k(logits, TOP_K)),
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 512])
    parser.add_argument("--seconds", type=float, default=0.3, help="time spent per measurement")
    args = parser.parse_args()
    rows.warm_up()
    rng = np.random.default_rng(0)
    results = {}
    for t in args.rows:
        for name, old, new in cases(t, rng):
            results.setdefault(name, {})[t] = (per_call(old, args.seconds), per_call(new, args.seconds))
    header = f"{'op':24}" + "".join(f" | T={t:<4} old us   new us  old/new" for t in args.rows)
    print(header)
    print("-" * len(header))
    for name, by_rows in results.items():
        line = f"{name:24}"
        for t in args.rows:
            old, new = by_rows[t]
            line += f" | {'':6} {old * 1e6:8.1f} {new * 1e6:8.1f} {old / new:7.2f}x"
        print(line)
    start = time.perf_counter()
    old_rope_table(8192, inv_frequencies(HEAD_DIM, 100000.0))
    old_time = time.perf_counter() - start
    start = time.perf_counter()
    rows.rope_table(8192, inv_frequencies(HEAD_DIM, 100000.0))
    new_time = time.perf_counter() - start
    print(f"\nrope_table (8192 x 32, once at load): old {old_time * 1e3:.1f} ms, new {new_time * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
