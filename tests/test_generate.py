import threading

import pytest

from tinyloop.engine.generate import GenerationRequest, generate
from tinyloop.engine.sampling import SamplingParams
from tinyloop.errors import RequestError
from tinyloop.model.loader import load_model
from tinyloop.model.testmodels import make_test_model

PROMPT = [320, 458, 425, 290, 332]


def greedy(model, max_tokens=12, **kw):
    return generate(model, GenerationRequest(PROMPT, max_tokens=max_tokens, **kw))


def test_length_finish_and_counts(tiny):
    result = greedy(tiny.model, max_tokens=7)
    assert result.finish_reason == "length"
    assert len(result.tokens) == result.completion_tokens == 7
    assert result.prompt_tokens == len(PROMPT)
    assert result.loops == tiny.config.default_loops
    assert result.wall_s > 0 and result.tokens_per_second > 0
    assert 0 < result.time_to_first_token_s <= result.wall_s


def test_stop_token_ends_output_before_it(tiny):
    reference = greedy(tiny.model).tokens
    stop = reference[5]
    cut = reference.index(stop)
    result = greedy(tiny.model, stop_token_ids=(stop,))
    assert result.finish_reason == "stop"
    assert result.tokens == reference[:cut]
    assert result.stop_token_id == stop
    assert result.completion_tokens == cut + 1


def test_model_eos_stops_unless_ignored(tiny, tmp_path):
    reference = greedy(tiny.model).tokens
    eos = reference[3]
    path = tmp_path / "eos.tinyloop"
    make_test_model(path, "tiny-looped", seed=0, eos_token_ids=(eos,))
    model = load_model(path).model
    result = greedy(model)
    assert result.finish_reason == "stop" and result.tokens == reference[:reference.index(eos)]
    assert greedy(model, ignore_eos=True).tokens == reference


def test_cancel_flag_stops_within_one_step(tiny):
    cancel = threading.Event()
    seen = []

    def on_token(token, text):
        seen.append(token)
        if len(seen) == 3:
            cancel.set()

    result = generate(tiny.model, GenerationRequest(PROMPT, max_tokens=50), on_token=on_token, cancel=cancel)
    assert result.finish_reason == "cancelled"
    assert result.tokens == seen and len(seen) == 3


def test_cancel_before_start_runs_nothing(tiny):
    result = generate(tiny.model, GenerationRequest(PROMPT, max_tokens=5), cancel=lambda: True)
    assert result.finish_reason == "cancelled" and result.tokens == [] and result.completion_tokens == 0


def test_seeded_sampling_is_reproducible(tiny):
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=11)
    a = greedy(tiny.model, max_tokens=20, sampling=params).tokens
    b = greedy(tiny.model, max_tokens=20, sampling=params).tokens
    c = greedy(tiny.model, max_tokens=20, sampling=SamplingParams(temperature=1.0, seed=12)).tokens
    assert a == b and a != c


def test_context_overflow_is_rejected_with_the_numbers(tiny):
    with pytest.raises(RequestError) as err:
        generate(tiny.model, GenerationRequest(PROMPT, max_tokens=510))
    assert "prompt (5 tokens) + max_tokens (510) = 515 exceeds the model's context of 512 tokens" \
        in str(err.value)
    assert err.value.param == "max_tokens"


@pytest.mark.parametrize("request_kw, message", [
    (dict(prompt_ids=[]), "at least one token"),
    (dict(prompt_ids=[1, 99999]), "outside the vocabulary"),
    (dict(prompt_ids=[1], max_tokens=0), "max_tokens must be an integer >= 1"),
    (dict(prompt_ids=[1], stop_token_ids=(-1,)), r"stop token id -1 is outside the vocabulary \[0, 512\)"),
])
def test_bad_requests_are_refused(tiny, request_kw, message):
    with pytest.raises(RequestError, match=message):
        generate(tiny.model, GenerationRequest(**request_kw))
