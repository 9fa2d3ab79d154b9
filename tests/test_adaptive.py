"""Adaptive depth per token (loops "auto"): the exit rules against their reference
definitions, the KV of skipped iterations, validation, and the HTTP fields."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from asgi_client import call, run
from test_server_asgi import ready_app

from tinyloop.convert.from_hf import convert_hf
from tinyloop.engine.adaptive import AdaptiveDecoder, loops_summary
from tinyloop.engine.decode import prefill, run_alone
from tinyloop.engine.generate import GenerationRequest, generate
from tinyloop.engine.sampling import Sampler, SamplingParams
from tinyloop.engine.speculative import SpeculativeParams
from tinyloop.errors import RequestError
from tinyloop.model.loader import load_model

DATA = Path(__file__).parent / "data" / "hf"


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    folder = tmp_path_factory.mktemp("adaptive")
    out = {}
    for layout in ("ouro", "huginn"):
        out[layout] = folder / f"{layout}.tinyloop"
        convert_hf(DATA / layout, out[layout], progress=False)
    return out


def decoder_after(model, prompt, threshold, max_tokens=4):
    """An adaptive decoder whose cache holds `prompt` prefilled at full depth."""
    request = GenerationRequest(list(prompt), max_tokens, loops="auto", exit_threshold=threshold)
    decoder = AdaptiveDecoder(model, request, model.config.default_loops,
                              Sampler(SamplingParams(), model.config.vocab_size, list(prompt)), None)
    prefill(model, list(prompt), decoder.cache, decoder.depth)
    return decoder


def decode_one(decoder, token, position):
    """One adaptive step on this thread (the decoder yields its forwards) -> (logits, iterations run)."""
    return run_alone(decoder.model, decoder.decode(token, position))


def ouro_exit_steps(lambdas: np.ndarray, threshold: float) -> np.ndarray:
    """Ouro's rule, written from its definition: pdf_i = lambda_i prod_{j<i}(1 - lambda_j), the
    last step takes the rest; exit at the first step whose CDF reaches the threshold. -> 1-based."""
    steps = lambdas.shape[1]
    survive = np.cumprod(np.concatenate([np.ones((lambdas.shape[0], 1)), 1 - lambdas[:, :-1]], axis=1), axis=1)
    pdf = lambdas * survive
    pdf[:, -1] = survive[:, -1]
    reached = np.cumsum(pdf, axis=1) >= threshold
    return np.where(reached.any(axis=1), reached.argmax(axis=1), steps - 1) + 1


@pytest.mark.parametrize("threshold", [0.2, 0.5, 0.8, 0.95])
def test_ouro_gate_exits_where_the_reference_does(paths, threshold):
    """Each prompt position decoded adaptively after a full-depth prefill of what precedes
    it exits at the step the reference's gate values give, with the reference's logits at
    that step (exit_at_step in Ouro's code)."""
    model = load_model(paths["ouro"], "cpu", kv_mode="fp32").model
    data = np.load(DATA / "ouro" / "golden.npz")
    prompt = [int(t) for t in data["prompt"]]
    expected = ouro_exit_steps(data["exit_lambda"], threshold)
    assert len(set(expected[1:])) > 1 or threshold == 0.95        # the thresholds really split the tokens
    for position in range(1, len(prompt)):
        decoder = decoder_after(model, prompt[:position], threshold)
        logits, used = decode_one(decoder, prompt[position], position)
        assert used == expected[position], (position, threshold)
        reference = data["logits"][used - 1][position]
        assert np.abs(model.backend.to_host(logits)[0] - reference).max() <= 1e-4


def token_logits_after_full_prefix(model, prompt, iterations):
    """Logits of prompt[-1] after `iterations` core iterations, the prefix (cores and coda)
    at full depth, as Huginn's adaptive generation computes them: (V,) float64."""
    depth = model.config.default_loops
    cache = model.new_cache(len(prompt), depth)
    model.forward(prompt[:-1], np.arange(len(prompt) - 1), cache, depth, exact=False)
    position = len(prompt) - 1
    plan = model.plan(np.array([position]), position, cache)
    trunk = model.trunk(prompt[-1:], plan, cache, iterations)
    hidden = model.coda(trunk.hidden, plan, cache, model.coda_base(depth))
    return model.backend.to_host(model.head(hidden))[0].astype(np.float64)


def test_kl_rule_exits_at_the_first_small_divergence(paths):
    """Huginn (no gate): iterate until KL(p_{n-1} || p_n) < threshold, p_0 uniform (its
    KLExitEvaluator); the divergences are computed here from each depth's logits."""
    model = load_model(paths["huginn"], "cpu", kv_mode="fp32").model
    prompt = [int(t) for t in np.load(DATA / "huginn" / "golden.npz")["prompt"]]
    depth = model.config.default_loops
    rows = [token_logits_after_full_prefix(model, prompt, n) for n in range(1, depth + 1)]
    log_p = [row - row.max() - np.log(np.exp(row - row.max()).sum()) for row in rows]
    previous = [np.full_like(log_p[0], -np.log(log_p[0].size))] + log_p[:-1]
    kl = [float(np.sum(np.exp(p) * (p - q))) for p, q in zip(previous, log_p)]
    seen = set()
    for threshold in np.geomspace(min(kl) / 2, max(kl) * 2, 80):
        expected = next((n + 1 for n, value in enumerate(kl) if value < threshold), depth)
        decoder = decoder_after(model, prompt[:-1], threshold)
        logits, used = decode_one(decoder, prompt[-1], len(prompt) - 1)
        assert used == expected, (threshold, kl)
        assert np.abs(model.backend.to_host(logits)[0] - rows[used - 1]).max() <= 1e-4
        seen.add(used)
    assert len(seen) > 1


def test_a_cumulative_probability_equal_to_the_threshold_exits(paths):
    """Ouro's rule is CDF >= threshold: a threshold of exactly lambda_1 exits after one loop."""
    model = load_model(paths["ouro"], "cpu", kv_mode="fp32").model
    prompt = [int(t) for t in np.load(DATA / "ouro" / "golden.npz")["prompt"]]
    probe = decoder_after(model, prompt[:4], 1.0)
    plan = model.plan(np.array([4]), 4, probe.cache)
    lam = float(model.exit_lambda(model.trunk(prompt[4:5], plan, probe.cache, 1).hidden)[0])
    _, used = decode_one(decoder_after(model, prompt[:4], lam), prompt[4], 4)
    assert used == 1
    _, used = decode_one(decoder_after(model, prompt[:4], np.nextafter(lam, 1.0)), prompt[4], 4)
    assert used > 1


def test_skipped_iterations_hold_the_last_computed_kv(paths):
    model = load_model(paths["ouro"], "cpu", kv_mode="fp32").model
    prompt = [int(t) for t in np.load(DATA / "ouro" / "golden.npz")["prompt"]]
    decoder = decoder_after(model, prompt[:3], 0.2)
    _, used = decode_one(decoder, prompt[3], 3)
    assert used < model.config.default_loops
    stored = model.backend.kv_stored(decoder.cache.storage, np.array([3]))
    for name, array in stored.items():                     # (slots, n_kv, 1, ...)
        for layer in range(model.config.n_core):
            last = array[model.core_slot(used - 1, layer)]
            for iteration in range(used, model.config.default_loops):
                assert np.array_equal(array[model.core_slot(iteration, layer)], last), (name, iteration)
            if used > 1:
                assert not np.array_equal(array[model.core_slot(used - 2, layer)], last)


def test_lower_gate_thresholds_mean_fewer_loops(paths):
    model = load_model(paths["ouro"], "cpu").model
    means = []
    for threshold in (1.0, 0.9, 0.5, 0.1):
        result = generate(model, GenerationRequest([5, 17, 40, 99, 3], 30, loops="auto",
                                                   exit_threshold=threshold, ignore_eos=True))
        assert len(result.loops_used) == result.completion_tokens and result.loops == 4
        means.append(np.mean(result.loops_used))
    assert means[0] == 4.0 and means == sorted(means, reverse=True) and means[-1] < 2


def test_full_threshold_is_plain_generation(paths):
    """Ouro's shipped threshold 1.0 never exits early: identical to loops = 4."""
    model = load_model(paths["ouro"], "cpu").model
    prompt = [7, 8, 9, 10]
    auto = generate(model, GenerationRequest(prompt, 20, loops="auto", exit_threshold=1.0))
    assert auto.tokens == generate(model, GenerationRequest(prompt, 20, loops=4)).tokens


@pytest.mark.parametrize("layout, request_kwargs, message", [
    ("ouro", dict(loops="auto", exit_threshold=1.5), "cumulative exit probability"),
    ("huginn", dict(loops="auto", exit_threshold=-1.0), "KL divergence"),
    ("huginn", dict(loops=2, exit_threshold=0.1), "applies to loops"),
    ("huginn", dict(loops="auto", mode="speculative", speculative=SpeculativeParams(1, 4, 2)), "verify_loops"),
])
def test_bad_adaptive_requests(paths, layout, request_kwargs, message):
    model = load_model(paths[layout], "cpu").model
    with pytest.raises(RequestError, match=message):
        generate(model, GenerationRequest([1, 2, 3], 4, **request_kwargs))


def test_loops_summary():
    assert loops_summary([4, 1, 2, 4]) == {"mean": 2.75, "histogram": {"1": 1, "2": 1, "4": 2}}


# --------------------------------------------------------------------------------- HTTP
@pytest.fixture(scope="module")
def app(paths):
    return ready_app(paths["ouro"])


def post(app, path, body):
    return run(call(app, "POST", path, body))


def test_models_say_what_auto_does(app):
    loops = run(call(app, "GET", "/api/v0/models")).json()["data"][0]["loops"]
    assert loops == {"default": 4, "min": 1, "max": 4, "auto": {"criterion": "exit_gate", "exit_threshold": 1.0}}


def test_http_auto_loops_report_mean_and_histogram(app):
    body = {"prompt": "hello", "max_tokens": 12, "temperature": 0, "loops": "auto", "exit_threshold": 0.5}
    response = post(app, "/api/v0/completions", {"model": "m", **body})
    assert response.status == 200, response.body
    used = response.json()["stats"]["loops_used"]
    assert sum(used["histogram"].values()) == response.json()["usage"]["completion_tokens"]
    assert 1 <= used["mean"] <= 4
    native = post(app, "/generate", body)
    assert native.status == 200 and native.json()["stats"]["loops_used"] == used
    plain = post(app, "/v1/completions", {"model": "m", "prompt": "hello", "max_tokens": 4, "loops": "auto"})
    assert plain.status == 200


def loops_histogram(app) -> dict:
    """/metrics' tinyloop_adaptive_loops_per_token samples: {"le=1": n, ..., "sum": s, "count": c}."""
    text = run(call(app, "GET", "/metrics")).body.decode()
    samples = {}
    for line in text.splitlines():
        if line.startswith("tinyloop_adaptive_loops_per_token_"):
            key, value = line.rsplit(" ", 1)
            key = key.removeprefix("tinyloop_adaptive_loops_per_token_")
            samples[key.replace('bucket{le="', "le=").rstrip('"}')] = float(value)
    return samples


def test_metrics_count_the_loops_of_every_auto_token(app):
    """The Prometheus histogram grows by exactly the request's own loops_used histogram."""
    before = loops_histogram(app)
    body = {"model": "m", "prompt": "hello again", "max_tokens": 10, "temperature": 0, "loops": "auto",
            "exit_threshold": 0.6}
    response = post(app, "/api/v0/completions", body)
    assert response.status == 200, response.body
    used = {int(depth): n for depth, n in response.json()["stats"]["loops_used"]["histogram"].items()}
    after = loops_histogram(app)
    delta = {key: after[key] - before[key] for key in after}
    assert delta["count"] == sum(used.values()) == response.json()["usage"]["completion_tokens"]
    assert delta["sum"] == sum(depth * n for depth, n in used.items())
    for bound in (1, 2, 3, 4, 6, 64):
        assert delta[f"le={bound}"] == sum(n for depth, n in used.items() if depth <= bound), bound
    assert delta["le=+Inf"] == delta["count"]
    # fixed-depth generations add nothing
    fixed = {key: value for key, value in body.items() if key != "exit_threshold"}
    assert post(app, "/api/v0/completions", {**fixed, "loops": 2}).status == 200
    assert loops_histogram(app) == after


def test_metrics_histogram_text():
    from types import SimpleNamespace

    from asgi.metrics import Metrics
    metrics = Metrics()
    job = dict(prompt_tokens=3, completion_tokens=4, mode="plain", finish_reason="length", speculative=None,
               queue_s=0.0)
    metrics.on_job_done(SimpleNamespace(**job, loops_used=[4, 1, 2, 4, 40]))
    metrics.on_job_done(SimpleNamespace(**job, loops_used=None))
    lines = set(metrics.render(0, 0).splitlines())
    name = "tinyloop_adaptive_loops_per_token"
    buckets = {"1": 1, "2": 2, "3": 2, "4": 4, "6": 4, "32": 4, "48": 5, "64": 5, "+Inf": 5}
    for le, count in buckets.items():
        assert f'{name}_bucket{{le="{le}"}} {count}' in lines, le
    assert {f"{name}_sum 51", f"{name}_count 5", f"# TYPE {name} histogram"} <= lines


@pytest.mark.parametrize("path, body, status, param", [
    ("/api/v0/completions", {"loops": "deep"}, 422, "loops"),
    ("/api/v0/completions", {"loops": 0}, 400, "loops"),
    ("/api/v0/completions", {"loops": 5}, 400, "loops"),
    ("/api/v0/completions", {"loops": "auto", "exit_threshold": 2}, 400, "exit_threshold"),
    ("/api/v0/completions", {"loops": 3, "exit_threshold": 0.5}, 400, "exit_threshold"),
    ("/v1/completions", {"loops": "auto", "exit_threshold": 0.5}, 400, "exit_threshold"),
    ("/generate/speculative", {"exit_threshold": 0.5}, 400, "exit_threshold"),
])
def test_http_bad_depth_fields(app, path, body, status, param):
    full = {"prompt": "hello", "max_tokens": 4, **body}
    if path.startswith("/api") or path.startswith("/v1"):
        full["model"] = "m"
    response = post(app, path, full)
    assert response.status == status, response.body
    assert response.json()["error"]["param"] == param
