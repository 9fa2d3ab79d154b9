"""Self-speculative decoding: exact under greedy, lossless under sampling."""
from dataclasses import replace

import numpy as np
import pytest
from test_model import random_config

from tinyloop.engine.generate import GenerationRequest, generate, speculative_generate
from tinyloop.engine.sampling import SamplingParams
from tinyloop.engine.sequence import Sequence
from tinyloop.engine.speculative import SpeculativeParams
from tinyloop.errors import RequestError
from tinyloop.model.loader import load_model
from tinyloop.model.modelfile import write_model_file
from tinyloop.model.testmodels import make_test_model, random_weights, train_tokenizer


@pytest.fixture(scope="module")
def random_models(tmp_path_factory):
    """Eight random looped configs (max_loops >= 2), plus the two tiny presets."""
    folder = tmp_path_factory.mktemp("spec")
    tokenizer_json = train_tokenizer().to_str()
    models = []
    rng = np.random.default_rng(1234)
    while len(models) < 8:
        config = random_config(rng, 512)
        if config.max_loops < 2:
            continue
        path = write_model_file(folder / f"r{len(models)}.tinyloop", config,
                                random_weights(config, len(models)), tokenizer_json)
        models.append(load_model(path).model)
    for preset, seed in (("tiny-looped", 0), ("tiny-looped-gpt", 1)):
        make_test_model(folder / f"{preset}.tinyloop", preset, seed=seed)
        models.append(load_model(folder / f"{preset}.tinyloop").model)
    return models


def random_case(rng, model):
    max_loops = model.config.max_loops
    verify = int(rng.integers(2, max_loops + 1))
    draft = int(rng.integers(1, verify))
    ahead = int(rng.integers(1, 17))
    branches = min(int(rng.integers(1, 64 // ahead + 1)), 16)
    prompt = [int(t) for t in rng.integers(0, model.config.vocab_size, int(rng.integers(1, 40)))]
    max_tokens = int(rng.integers(1, 48))
    return prompt, max_tokens, SpeculativeParams(draft, verify, ahead, branches)


@pytest.mark.exactness(sample=2)
# the default run keeps blocks 0, 2 and 4; 6 and 8 (~20 s each) run with -m slow and in every
# configuration of scripts/exactness_matrix.py (-m exactness selects slow cases too)
@pytest.mark.parametrize("block", [b if b < 6 else pytest.param(b, marks=pytest.mark.slow) for b in range(10)])
def test_greedy_speculation_equals_plain_generation(random_models, block):
    """25 random (model, prompt, loops, draft_ahead, K) cases per block: 250 in all."""
    rng = np.random.default_rng(block)
    for case in range(25):
        model = random_models[int(rng.integers(len(random_models)))]
        prompt, max_tokens, params = random_case(rng, model)
        plain = generate(model, GenerationRequest(prompt, max_tokens, loops=params.verify_loops))
        for branches in sorted({1, params.branches}):
            p = SpeculativeParams(params.draft_loops, params.verify_loops, params.draft_ahead, branches)
            spec = speculative_generate(model, GenerationRequest(prompt, max_tokens), p)
            assert np.array_equal(spec.tokens, plain.tokens), (block, case, p)
            assert spec.finish_reason == plain.finish_reason
            assert spec.completion_tokens == plain.completion_tokens


@pytest.mark.exactness
def test_one_branch_tree_is_the_chain(random_models):
    rng = np.random.default_rng(77)
    for _ in range(40):
        model = random_models[int(rng.integers(len(random_models)))]
        prompt, max_tokens, params = random_case(rng, model)
        chain = speculative_generate(model, GenerationRequest(prompt, max_tokens),
                                     SpeculativeParams(params.draft_loops, params.verify_loops,
                                                       params.draft_ahead, 1), mode="speculative")
        tree = speculative_generate(model, GenerationRequest(prompt, max_tokens),
                                    SpeculativeParams(params.draft_loops, params.verify_loops,
                                                      params.draft_ahead, 1), mode="tree_speculative")
        assert np.array_equal(chain.tokens, tree.tokens)
        assert chain.speculative.to_dict() == tree.speculative.to_dict()
        assert tree.mode == "tree_speculative"


@pytest.mark.exactness
def test_greedy_with_penalties_stays_exact(tiny):
    sampling = SamplingParams(temperature=0.0, repetition_penalty=1.3, presence_penalty=0.4,
                              frequency_penalty=0.3)
    for seed in range(10):
        prompt = [int(t) for t in np.random.default_rng(seed).integers(0, 512, 12)]
        plain = generate(tiny.model, GenerationRequest(prompt, 40, loops=6, sampling=sampling))
        for branches in (1, 4):
            spec = speculative_generate(tiny.model, GenerationRequest(prompt, 40, sampling=sampling),
                                        SpeculativeParams(2, 6, 5, branches))
            assert spec.tokens == plain.tokens


@pytest.mark.exactness
@pytest.mark.parametrize("branches", [1, 3])
def test_cache_after_rollbacks_equals_a_sequential_run(tiny, branches):
    model = tiny.model
    prompt = [5, 17, 200, 33, 9, 61]
    request = GenerationRequest(prompt, max_tokens=40, ignore_eos=True)
    params = SpeculativeParams(2, 7, 6, branches)
    sequence = Sequence(model, replace(request, mode="tree_speculative", speculative=params))
    while not sequence.finished:
        sequence.step()
    decoder = sequence.decoder
    assert decoder.stats.accepted < decoder.stats.drafted          # there were rejections
    length = decoder.cache.length
    tokens = prompt + decoder.sink.tokens
    reference = model.new_cache(len(tokens), 7)
    model.forward(prompt, np.arange(len(prompt)), reference, 7, exact=False, last_only=True)
    for position in range(len(prompt), length):
        model.forward([tokens[position]], [position], reference, 7)
    assert length == len(tokens) - 1
    ours, theirs = decoder.cache.stored(0, length), reference.stored(0, length)
    slots = reference.n_slots
    for name in theirs:
        assert np.array_equal(ours[name][:slots], theirs[name]), name


@pytest.mark.exactness
def test_stops_inside_a_round_end_the_output_exactly_there(tiny):
    model = tiny.model
    prompt = [320, 458, 425, 290, 332]
    reference = generate(model, GenerationRequest(prompt, 30, loops=8)).tokens
    params = SpeculativeParams(6, 8, 12, 1)   # deep draft: long accepted runs
    # max_tokens reached mid-run
    out = speculative_generate(model, GenerationRequest(prompt, 7), params)
    assert out.tokens == reference[:7] and out.finish_reason == "length" and out.completion_tokens == 7
    # a stop token mid-run
    stop = reference[9]
    cut = reference.index(stop)
    for branches in (1, 4):
        out = speculative_generate(model, GenerationRequest(prompt, 30, stop_token_ids=(stop,)),
                                   SpeculativeParams(6, 8, 12, branches))
        assert out.tokens == reference[:cut] and out.finish_reason == "stop"
        assert out.stop_token_id == stop and out.completion_tokens == cut + 1


def test_cancel_between_rounds(tiny):
    calls = []
    out = speculative_generate(tiny.model, GenerationRequest([1, 2, 3], 50, ignore_eos=True),
                               SpeculativeParams(2, 8, 3, 1), on_token=lambda token, _: calls.append(token),
                               cancel=lambda: len(calls) >= 5)
    assert out.finish_reason == "cancelled"
    assert 5 <= len(out.tokens) <= 5 + 4 and out.tokens == calls


def test_stats_are_consistent(tiny):
    out = speculative_generate(tiny.model, GenerationRequest([7, 8, 9], 60, ignore_eos=True),
                               SpeculativeParams(2, 8, 4, 1))
    stats = out.speculative
    assert stats.rounds > 0
    assert stats.accepted + stats.rounds + 1 == out.completion_tokens   # +1: the prefill's token
    assert stats.accepted_at_depth[0] >= stats.accepted_at_depth[-1]
    assert 0.0 <= stats.acceptance_rate <= 1.0
    assert len(stats.acceptance_by_depth) == 4


@pytest.mark.parametrize("params, message", [
    (SpeculativeParams(4, 4), r"draft_loops \(4\) must be less than verify_loops \(4\)"),
    (SpeculativeParams(2, 9), r"verify_loops must be in \[1, 8\] for this model, got 9"),
    (SpeculativeParams(0, 4), r"draft_loops must be in \[1, 8\]"),
    (SpeculativeParams(2, 8, draft_ahead=17), r"draft_ahead must be an integer in \[1, 16\]"),
    (SpeculativeParams(2, 8, draft_ahead=0), r"draft_ahead must be an integer in \[1, 16\]"),
    (SpeculativeParams(2, 8, branches=17), r"K_branches must be an integer in \[1, 16\]"),
    (SpeculativeParams(2, 8, draft_ahead=8, branches=9), r"at most 64, got 9 \* 8 = 72"),
])
def test_parameter_validation(tiny, params, message):
    with pytest.raises(RequestError, match=message):
        speculative_generate(tiny.model, GenerationRequest([1, 2], 5), params)


# ---------------------------------------------------------------------------- sampling
def exact_joint(model, prompt, sampling, loops, n_tokens):
    """P(first n_tokens) of plain sampling, by enumerating the (small) support."""
    from tinyloop.engine.sampling import Sampler
    joint = {(): 1.0}
    for _ in range(n_tokens):
        grown = {}
        for prefix, mass in joint.items():
            sequence = prompt + list(prefix)
            cache = model.new_cache(len(sequence), loops)
            logits = model.forward(sequence, np.arange(len(sequence)), cache, loops)[-1]
            sampler = Sampler(sampling, model.config.vocab_size, prompt)
            for token in prefix:
                sampler.observe(token)
            probs = sampler.probabilities(logits)
            for token in np.flatnonzero(probs):
                grown[prefix + (int(token),)] = mass * probs[token]
        joint = grown
    return joint


def chi_square_ok(observed: dict, expected: dict, n: int) -> tuple[bool, float, float]:
    """Pearson's test at p = 0.001, cells with expected count < 5 pooled."""
    stat, df, pooled_obs, pooled_exp = 0.0, -1, 0, 0.0
    for cell, probability in expected.items():
        e = probability * n
        o = observed.get(cell, 0)
        if e < 5:
            pooled_obs += o
            pooled_exp += e
            continue
        stat += (o - e) ** 2 / e
        df += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / max(pooled_exp, 1e-9)
        df += 1
    assert sum(v for k, v in observed.items() if k not in expected) == 0, "impossible sequence"
    z = 3.09    # one-sided 0.001; Wilson-Hilferty approximation of the chi-square quantile
    critical = df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3
    return stat < critical, stat, critical


@pytest.mark.parametrize("branches, sampling", [
    # ~40 s and ~30 s: in the -m slow run (CI runs both), to keep the default suite near 10 min
    pytest.param(1, SamplingParams(temperature=1.0, top_k=3), marks=pytest.mark.slow),
    pytest.param(3, SamplingParams(temperature=0.9, top_k=3, top_p=0.95, repetition_penalty=1.3),
                 marks=pytest.mark.slow),
])
def test_speculative_sampling_has_plain_samplings_distribution(tiny, branches, sampling):
    """The first three tokens' joint distribution (27 cells) over 1,500 seeds against the
    exact distribution of plain sampling. Tokens 2 and 3 come from draft depths 1 and 2:
    acceptances, rejections with residual draws, and multi-candidate roots."""
    model, prompt, runs = tiny.model, [320, 458, 425], 1500
    expected = exact_joint(model, prompt, sampling, 8, 3)
    observed = {}
    params = SpeculativeParams(1, 8, 3, branches)
    for seed in range(runs):
        seeded = SamplingParams(**{**sampling.__dict__, "seed": seed})
        out = speculative_generate(model, GenerationRequest(prompt, 4, sampling=seeded,
                                                            ignore_eos=True), params)
        key = tuple(out.tokens[:3])
        observed[key] = observed.get(key, 0) + 1
    ok, stat, critical = chi_square_ok(observed, expected, runs)
    assert ok, f"chi-square {stat:.1f} >= {critical:.1f}"
