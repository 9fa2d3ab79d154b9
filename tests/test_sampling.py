import math

import numpy as np
import pytest

from tinyloop.engine.sampling import Sampler, SamplingParams
from tinyloop.errors import RequestError


def reference_kept(logits, temperature, top_k, top_p):
    """Brute force: ids kept by top-k then top-p, and their probabilities."""
    scores = [x / temperature for x in logits]
    order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    if top_k:
        order = order[:top_k]
    best = scores[order[0]]
    weights = [math.exp(scores[i] - best) for i in order]
    total = sum(weights)
    probs = [w / total for w in weights]
    kept, mass = [], 0.0
    for i, p in zip(order, probs):
        kept.append(i)
        mass += p
        if top_p < 1.0 and mass >= top_p:
            break
    return set(kept)


@pytest.mark.parametrize("case", range(40))
def test_top_k_top_p_keep_exactly_the_reference_set(case):
    rng = np.random.default_rng(case)
    vocab = int(rng.integers(5, 60))
    logits = rng.standard_normal(vocab) * 3
    if case % 4 == 0:                       # ties at the cut-off
        logits = np.round(logits)
    top_k = int(rng.choice([0, 1, 3, vocab - 1, vocab, vocab + 5]))
    top_p = float(rng.choice([1.0, 0.9, 0.5, 0.1, 1e-9, 0.0]))
    temperature = float(rng.choice([0.3, 1.0, 1.7]))
    sampler = Sampler(SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=0), vocab)
    probs = sampler.probabilities(logits)
    assert set(np.flatnonzero(probs)) == reference_kept(list(logits), temperature, top_k, top_p)
    assert abs(probs.sum() - 1.0) < 1e-12


def test_same_seed_same_tokens_different_seed_different_tokens():
    rng = np.random.default_rng(0)
    steps = [rng.standard_normal(50) for _ in range(40)]

    def run(seed):
        sampler = Sampler(SamplingParams(temperature=1.0, seed=seed), 50)
        return [sampler.sample(logits) for logits in steps]

    assert run(7) == run(7)
    assert run(7) != run(8)


def test_each_request_has_its_own_stream():
    logits = np.zeros(1000)
    a = Sampler(SamplingParams(temperature=1.0, seed=1), 1000)
    b = Sampler(SamplingParams(temperature=1.0, seed=1), 1000)
    first = [a.sample(logits) for _ in range(5)]
    [Sampler(SamplingParams(temperature=1.0, seed=1), 1000).sample(logits) for _ in range(3)]
    assert [b.sample(logits) for _ in range(5)] == first


def test_greedy_is_argmax_and_uses_no_randomness():
    sampler = Sampler(SamplingParams(temperature=0.0, seed=3), 4)
    state = sampler.rng.bit_generator.state
    assert sampler.sample(np.array([0.1, 2.0, 2.0, -1.0])) == 1      # tie -> lower id
    assert sampler.rng.bit_generator.state == state


def test_sampling_follows_the_distribution():
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    sampler = Sampler(SamplingParams(temperature=1.0, seed=0), 3)
    counts = np.bincount([sampler.sample(logits) for _ in range(20000)], minlength=3)
    assert np.all(np.abs(counts / 20000 - [0.5, 0.3, 0.2]) < 0.015)


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    sampler = Sampler(SamplingParams(repetition_penalty=2.0), 4, prompt_ids=[0, 1])
    sampler.observe(2)
    out = sampler.shaped(np.array([4.0, -4.0, 1.0, 3.0]))
    assert out.tolist() == [2.0, -8.0, 0.5, 3.0]


def test_presence_and_frequency_penalties_follow_openai():
    sampler = Sampler(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25), 3, prompt_ids=[2])
    for token in (0, 0, 1):
        sampler.observe(token)
    out = sampler.shaped(np.zeros(3))
    assert out.tolist() == [-(0.5 + 2 * 0.25), -(0.5 + 0.25), 0.0]


@pytest.mark.parametrize("field, value, message", [
    ("temperature", 2.5, r"temperature must be in \[0.0, 2.0\], got 2.5"),
    ("temperature", float("nan"), "temperature must be a number"),
    ("top_p", 1.5, r"top_p must be in \[0.0, 1.0\], got 1.5"),
    ("top_k", -1, "top_k must be an integer >= 0"),
    ("repetition_penalty", 0.0, "repetition_penalty must be in"),
    ("presence_penalty", 3.0, "presence_penalty must be in"),
    ("seed", -1, "seed must be an integer"),
])
def test_invalid_parameters_say_what_is_allowed(field, value, message):
    with pytest.raises(RequestError, match=message):
        SamplingParams(**{field: value})


def reference_probabilities(logits, temperature, top_k, top_p) -> dict:
    """Brute force: the kept ids' probabilities, renormalised over what top-k/top-p keep."""
    scores = [x / temperature for x in logits]
    kept = reference_kept(list(logits), temperature, top_k, top_p)
    best = max(scores[i] for i in kept)
    weights = {i: math.exp(scores[i] - best) for i in kept}
    total = sum(weights.values())
    return {i: w / total for i, w in weights.items()}


@pytest.mark.parametrize("case", range(12))
def test_kept_probabilities_are_the_renormalised_softmax(case):
    rng = np.random.default_rng(100 + case)
    logits = rng.standard_normal(30) * 2
    top_k, top_p, temperature = [(0, 1.0, 1.0), (5, 1.0, 0.7), (0, 0.8, 1.3), (7, 0.6, 2.0)][case % 4]
    probs = Sampler(SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p), 30).probabilities(logits)
    expected = reference_probabilities(list(logits), temperature, top_k, top_p)
    assert set(np.flatnonzero(probs)) == set(expected)
    for token, p in expected.items():
        assert probs[token] == pytest.approx(p, rel=1e-12)


def test_top_p_zero_keeps_only_the_most_likely_token():
    probs = Sampler(SamplingParams(temperature=1.0, top_p=0.0), 4).probabilities(np.array([0.0, 3.0, 2.9, 1.0]))
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_greedy_probabilities_put_all_mass_on_the_penalised_argmax():
    sampler = Sampler(SamplingParams(repetition_penalty=4.0), 3, prompt_ids=[0])
    logits = np.array([3.0, 1.0, 0.5])                  # token 0 seen: 3 / 4 = 0.75 < 1
    assert sampler.probabilities(logits).tolist() == [0.0, 1.0, 0.0]
    assert sampler.greedy_token(logits) == 1 and sampler.sample(logits) == 1


def test_draw_is_an_inverse_cdf_of_one_uniform():
    class Fixed:
        def __init__(self, u):
            self.u = u

        def random(self):
            return self.u
    sampler = Sampler(SamplingParams(temperature=1.0), 4)
    probs = np.array([0.25, 0.0, 0.5, 0.25])
    assert [sampler.draw(probs, Fixed(u)) for u in (0.0, 0.2499, 0.25, 0.7499, 0.75, 0.9999)] == [0, 0, 2, 2, 3, 3]
    assert sampler.draw(np.array([0.5, 0.5, 0.0]), Fixed(1.0)) == 1      # u on the total: the last token kept
    assert sampler.draw(np.array([1.0, 3.0]), Fixed(0.3)) == 1           # weights need not sum to 1


@pytest.mark.parametrize("field, low, high, below, above", [
    ("temperature", 0.0, 2.0, -0.01, 2.01), ("top_p", 0.0, 1.0, -0.01, 1.01),
    ("repetition_penalty", 1e-9, 10.0, 0.0, 10.01), ("presence_penalty", -2.0, 2.0, -2.01, 2.01),
    ("frequency_penalty", -2.0, 2.0, -2.01, 2.01), ("seed", 0, 2 ** 64 - 1, -1, 2 ** 64),
    ("top_k", 0, 10 ** 6, -1, None), ("min_p", 0.0, 1.0, -0.01, 1.01),
])
def test_parameter_limits_are_inclusive(field, low, high, below, above):
    assert getattr(SamplingParams(**{field: low}), field) == low
    assert getattr(SamplingParams(**{field: high}), field) == high
    for value in (below, above):
        if value is not None:
            with pytest.raises(RequestError) as info:
                SamplingParams(**{field: value})
            assert info.value.param == field


@pytest.mark.parametrize("field", ["temperature", "top_k", "seed", "top_p"])
def test_booleans_are_not_numbers(field):
    with pytest.raises(RequestError, match=f"{field} must be"):
        SamplingParams(**{field: True})


def test_assuming_sees_a_draft_path_and_restores_the_history():
    sampler = Sampler(SamplingParams(presence_penalty=1.0, repetition_penalty=2.0), 4, prompt_ids=[3])
    sampler.observe(1)
    before = sampler.shaped(np.ones(4)).tolist()
    with sampler.assuming([2, 2, 1]):
        assert sampler.shaped(np.ones(4)).tolist() == [1.0, 0.5 - 1.0, 0.5 - 1.0, 0.5]
    assert sampler.shaped(np.ones(4)).tolist() == before == [1.0, -0.5, 1.0, 0.5]
    assert sampler.generated_counts.tolist() == [0, 1, 0, 0]


# ----------------------------------------------------------------- logit_bias, min_p, logprobs (README: Agents)
def test_logit_bias_is_added_to_the_logits():
    """OpenAI's logit_bias: added to the listed ids' logits (+100 forces, -100 bans)."""
    logits = np.array([1.0, 3.0, 2.0, 0.5])
    sampler = Sampler(SamplingParams(logit_bias=((0, 5.0), (1, -2.5))), 4)
    assert sampler.shaped(logits).tolist() == [6.0, 0.5, 2.0, 0.5]
    assert Sampler(SamplingParams(logit_bias=((3, 100.0),)), 4).greedy_token(logits) == 3
    assert Sampler(SamplingParams(logit_bias=((1, -100.0),)), 4).greedy_token(logits) == 2


def test_min_p_keeps_tokens_at_exactly_min_p_times_the_best():
    """`min_p` drops tokens *below* min_p x the best probability: a tie at the bound stays
    (min_p = 1 keeps every token tied for best, and only those)."""
    sampler = Sampler(SamplingParams(temperature=1.0, min_p=1.0), 4)
    assert sampler.probabilities(np.array([2.0, 5.0, 5.0, 1.0])).tolist() == [0.0, 0.5, 0.5, 0.0]
    half = Sampler(SamplingParams(temperature=1.0, min_p=0.5), 3)
    probs = half.probabilities(np.log(np.array([4.0, 2.0, 1.0])))      # 4/7, 2/7, 1/7: 2/7 is exactly half of 4/7
    assert probs[2] == 0.0 and probs[0] > 0 and probs[1] > 0
    assert probs[0] / probs[1] == pytest.approx(2.0, rel=1e-12)


def test_greedy_logprobs_are_the_log_softmax_of_the_shaped_scores_at_temperature_1():
    """Logprobs: log-softmax of the shaped scores divided by the temperature, 1 under greedy."""
    logits = np.array([0.5, 2.0, -1.0, 1.0])
    expected = logits - math.log(sum(math.exp(x) for x in logits))          # written out, not the module's helper
    token, report = Sampler(SamplingParams(), 4, top_logprobs=2).sample_with_logprobs(logits)
    assert token == 1 and report.logprob == pytest.approx(expected[1], abs=1e-12)
    assert [i for i, _ in report.top] == [1, 3]
    assert [lp for _, lp in report.top] == pytest.approx([expected[1], expected[3]], abs=1e-12)
    hot = Sampler(SamplingParams(temperature=2.0, seed=1), 4, top_logprobs=0)
    token, report = hot.sample_with_logprobs(logits)
    scaled = logits / 2.0
    assert report.logprob == pytest.approx(scaled[token] - math.log(sum(math.exp(x) for x in scaled)), abs=1e-12)
    assert report.top == ()


def test_only_real_penalties_count_as_penalties():
    """Greedy decoding without penalties, bias, grammar or logprobs moves only ids off the
    backend (needs_host False); any one penalty alone, or a bias, needs the host."""
    assert not SamplingParams().has_penalties and not Sampler(SamplingParams(), 4).needs_host
    for params in (dict(repetition_penalty=1.2), dict(presence_penalty=0.5), dict(frequency_penalty=-0.5)):
        assert SamplingParams(**params).has_penalties and Sampler(SamplingParams(**params), 4).needs_host
    assert Sampler(SamplingParams(logit_bias=((1, 1.0),)), 4).needs_host
    assert Sampler(SamplingParams(), 4, top_logprobs=0).needs_host


def test_top_logprobs_go_up_to_20():
    from tinyloop.engine.sampling import MAX_TOP_LOGPROBS
    assert MAX_TOP_LOGPROBS == 20                          # README: top_logprobs 0..20
    logits = np.arange(30, dtype=np.float64)
    _, report = Sampler(SamplingParams(), 30, top_logprobs=20).sample_with_logprobs(logits)
    assert [i for i, _ in report.top] == list(range(29, 9, -1))


def test_logit_bias_values_are_limited_to_plus_minus_100_inclusive():
    """The engine refuses a bias outside [-100, 100] itself (not only the HTTP layer)."""
    assert SamplingParams(logit_bias=((1, 100.0), (2, -100.0))).logit_bias == ((1, 100.0), (2, -100.0))
    for bias in (100.5, -100.5, float("nan")):
        with pytest.raises(RequestError) as info:
            SamplingParams(logit_bias=((1, bias),))
        assert info.value.param == "logit_bias"


def test_assuming_with_a_grammar_assumes_the_path_in_both_and_restores_both():
    """A draft path under a grammar: inside `assuming`, the constraint sees the path and the
    penalties count it; on exit both are back (a stand-in constraint records the calls)."""
    from contextlib import contextmanager

    class Constraint:
        def __init__(self):
            self.assumed = []

        @contextmanager
        def assuming(self, tokens):
            self.assumed.append(list(tokens))
            yield
            self.assumed.pop()

        def apply(self, scores):
            pass

    constraint = Constraint()
    sampler = Sampler(SamplingParams(presence_penalty=1.0), 4, constraint=constraint)
    ran = []
    with sampler.assuming([2, 2]):
        ran.append(True)
        assert constraint.assumed == [[2, 2]]
        assert sampler.shaped(np.zeros(4)).tolist() == [0.0, 0.0, -1.0, 0.0]
    assert ran == [True] and constraint.assumed == []
    assert sampler.shaped(np.zeros(4)).tolist() == [0.0, 0.0, 0.0, 0.0]


def test_the_grammar_mask_applies_after_penalties_and_bias():
    """README (Generation semantics): logit_bias and a grammar mask apply after the
    penalties; a refused token can never be drawn (a stand-in constraint refuses id 1)."""
    class RefuseOne:
        def apply(self, scores):
            self.saw = scores.copy()
            scores[1] = -np.inf

    constraint = RefuseOne()
    sampler = Sampler(SamplingParams(repetition_penalty=2.0, logit_bias=((1, 4.0),)), 3, prompt_ids=[1],
                      constraint=constraint)
    out = sampler.shaped(np.array([1.0, 4.0, 2.0]))
    assert constraint.saw.tolist() == [1.0, 6.0, 2.0]                      # 4 / 2 + 4: penalised, then biased
    assert out.tolist() == [1.0, -np.inf, 2.0] and sampler.greedy_token(np.array([1.0, 4.0, 2.0])) == 2


@pytest.mark.parametrize("shift", [1000.0, -1000.0, 0.0])
def test_sampling_probabilities_do_not_overflow_for_large_logits(shift):
    """Softmax relative to the best score: logits far from 0 (either side) give the same
    finite distribution as the same logits near 0 (written out: 1 : e^-1 : e^-3)."""
    sampler = Sampler(SamplingParams(temperature=1.0, seed=0), 3)
    probs = sampler.probabilities(np.array([3.0, 2.0, 0.0]) + shift)
    total = 1 + math.exp(-1) + math.exp(-3)
    assert probs.tolist() == pytest.approx([1 / total, math.exp(-1) / total, math.exp(-3) / total], rel=1e-12)
    assert sampler.sample(np.array([3.0, 2.0, 0.0]) + shift) in (0, 1, 2)


def test_observing_a_token_advances_the_grammar_and_the_penalties():
    class Recorder:
        def __init__(self):
            self.advanced = []

        def advance(self, token):
            self.advanced.append(token)

        def apply(self, scores):
            pass

    constraint = Recorder()
    sampler = Sampler(SamplingParams(frequency_penalty=0.5), 4, constraint=constraint)
    for token in (2, 2, 3):
        sampler.observe(token)
    assert constraint.advanced == [2, 2, 3]
    assert sampler.shaped(np.zeros(4)).tolist() == [0.0, 0.0, -1.0, -0.5]
