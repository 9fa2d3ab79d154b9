"""Greedy speculation equals plain generation with each penalty on its own: a penalty
the speculative path forgets (say, treating repetition_penalty alone as "no penalty")
shows up only when it is the only one set."""
import numpy as np
import pytest

from tinyloop.engine.generate import GenerationRequest, generate, speculative_generate
from tinyloop.engine.sampling import SamplingParams
from tinyloop.engine.speculative import SpeculativeParams


# Plain greedy tokens by (model, prompt, penalty), computed once in this process: the two modes
# share each penalty's plain run, and all ten cases the unpenalized one. Reuse cannot hide a
# difference: spec is compared with a plain run of the same inputs whichever test made it. (The
# key holds the model itself, hashed by identity, so the entry lives as long as the model.)
_plain_runs: dict = {}


def plain_tokens(model, prompt: list[int], penalty: dict) -> list[int]:
    key = (model, tuple(prompt), tuple(sorted(penalty.items())))
    if key not in _plain_runs:
        sampling = SamplingParams(temperature=0.0, **penalty)
        _plain_runs[key] = generate(model, GenerationRequest(prompt, 40, loops=6, sampling=sampling)).tokens
    return _plain_runs[key]


@pytest.mark.exactness
@pytest.mark.parametrize("penalty", [{"repetition_penalty": 1.3}, {"repetition_penalty": 0.7},
                                     {"presence_penalty": 1.5}, {"frequency_penalty": 1.2},
                                     {"frequency_penalty": -0.8}])
@pytest.mark.parametrize("mode, branches", [("speculative", 1), ("tree_speculative", 4)])
def test_greedy_speculation_with_one_penalty_equals_plain_generation(tiny, penalty, mode, branches):
    sampling = SamplingParams(temperature=0.0, **penalty)
    differs_from_unpenalized = 0
    for seed in range(12):
        prompt = [int(t) for t in np.random.default_rng(seed).integers(0, 512, 12)]
        plain = plain_tokens(tiny.model, prompt, penalty)
        spec = speculative_generate(tiny.model, GenerationRequest(prompt, 40, sampling=sampling),
                                    SpeculativeParams(2, 6, 5, branches), mode=mode)
        assert spec.tokens == plain, (penalty, mode, seed)
        differs_from_unpenalized += plain_tokens(tiny.model, prompt, {}) != plain
    # the penalty must change the output, or this test could not see it ignored
    assert differs_from_unpenalized >= 2, (penalty, differs_from_unpenalized)
