"""Multi-candidate speculative acceptance: whatever the draft q, the emitted token is
distributed exactly as the target p (the oracle is p itself, not the module's code).

The unit tests drive accept_sampled directly with K children drawn i.i.d. from q, for
(p, q) pairs chosen so that children differ and get rejected often; the end-to-end
test runs tree speculation with K = 3 on the tiny model at a temperature where the
root's three children differ and rejections happen (counted with a spy on the real
function), and checks the first two tokens against plain sampling's exact joint
distribution."""
import numpy as np
import pytest
from test_speculative import chi_square_ok, exact_joint

from tinyloop.engine.generate import GenerationRequest, speculative_generate
from tinyloop.engine.sampling import SamplingParams
from tinyloop.engine.speculative import SpeculativeParams
from tinyloop.engine.speculative import acceptance as acceptance_module
from tinyloop.engine.speculative.acceptance import accept_greedy, accept_sampled


def draw_index(weights: np.ndarray, rng) -> int:
    """Inverse-CDF draw scaled by the total, as the decoder draws its corrections."""
    cumulative = np.cumsum(weights)
    return min(int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right")),
               len(weights) - 1)


def emitted_counts(p, q, k, runs, seed):
    rng = np.random.default_rng(seed)
    counts = np.zeros(len(p), np.int64)
    rejections = differing = 0
    for _ in range(runs):
        children = [draw_index(q, rng) for _ in range(k)]
        differing += len(set(children)) > 1
        index, residual = accept_sampled(p, q, children, rng)
        if index is None:
            token = draw_index(residual, rng)
            rejections += k
        else:
            token = children[index]
            rejections += index
        counts[token] += 1
    return counts, rejections, differing


PAIRS = [
    # p far from q: most children rejected, residuals after one and two rejections differ
    (np.array([0.05, 0.10, 0.15, 0.30, 0.40]), np.array([0.40, 0.30, 0.15, 0.10, 0.05])),
    # q puts mass where p has none, and misses a token p likes
    (np.array([0.00, 0.25, 0.25, 0.00, 0.50]), np.array([0.30, 0.30, 0.30, 0.10, 0.00])),
    # after the first rejection p is (nearly) q's complement
    (np.array([0.50, 0.20, 0.10, 0.10, 0.10]), np.array([0.10, 0.10, 0.20, 0.30, 0.30])),
]


@pytest.mark.parametrize("pair", range(len(PAIRS)))
@pytest.mark.parametrize("k", [2, 3, 4])
def test_multi_candidate_acceptance_emits_the_target_distribution(pair, k):
    p, q = PAIRS[pair]
    runs = 20000
    counts, rejections, differing = emitted_counts(p, q, k, runs, seed=pair * 10 + k)
    assert rejections > runs // 2 and differing > runs // 2, "the setup must exercise rejections"
    observed = {(t,): int(c) for t, c in enumerate(counts) if c}
    expected = {(t,): float(v) for t, v in enumerate(p) if v > 0}
    ok, stat, critical = chi_square_ok(observed, expected, runs)
    assert ok, f"K={k} pair {pair}: chi-square {stat:.1f} >= {critical:.1f}, counts {counts.tolist()}"


def test_equal_target_and_draft_always_accept_the_first_child():
    p = np.array([0.2, 0.3, 0.5])
    rng = np.random.default_rng(0)
    for _ in range(200):
        index, _ = accept_sampled(p, p.copy(), [2, 0, 1], rng)
        assert index == 0


def test_a_child_the_target_rules_out_is_never_accepted():
    p, q = np.array([0.0, 0.5, 0.5]), np.array([1.0, 0.0, 0.0])
    rng = np.random.default_rng(1)
    for _ in range(200):
        index, residual = accept_sampled(p, q, [0, 0], rng)
        assert index is None
        assert np.allclose(residual, [0.0, 0.5, 0.5]) and residual.sum() == pytest.approx(1.0)


def test_the_residual_after_a_rejection_is_normalised_max_of_p_minus_q():
    """One child, rejected for sure (p(x) = 0): the returned correction distribution is
    max(p - q, 0) / its sum, worked out by hand."""
    p, q = np.array([0.0, 0.6, 0.4]), np.array([0.5, 0.1, 0.4])
    index, residual = accept_sampled(p, q, [0], np.random.default_rng(2))
    assert index is None
    assert np.allclose(residual, [0.0, 1.0, 0.0])
    p, q = np.array([0.1, 0.5, 0.4]), np.array([0.9, 0.05, 0.05])
    index, residual = accept_sampled(p, q, [0, 0], np.random.default_rng(3))   # the 2nd sees the residual
    if index is None:
        assert np.allclose(residual, np.array([0.0, 0.45, 0.35]) / 0.8)


def test_greedy_accepts_the_first_child_equal_to_the_target():
    assert accept_greedy(7, [3, 7, 7]) == 1
    assert accept_greedy(7, [3, 4]) is None
    assert accept_greedy(7, []) is None


def test_tree_sampling_with_differing_roots_and_rejections_matches_plain_sampling(tiny, monkeypatch):
    """K = 3 tree at temperature 2 (a flat draft at 1 loop, a different target at 8): the
    first two tokens over 3,000 seeds against plain sampling's exact joint distribution."""
    seen = {"calls": 0, "differing": 0, "rejected": 0}
    real = acceptance_module.accept_sampled

    def spy(target, draft, child_tokens, rng):
        index, residual = real(target, draft, child_tokens, rng)
        if len(child_tokens) == 3:
            seen["calls"] += 1
            seen["differing"] += len(set(child_tokens)) > 1
            seen["rejected"] += index != 0
        return index, residual

    monkeypatch.setattr("tinyloop.engine.speculative.decoder.accept_sampled", spy)
    model, prompt, runs = tiny.model, [320, 458, 425], 3000
    sampling = SamplingParams(temperature=2.0, top_k=8)
    expected = exact_joint(model, prompt, sampling, 8, 2)
    params = SpeculativeParams(1, 8, 1, 3)
    observed = {}
    for seed in range(runs):
        seeded = SamplingParams(**{**sampling.__dict__, "seed": seed})
        out = speculative_generate(model, GenerationRequest(prompt, 3, sampling=seeded, ignore_eos=True), params)
        key = tuple(out.tokens[:2])
        observed[key] = observed.get(key, 0) + 1
    assert seen["calls"] >= runs, seen
    assert seen["differing"] > seen["calls"] // 4 and seen["rejected"] > seen["calls"] // 10, seen
    ok, stat, critical = chi_square_ok(observed, expected, runs)
    assert ok, f"chi-square {stat:.1f} >= {critical:.1f}"
