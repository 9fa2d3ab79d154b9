"""Grammar-constrained decoding (llguidance), logprobs, logit_bias, min_p in the engine.

Oracles: output validity by the independent `jsonschema` validator; exactness as token
equality between modes; logprobs against a plain NumPy log-softmax of the model's own
logits; min_p against its definition written out here.
"""
import jsonschema
import numpy as np
import orjson
import pytest

from tinyloop.engine.generate import GenerationRequest, generate, speculative_generate
from tinyloop.engine.sampling import Sampler, SamplingParams
from tinyloop.engine.speculative import SpeculativeParams
from tinyloop.errors import RequestError
from tinyloop.grammar.compile import Grammar, json_object_grammar, json_schema_grammar
from tinyloop.model.loader import load_model
from tinyloop.model.testmodels import make_test_model


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    path = tmp_path_factory.mktemp("grammar") / "tiny.tinyloop"
    make_test_model(path, "tiny-looped", seed=3)
    return load_model(path)


def random_schema(rng, depth=0):
    """Objects, arrays, enums, anyOf, bounded numbers, patterned strings."""
    kinds = ["integer", "number", "string", "pattern", "enum", "boolean"] + (["object", "array", "anyOf"]
                                                                               if depth < 2 else [])
    kind = kinds[int(rng.integers(len(kinds)))]
    if kind == "integer":
        low = int(rng.integers(-50, 50))
        return {"type": "integer", "minimum": low, "maximum": low + int(rng.integers(0, 100))}
    if kind == "number":
        return {"type": "number", "minimum": -1.5, "maximum": 2.5}
    if kind == "string":
        return {"type": "string", "maxLength": int(rng.integers(1, 12))}
    if kind == "pattern":
        return {"type": "string", "pattern": "^[a-c]{1,4}-[0-9]{2}$"}
    if kind == "enum":
        return {"enum": ["red", "green", 3, None][: int(rng.integers(1, 5))]}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1), "minItems": 1,
                "maxItems": int(rng.integers(1, 4))}
    if kind == "anyOf":
        return {"anyOf": [random_schema(rng, depth + 1) for _ in range(int(rng.integers(2, 4)))]}
    names = [f"k{i}" for i in range(int(rng.integers(1, 4)))]
    return {"type": "object", "properties": {n: random_schema(rng, depth + 1) for n in names},
            "required": names, "description": "annotations are accepted"}


def schema_grammar(loaded, schema):
    return Grammar(json_schema_grammar(schema, "response_format"), loaded.tokenizer,
                   loaded.config.eos_token_ids, "response_format")


@pytest.mark.exactness
def test_constrained_speculative_equals_constrained_plain(loaded):
    """60 random (schema, prompt, draft/verify, draft_ahead, K) cases: token for token."""
    model, rng = loaded.model, np.random.default_rng(5)
    for case in range(60):
        schema = {"type": "object", "properties": {"a": random_schema(rng), "b": random_schema(rng)},
                  "required": ["a", "b"]}
        grammar = schema_grammar(loaded, schema)
        prompt = [int(t) for t in rng.integers(0, model.config.vocab_size, int(rng.integers(1, 30)))]
        verify = int(rng.integers(2, model.config.max_loops + 1))
        ahead = int(rng.integers(1, 9))
        params = SpeculativeParams(int(rng.integers(1, verify)), verify, ahead, int(rng.integers(1, 64 // ahead + 1)))
        plain = generate(model, GenerationRequest(prompt, 60, loops=verify, grammar=grammar))
        for branches in sorted({1, min(params.branches, 16)}):
            p = SpeculativeParams(params.draft_loops, verify, ahead, branches)
            spec = speculative_generate(model, GenerationRequest(prompt, 60, grammar=grammar), p)
            assert spec.tokens == plain.tokens, (case, p)
            assert spec.finish_reason == plain.finish_reason


def test_constrained_output_validates_against_its_schema(loaded):
    """Greedy and sampled, plain and speculative: a finished output is valid JSON for its schema."""
    model, tokenizer, rng = loaded.model, loaded.tokenizer, np.random.default_rng(9)
    finished = 0
    for case in range(30):
        schema = random_schema(rng) if case % 3 else {"type": "object", "properties": {"x": random_schema(rng)},
                                                      "required": ["x"]}
        grammar = schema_grammar(loaded, schema)
        sampling = SamplingParams(temperature=float(rng.choice([0.0, 0.8, 1.5])), seed=case, min_p=0.05)
        request = GenerationRequest(tokenizer.encode(f"case {case}"), 120, loops=4, grammar=grammar, sampling=sampling)
        out = generate(model, request, tokenizer=tokenizer) if case % 2 else \
            speculative_generate(model, request, SpeculativeParams(2, 4, 3, 1 if sampling.greedy else 2),
                                 tokenizer=tokenizer)
        if out.finish_reason == "stop":
            finished += 1
            jsonschema.validate(orjson.loads(out.text), schema)
    assert finished >= 15, f"only {finished} of 30 constrained outputs finished within 120 tokens"


def test_json_object_mode_gives_an_object(loaded):
    grammar = Grammar(json_object_grammar(), loaded.tokenizer, loaded.config.eos_token_ids, "response_format")
    for seed in range(4):
        out = generate(loaded.model, GenerationRequest(loaded.tokenizer.encode("data"), 200, grammar=grammar,
                                                       sampling=SamplingParams(temperature=1.0, seed=seed)),
                       tokenizer=loaded.tokenizer)
        text = out.text
        if out.finish_reason == "stop":
            assert isinstance(orjson.loads(text), dict)
        else:
            assert text.startswith("{")


@pytest.mark.parametrize("schema, fragment", [
    ({"type": "object", "colour": "red"}, "unsupported JSON schema keyword 'colour'"),
    ({"type": "array", "uniqueItems": True}, "uniqueItems"),
    ({"type": "string", "format": "nonsense"}, "Unknown format"),
    ({"anyOf": [{"type": "integer"}] * 17}, "at most 16"),
])
def test_unsupported_schemas_are_refused(loaded, schema, fragment):
    with pytest.raises(RequestError, match=fragment):
        schema_grammar(loaded, schema)


def test_logprobs_are_the_model_distribution(loaded):
    """Greedy logprobs: log-softmax of the model's logits at each step (tolerance: the
    oracle re-runs the prefix through the bulk path), the top list best first and holding
    the chosen token; plain == speculative exactly."""
    model, tokenizer = loaded.model, loaded.tokenizer
    prompt = tokenizer.encode("the cat sat")
    out = generate(model, GenerationRequest(prompt, 8, loops=3, top_logprobs=5, ignore_eos=True))
    spec = speculative_generate(model, GenerationRequest(prompt, 8, top_logprobs=5, ignore_eos=True),
                                SpeculativeParams(1, 3, 3, 2))
    assert spec.tokens == out.tokens and spec.logprobs == out.logprobs
    for step, entry in enumerate(out.logprobs):
        ids = prompt + out.tokens[:step]
        cache = model.new_cache(len(ids), 3)
        from tinyloop.engine.decode import prefill
        logits = model.backend.to_host(prefill(model, ids, cache, 3))[0].astype(np.float64)
        reference = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
        assert entry.token == out.tokens[step] and entry.top[0][0] == entry.token
        assert abs(entry.logprob - reference[entry.token]) < 1e-3
        best = np.argsort(-reference)[:5]
        assert [t for t, _ in entry.top] == [int(b) for b in best]
        assert sum(np.exp(lp) for _, lp in entry.top) <= 1 + 1e-9


def test_logit_bias_forces_and_bans(loaded):
    model, prompt = loaded.model, loaded.tokenizer.encode("hello")
    base = generate(model, GenerationRequest(prompt, 6, ignore_eos=True))
    forced = generate(model, GenerationRequest(prompt, 6, ignore_eos=True,
                                               sampling=SamplingParams(logit_bias=((7, 100.0),))))
    assert forced.tokens == [7] * 6
    banned = generate(model, GenerationRequest(prompt, 6, ignore_eos=True,
                                               sampling=SamplingParams(logit_bias=((base.tokens[0], -100.0),))))
    assert banned.tokens[0] != base.tokens[0]


def test_min_p_keeps_tokens_near_the_best():
    logits = np.log(np.array([0.5, 0.3, 0.1, 0.06, 0.04]))
    probs = Sampler(SamplingParams(temperature=1.0, min_p=0.2), 5).probabilities(logits)
    kept = np.array([0.5, 0.3, 0.1]) / 0.9                     # p >= 0.2 * 0.5
    assert np.allclose(probs, np.concatenate([kept, [0, 0]]))


def test_thinking_grammar_thinks_then_answers_in_schema(loaded):
    """A thinking template's grammar: an optional <think>...</think> section, then the
    schema. Whatever the sampled path, the part after the section validates."""
    from tinyloop.grammar.compile import lark_grammar, schema_lark, with_thinking
    from tinyloop.text.thinking import split_thinking

    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"]}
    tags = ("<think>", "</think>")
    grammar = Grammar(lark_grammar(with_thinking(schema_lark(schema, "response_format"), tags)), loaded.tokenizer,
                      loaded.config.eos_token_ids, "response_format")
    thought = 0
    for seed in range(12):
        bias = ((loaded.tokenizer.encode("<")[0], 100.0),) if seed % 2 else ()   # odd seeds: think
        out = generate(loaded.model, GenerationRequest(loaded.tokenizer.encode("q"), 150, grammar=grammar,
                                                       sampling=SamplingParams(temperature=1.0, seed=seed,
                                                                               logit_bias=bias)),
                       tokenizer=loaded.tokenizer)
        thought += out.text.startswith("<think>")
        if out.finish_reason == "stop":
            reasoning, content = split_thinking(out.text, *tags)
            jsonschema.validate(orjson.loads(content), schema)
    assert thought, "no sampled reply took the thinking branch"
    encode = loaded.tokenizer.encode
    for text, whole in [('<think>\nhm\n</think>\n\n{"n": 3}', True), ('{"n": 3}', True),
                        ('<think>x</think>{"n": 10}', False), ('<think>x</think><think>{"n": 1}', False)]:
        matcher = grammar.start()
        ids = encode(text)
        accepted = matcher.matcher.validate_tokens(ids) == len(ids) and matcher.matcher.consume_tokens(ids) \
            and matcher.complete
        assert accepted == whole, text


def test_logprobs_follow_temperature_bias_and_grammar_not_truncation():
    """log_softmax((logits + bias) / T) with refused tokens at -inf, top-p ignored."""
    logits = np.array([2.0, 1.0, 0.5, -1.0, 0.0])
    params = SamplingParams(temperature=0.5, top_p=0.5, logit_bias=((4, 1.5),), seed=1)

    class RefuseToken2:
        def apply(self, scores):
            scores[2] = -np.inf

    sampler = Sampler(params, 5, constraint=RefuseToken2(), top_logprobs=3)
    token, entry = sampler.sample_with_logprobs(logits)
    shaped = np.array([2.0, 1.0, -np.inf, -1.0, 1.5]) / 0.5
    finite = shaped[np.isfinite(shaped)]
    expected = shaped - (finite.max() + np.log(np.exp(finite - finite.max()).sum()))
    assert token == 0                         # top_p 0.5 keeps only the best token
    assert entry.logprob == pytest.approx(expected[0], abs=1e-12)
    assert [t for t, _ in entry.top] == [0, 4, 1]
    assert [lp for _, lp in entry.top] == pytest.approx([expected[0], expected[4], expected[1]], abs=1e-12)


def test_a_grammar_in_its_error_state_ends_the_request_not_the_engine(loaded):
    """A token the matcher refuses (forced here by hand) puts llguidance in its error state:
    a RequestError (a 4xx for the client), never an exception that fails the engine."""
    constraint = schema_grammar(loaded, {"type": "object"}).start()
    refused = loaded.tokenizer.encode("x")[0]          # an object cannot start with "x"
    with pytest.raises(RequestError, match="constrained decoding stopped"):
        constraint.advance(refused)
    with pytest.raises(RequestError, match="constrained decoding stopped"):
        constraint.allowed()


def test_adaptive_depth_keeps_the_grammar_and_the_logprobs(loaded):
    """loops "auto" (engine/adaptive.py) samples through the same path as plain decoding: a
    constrained answer stays valid JSON for its schema, and every token has its logprobs."""
    model, tokenizer = loaded.model, loaded.tokenizer
    schema = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"enum": ["x", "y"]}},
              "required": ["n", "s"]}
    out = generate(model, GenerationRequest(tokenizer.encode("answer"), 80, loops="auto", exit_threshold=0.5,
                                            grammar=schema_grammar(loaded, schema), top_logprobs=3),
                   tokenizer=tokenizer)
    assert out.finish_reason == "stop" and out.loops_used
    jsonschema.validate(orjson.loads(out.text), schema)
    assert out.logprobs is not None and [e.token for e in out.logprobs] == out.tokens[:len(out.logprobs)]
    assert len(out.logprobs) >= len(out.tokens)
