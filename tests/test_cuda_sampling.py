"""cuda/sampling.cu against the CPU backend's definitions (np.argmax, topk.top_k_ids,
a float64 log-sum-exp) and its twin, on the kernel_device fixture."""
import numpy as np
import pytest

from tinyloop.backends.reference.topk import top_k_ids
from tinyloop.backends.reference.twins import sampling as twin
from tinyloop.backends.cuda.launch import sampling as launch

F = np.float32


def tied_logits(rng, rows: int, vocab: int) -> np.ndarray:
    """(rows, vocab): integer values in [-8, 8) (every value tied many times), row 1 normal
    floats, row 2 mixing -0.0 and +0.0 with negatives (-0 == +0: ties by id), row 3 one value."""
    logits = rng.integers(-8, 8, (rows, vocab)).astype(F)
    if rows >= 4:
        logits[1] = rng.standard_normal(vocab).astype(F)
        logits[2] = np.where(rng.random(vocab) < 0.5, F(-0.0), F(0.0)) - (rng.random(vocab) < 0.9)
        logits[3] = F(-2.5)
    return logits


def nans(n: int) -> np.ndarray:
    """n NaNs of different bits: a negative one first, then growing payloads (every NaN ranks
    the same, ties by id, whatever its sign and payload)."""
    bits = np.array([0xFFC00000] + [0x7FC00000 + i for i in range(1, n)], np.uint32)
    return bits.view(F)


def test_argmax_lowest_id_on_ties(kernel_device):
    rng = np.random.default_rng(0)
    logits = tied_logits(rng, 65, 1000)
    logits[4, [10, 500]] = nans(2)                                  # NaN wins, the first one
    logits[5] = -np.inf
    logits[6, 999] = np.inf
    ids = kernel_device.empty((65,), np.int32)
    launch.argmax(kernel_device.module("sampling"), kernel_device.asarray(logits), ids)
    got = kernel_device.to_host(ids)
    assert np.array_equal(got, np.argmax(logits, axis=1))           # NumPy: the first maximum, the first NaN
    assert got[2] == np.flatnonzero(logits[2] == 0)[0] and got[4] == 10 and got[6] == 999


def check_top_k(kernel_device, logits: np.ndarray, k: int) -> None:
    rows = logits.shape[0]
    ids = kernel_device.empty((rows, k), np.int32)
    values = kernel_device.empty((rows, k), F)
    launch.top_k(kernel_device.module("sampling"), kernel_device.asarray(logits), k, ids, values)
    got_ids, got_values = kernel_device.to_host(ids), kernel_device.to_host(values)
    for r in range(rows):
        expected = top_k_ids(logits[r].astype(np.float64), k)[:k]
        assert np.array_equal(got_ids[r], expected), f"row {r}"
        assert np.array_equal(got_values[r].view(np.uint32), logits[r, expected].view(np.uint32)), f"row {r}"
    twin_ids, twin_values = twin.top_k_rows(logits, k)
    assert np.array_equal(got_ids, twin_ids) and np.array_equal(got_values.view(np.uint32), twin_values.view(np.uint32))


@pytest.mark.parametrize("k", [1, 5, 40, 64])
@pytest.mark.parametrize("rows, vocab", [(8, 1000), (4, 49152)])
def test_top_k_matches_top_k_ids(kernel_device, rows, vocab, k):
    check_top_k(kernel_device, tied_logits(np.random.default_rng(k), rows, vocab), k)


@pytest.mark.kernel_orders("id")          # ~1 s an order on the harness; the orders run above
def test_top_k_256k_vocab(kernel_device):
    """18 id bits: ties at the k-th value take three id passes."""
    check_top_k(kernel_device, tied_logits(np.random.default_rng(9), 4, 262144), 64)


@pytest.mark.parametrize("threads", [32, 512])       # 512: the kernel's __launch_bounds__ (a GPU refuses more)
def test_top_k_result_is_free_of_block_size(kernel_device, threads):
    logits = tied_logits(np.random.default_rng(threads), 4, 5000)
    ids = kernel_device.empty((4, 40), np.int32)
    values = kernel_device.empty((4, 40), F)
    kernel_device.module("sampling").get_function("top_k_rows")(
        (4,), (threads,), (kernel_device.asarray(logits), np.int32(4), np.int32(5000), np.int32(40), ids, values))
    expected = np.stack([top_k_ids(row.astype(np.float64), 40)[:40] for row in logits])
    assert np.array_equal(kernel_device.to_host(ids), expected)


def test_top_k_edges(kernel_device):
    rng = np.random.default_rng(5)
    check_top_k(kernel_device, rng.integers(-2, 2, (3, 64)).astype(F), 64)      # k == V: every id, sorted
    check_top_k(kernel_device, rng.standard_normal((1, 1)).astype(F), 1)        # V == 1
    huge = rng.standard_normal((2, 3000)).astype(F)
    huge[0, [5, 17, 2999]] = [np.inf, -np.inf, np.inf]                           # infinities rank as values
    huge[1, :] = -np.inf
    check_top_k(kernel_device, huge, 7)


def test_top_k_nan_ranks_first(kernel_device):
    """top_k_ids is undefined with NaN; the kernel ranks NaN above +inf, lower ids first."""
    logits = np.arange(100, dtype=F)[None, :].copy()
    logits[0, [3, 70]] = nans(2)
    ids = kernel_device.empty((1, 4), np.int32)
    values = kernel_device.empty((1, 4), F)
    launch.top_k(kernel_device.module("sampling"), kernel_device.asarray(logits), 4, ids, values)
    assert kernel_device.to_host(ids).tolist() == [[3, 70, 99, 98]]


def test_top_k_rejects_k_out_of_range(kernel_device):
    logits = kernel_device.zeros((1, 100), F)
    for k in (0, 65, 101):
        with pytest.raises(ValueError):
            launch.top_k(kernel_device.module("sampling"), logits, k, kernel_device.empty((1, k), np.int32),
                         kernel_device.empty((1, k), F))


def test_logsumexp(kernel_device):
    rng = np.random.default_rng(6)
    logits = tied_logits(rng, 65, 1000)
    logits[0] = rng.standard_normal(1000).astype(F) * F(300)         # exp of the raw values overflows
    logits[5, :10] = -np.inf
    out = kernel_device.empty((65,), np.float64)
    launch.logsumexp(kernel_device.module("sampling"), kernel_device.asarray(logits), out)
    got = kernel_device.to_host(out)
    wide = logits.astype(np.float64)
    top = wide.max(axis=1)
    with np.errstate(divide="ignore"):
        reference = top + np.log(np.exp(wide - top[:, None]).sum(axis=1))
    assert np.allclose(got, reference, rtol=1e-12, atol=0)
    assert np.allclose(got, twin.logsumexp_rows(logits), rtol=1e-12, atol=0)
