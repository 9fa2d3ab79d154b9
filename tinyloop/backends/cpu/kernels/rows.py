"""The row kernels' entry points: operand checks, the choice of a serial or a threaded
driver (by size only: both call the same per-row function, so a row's bits do not depend
on the choice), and `warm_up()`, which compiles (or loads from numba's cache) every
signature the backend uses, so no compilation lands in a request.

Kernels: norms.py (rms_norm, layer_norm), activations.py (swiglu, gelu), rope.py (apply,
table), topk.py (argmax, top_k with the float64 log-normalizer). Each has a NumPy oracle
(<op>_oracle.py) the tests compare with bit for bit.
"""
import numpy as np

from tinyloop.backends.cpu.kernels import activations as _act
from tinyloop.backends.cpu.kernels import norms as _norms
from tinyloop.backends.cpu.kernels import rope as _rope
from tinyloop.backends.cpu.kernels import topk as _topk
from tinyloop.backends.cpu.kernels.rows_f64 import SINCOS_LIMIT

F = np.float32
# Work from which the threaded drivers are used: prefill-sized calls only. Measured on the
# project's shared 2-core machine (under load from other processes): a numba parallel region
# cost 10-16 ms to start with the OpenMP threading layer (20 us with workqueue), while
# these ops take 2-700 us serially at T <= 512; so decode, verify and short prefills stay
# serial. Either driver gives the same bits (the same per-row function).
PARALLEL_ELEMENTS = 1 << 21              # e.g. swiglu at ffn 1536 from 1366 rows, rms_norm at D 576 from 3641
PARALLEL_ROWS_TOP_K = 32                 # a top-k row (vocab 49152) is ~130 us of work


def _f32(x) -> np.ndarray:
    """C-contiguous, writable float32 (no copy when it already is): a read-only array (a
    memory-mapped weight) would be a new numba type, compiled in the request."""
    x = np.ascontiguousarray(x, dtype=F)
    return x if x.flags.writeable else x.copy()


def _threaded(elements: int) -> bool:
    return elements >= PARALLEL_ELEMENTS


def rms_norm(x, weight, eps) -> np.ndarray:
    """x: (T, D) -> (T, D) float32 (norms.py's definition)."""
    x, weight = _f32(x), _f32(weight)
    out = np.empty_like(x)
    run = _norms.rms_norm_parallel if _threaded(x.size) and x.shape[0] > 1 else _norms.rms_norm_serial
    run(x, weight, F(eps), out)
    return out


def layer_norm(x, weight, bias, eps) -> np.ndarray:
    """x: (T, D) -> (T, D) float32; bias may be None."""
    x, weight = _f32(x), _f32(weight)
    has_bias = bias is not None
    bias = _f32(bias) if has_bias else weight                      # a placeholder, never read
    out = np.empty_like(x)
    run = _norms.layer_norm_parallel if _threaded(x.size) and x.shape[0] > 1 else _norms.layer_norm_serial
    run(x, weight, bias, has_bias, F(eps), out)
    return out


def swiglu(up, ffn_dim: int) -> np.ndarray:
    """up: (T, 2 ffn) = [gate | up] -> (T, ffn) float32."""
    up = _f32(up)
    out = np.empty((up.shape[0], ffn_dim), F)
    run = _act.swiglu_parallel if _threaded(out.size) and up.shape[0] > 1 else _act.swiglu_serial
    run(up, ffn_dim, out)
    return out


def gelu(x) -> np.ndarray:
    """GELU (tanh approximation), any shape -> float32 of that shape."""
    x = _f32(x)
    flat = x.reshape(-1)
    out = np.empty_like(flat)
    run = _act.gelu_parallel if _threaded(flat.size) else _act.gelu_serial
    run(flat, out)
    return out.reshape(x.shape)


def apply_rope(x, rotation) -> np.ndarray:
    """x: (T, heads, hd) float32, rotation: (T, hd/2) complex64 -> (T, heads, hd) float32."""
    x = _f32(x)
    rot = np.ascontiguousarray(rotation, np.complex64)
    rot = rot if rot.flags.writeable else rot.copy()              # (T, hd/2): cos + i sin
    out = np.empty_like(x)
    run = _rope.rope_parallel if _threaded(x.size) and x.shape[0] > 1 else _rope.rope_serial
    run(x.view(np.complex64), rot, out.view(np.complex64))
    return out


def rope_table(max_positions: int, inv_freq) -> np.ndarray:
    """-> (max_positions, hd/2) complex64 e^{i p f_j}, CPU-independent (rope.py)."""
    inv_freq = np.array(inv_freq, np.float64)                      # a writable contiguous copy
    if max_positions > 0 and inv_freq.size and not (
            np.all(inv_freq >= 0) and float(max_positions - 1) * float(inv_freq.max()) < SINCOS_LIMIT):
        raise ValueError(f"RoPE angles up to {max_positions - 1} x {inv_freq.max()} leave the table's "
                         f"range [0, {SINCOS_LIMIT:g})")
    out = np.empty((max_positions, 2 * inv_freq.shape[0]), F)
    _rope.rope_table_kernel(inv_freq, out)
    return out.view(np.complex64)


def argmax(logits) -> np.ndarray:
    """(T, V) -> (T,) int64: the largest value, the lowest id on ties, the first NaN if any."""
    if np.asarray(logits).dtype != F:               # float64 / float16 rows: np.argmax (exact too)
        return np.argmax(logits, axis=-1)
    x = _f32(logits)
    if x.ndim == 1:
        return argmax(x[None])[0]
    out = np.empty(x.shape[0], np.int64)
    run = _topk.argmax_parallel if _threaded(x.size) and x.shape[0] > 1 else _topk.argmax_serial
    run(x, out)
    return out


def top_k(logits, k: int):
    """(T, V) float32 -> ids (T, n) int64 best first (ties: lower id; NaN above +inf),
    values (T, n) float64, log-normalizers (T,) float64; n = min(k, V) (0 when k is 0)."""
    x = _f32(logits)
    rows, vocab = x.shape
    n = min(int(k), vocab) if k > 0 else 0
    ids = np.empty((rows, n), np.int64)
    values = np.empty((rows, n), np.float64)
    normalizers = np.empty(rows, np.float64)
    run = _topk.top_k_parallel if rows >= PARALLEL_ROWS_TOP_K else _topk.top_k_serial
    run(x, n, ids, values, normalizers)
    return ids, values, normalizers


def log_normalizer(scores) -> float:
    """log(sum(exp(scores))) of a (V,) row (float64 or float32), fixed-order (topk.py)."""
    scores = np.asarray(scores)
    if scores.dtype != np.float32:
        scores = np.asarray(scores, np.float64)
    scores = np.ascontiguousarray(scores)
    return float(_topk.log_normalizer_1d(scores if scores.flags.writeable else scores.copy()))


def warm_up() -> None:
    """Compile (or load from numba's on-disk cache) every kernel signature the backend
    uses, serial and threaded, on tiny arrays. Call once at model load."""
    x = np.linspace(-2, 2, 2 * 32, dtype=F).reshape(2, 32)
    w = np.ones(32, F)
    for norm in (_norms.rms_norm_serial, _norms.rms_norm_parallel):
        norm(x, w, F(1e-5), np.empty_like(x))
    for norm in (_norms.layer_norm_serial, _norms.layer_norm_parallel):
        norm(x, w, w, True, F(1e-5), np.empty_like(x))
        norm(x, w, w, False, F(1e-5), np.empty_like(x))
    for run in (_act.swiglu_serial, _act.swiglu_parallel):
        run(x, 16, np.empty((2, 16), F))
    for run in (_act.gelu_serial, _act.gelu_parallel):
        run(x.reshape(-1), np.empty(x.size, F))
    q = x.reshape(2, 2, 16).view(np.complex64)
    rot = rope_table(4, np.array([1.0, 0.5, 0.25, 0.125, 0.1, 0.01, 0.001, 1e-4]))[[1, 3]]
    for run in (_rope.rope_serial, _rope.rope_parallel):
        run(q, np.ascontiguousarray(rot), np.empty_like(q))
    ids = np.empty(2, np.int64)
    for run in (_topk.argmax_serial, _topk.argmax_parallel):
        run(x, ids)
    for run in (_topk.top_k_serial, _topk.top_k_parallel):
        for k in (0, 2, 32):
            run(x, k, np.empty((2, k), np.int64), np.empty((2, k), np.float64), np.empty(2))
    _topk.log_normalizer_1d(x[0])
    _topk.log_normalizer_1d(x[0].astype(np.float64))
