"""argmax, top-k and the float64 log-normalizer of logit rows.

Ranking (argmax and top-k), exact in any order: a logit's rank key is its float32 value in
the order of the values, -0 == +0, NaN above +inf (every NaN the same), then the lower id
first (the CUDA twin's rank_keys, twins/sampling.py). Keys are distinct, so the result is one
set in one order, however it is searched: nothing is rounded.
- argmax: a 16-lane maximum and NaN flag (comparisons only), then the first id holding
  the maximum (or the first NaN): np.argmax's answer.
- top_k: one pass in id order keeping the k best in a sorted buffer (insertion; an id
  enters only when it ranks strictly above the k-th, so ties keep the lower id); k > KMAX
  or k >= V: a sort of the distinct keys.
log_normalizer (float64): top = the row's maximum (NaN if any NaN); s = the sum of
exp_f64(float64(x[k]) - top) in the lanes order (lane l adds k = l, l + 16, ... in order,
then the fixed tree 8, 4, 2, 1); result = top + log_f64(s). exp_f64 / log_f64 are our own
(rows_f64.py), every step one IEEE float64 operation, no FMA: the same bits on every CPU,
for every row whatever the other rows, and whichever thread computes it (threads split
rows only).
"""
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from tinyloop.backends.cpu.kernels.lanes import LANES
from tinyloop.backends.cpu.kernels.rows_f64 import exp_f64, log_f64

KMAX = 64                        # the insertion path's largest k
CHUNK = 512                      # the log-normalizer's exps per chunk (a multiple of LANES)
NAN_KEY = np.int64(0xFFFFFFFF)
ID_MASK = np.int64(0xFFFFFFFF)


@intrinsic
def _f32_bits(typingctx, value):
    """A float32's bits seen as an int32 (a register move)."""
    sig = types.int32(types.float32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return sig, codegen


@njit(inline="always", cache=True, error_model="numpy")
def _value_key(v):
    """float32 -> its rank (larger = better) as a signed 32-bit value in an int64: the
    twin's unsigned key - 2**31, so that (key << 32) | (2**32 - 1 - id) orders as an int64."""
    bits = np.int64(_f32_bits(v)) & 0xFFFFFFFF
    bits = 0 if bits == 0x80000000 else bits                      # -0 ranks with +0
    key = (0xFFFFFFFF - bits) if bits >= 0x80000000 else (bits | 0x80000000)
    key = NAN_KEY if v != v else key
    return key - 0x80000000


@njit(cache=True, error_model="numpy")
def _argmax_row(x, t):
    """The first NaN if any; else the 16-lane maximum (comparisons only), then the first id
    holding it. Each loop is a plain count, maximum or search: they vectorise."""
    row = x[t]
    n = row.shape[0]
    nans = 0
    for k in range(n):
        nans += row[k] != row[k]
    if nans:
        for k in range(n):
            if row[k] != row[k]:
                return k
    best = np.full(LANES, -np.inf, np.float32)
    full = n - n % LANES
    for k0 in range(0, full, LANES):
        for lane in range(LANES):
            v = row[k0 + lane]
            b = best[lane]
            best[lane] = v if v > b else b
    top = row[0]
    for lane in range(LANES):
        top = best[lane] if best[lane] > top else top
    for k in range(full, n):
        top = row[k] if row[k] > top else top
    for k0 in range(0, full, LANES):
        hit = False
        for lane in range(LANES):
            hit = hit | (row[k0 + lane] == top)
        if hit:
            for k in range(k0, k0 + LANES):
                if row[k] == top:
                    return k
    for k in range(full, n):
        if row[k] == top:
            return k
    return 0


@njit(cache=True, error_model="numpy")
def argmax_serial(x, out):
    for t in range(x.shape[0]):
        out[t] = _argmax_row(x, t)


@njit(parallel=True, cache=True, error_model="numpy")
def argmax_parallel(x, out):
    for t in prange(x.shape[0]):
        out[t] = _argmax_row(x, t)


@njit(cache=True, error_model="numpy")
def _top_k_insert_row(x, t, k, ids, values):
    """The k best of row t (k <= V), best first, by inserting each id in order."""
    row = x[t]
    n = row.shape[0]
    keys = np.empty(k, np.int64)
    for i in range(k):                                            # the first k ids, sorted
        key = (_value_key(row[i]) << 32) | (ID_MASK - i)
        pos = i
        while pos > 0 and keys[pos - 1] < key:
            keys[pos] = keys[pos - 1]
            pos -= 1
        keys[pos] = key
    worst = keys[k - 1]
    worst_value = row[ID_MASK - (worst & ID_MASK)]
    for i in range(k, n):
        v = row[i]
        if v <= worst_value:            # ranks at most equal to the k-th, and comes later: out
            continue                    # (False when either is NaN: decided by the keys)
        key = (_value_key(v) << 32) | (ID_MASK - i)
        if key > worst:
            pos = k - 1
            while pos > 0 and keys[pos - 1] < key:
                keys[pos] = keys[pos - 1]
                pos -= 1
            keys[pos] = key
            worst = keys[k - 1]
            worst_value = row[ID_MASK - (worst & ID_MASK)]
    for i in range(k):
        j = ID_MASK - (keys[i] & ID_MASK)
        ids[t, i] = j
        values[t, i] = np.float64(row[j])


@njit(cache=True, error_model="numpy")
def _top_k_sort_row(x, t, k, ids, values):
    """The k best of row t by a sort of its distinct keys (any sort: the keys are distinct)."""
    row = x[t]
    n = row.shape[0]
    keys = np.empty(n, np.int64)
    for i in range(n):
        keys[i] = -((_value_key(row[i]) << 32) | (ID_MASK - i))   # ascending = best first
    order = np.argsort(keys)
    for i in range(k):
        j = order[i]
        ids[t, i] = j
        values[t, i] = np.float64(row[j])


@njit(cache=True, error_model="numpy")
def _top_k_row(x, t, k, ids, values):
    if k <= KMAX:
        _top_k_insert_row(x, t, k, ids, values)
    else:
        _top_k_sort_row(x, t, k, ids, values)


@njit(cache=True, error_model="numpy")
def _log_normalizer_row(row):
    n = row.shape[0]
    nans = 0
    for k in range(n):
        nans += row[k] != row[k]
    if nans:
        return np.nan
    best = np.full(LANES, -np.inf, row.dtype)
    full = n - n % LANES
    for k0 in range(0, full, LANES):
        for lane in range(LANES):
            v = row[k0 + lane]
            b = best[lane]
            best[lane] = v if v > b else b
    top = np.float64(-np.inf)
    for lane in range(LANES):
        top = np.float64(best[lane]) if best[lane] > top else top
    for k in range(full, n):
        top = np.float64(row[k]) if row[k] > top else top
    acc = np.zeros(LANES, np.float64)
    terms = np.empty(CHUNK, np.float64)
    for k0 in range(0, n, CHUNK):                  # the exps of a chunk (a vectorised loop) ...
        m = min(CHUNK, n - k0)
        for i in range(m):
            terms[i] = np.float64(row[k0 + i]) - top
        for i in range(m):
            terms[i] = exp_f64(terms[i])
        full = m - m % LANES                       # ... then into the lanes: term k to lane k % 16
        for j in range(0, full, LANES):
            for lane in range(LANES):
                acc[lane] = acc[lane] + terms[j + lane]
        for i in range(full, m):
            acc[i - full] = acc[i - full] + terms[i]
    for width in (8, 4, 2, 1):
        for lane in range(width):
            acc[lane] = acc[lane] + acc[lane + width]
    return top + log_f64(acc[0])


@njit(cache=True, error_model="numpy")
def log_normalizer_1d(row):
    return _log_normalizer_row(row)


@njit(cache=True, error_model="numpy")
def top_k_serial(x, k, ids, values, normalizers):
    for t in range(x.shape[0]):
        if k > 0:
            _top_k_row(x, t, k, ids, values)
        normalizers[t] = _log_normalizer_row(x[t])


@njit(parallel=True, cache=True, error_model="numpy")
def top_k_parallel(x, k, ids, values, normalizers):
    for t in prange(x.shape[0]):
        if k > 0:
            _top_k_row(x, t, k, ids, values)
        normalizers[t] = _log_normalizer_row(x[t])
