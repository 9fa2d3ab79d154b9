"""Schema-driven fuzzing (scripts/fuzz_api.py, reduced to 1,000 requests) against a real
Granian process, and the failures it found, kept as regression tests."""
import sys
from pathlib import Path

import jsonschema
import pytest
from asgi_client import call, run
from test_server_asgi import ready_app

from asgi.openapi import openapi_document

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
import fuzz_api  # noqa: E402


# ~40 s: in the -m slow run (CI runs both, and scripts/fuzz_api.py --requests 10000 besides)
@pytest.mark.slow
def test_a_thousand_generated_requests_find_nothing():
    report, problems = fuzz_api.run(1000, seed=0, quiet=True)
    assert report.requests >= 1000
    assert {s for s in report.by_status if s >= 500} == set(), report.by_status
    assert report.failures == {}, "\n".join(f"{k}: {v}" for k, v in report.failures.items())
    assert problems == []
    fuzzed = {route.split(" ", 1)[1] for route in report.by_route}
    assert fuzzed >= set(openapi_document()["paths"]) - {"/openapi.json"}   # schemathesis skips its source
    assert report.by_status[200] > 0 and report.by_status[400] > 0 and report.by_status[422] > 0


# --------------------------------------------------------------- regressions found by fuzzing
def request_schema(path: str) -> dict:
    return openapi_document()["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from tinyloop.model.testmodels import make_test_model
    path = tmp_path_factory.mktemp("fuzzreg") / "tiny.tinyloop"
    make_test_model(path, "tiny-looped", seed=0, max_seq_len=64)
    return ready_app(path)


def test_an_empty_stop_array_is_valid_in_the_document_and_on_the_server(app):
    """Found: `stop: []` matched both the string-array and the id-array branch of a oneOf,
    so the document called it invalid while the server (rightly) accepted it."""
    body = {"prompt": "\u00b0", "stop": []}
    jsonschema.validate(body, request_schema("/generate"))
    assert run(call(app, "POST", "/generate", body)).status == 200


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": None,
                              "stop": None, "seed": None, "stream_options": None, "temperature": None}),
    ("/api/v0/completions", {"model": "m", "prompt": "x", "mode": None, "draft_loops": None, "top_k": None}),
    ("/generate/tree_speculative", {"prompt": "x", "K_branches": None, "stop": None, "max_tokens": None}),
])
def test_null_optional_fields_are_valid_in_the_document_and_on_the_server(app, path, body):
    """Found: the server reads null as "absent" (OpenAI clients send nulls) but the
    document declared plain types, so conforming clients were told nulls were invalid."""
    jsonschema.validate(body, request_schema(path))
    assert run(call(app, "POST", path, body)).status == 200


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"model": "m", "prompt": ""}),
    ("/generate", {"prompt": ""}),
    ("/generate", {"prompt": []}),
])
def test_an_empty_prompt_is_invalid_in_the_document_and_a_400_naming_it(app, path, body):
    """Found: the document allowed an empty prompt that the server refuses."""
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(body, request_schema(path))
    refused = run(call(app, "POST", path, body))
    assert refused.status == 400 and refused.json()["error"]["param"] == "prompt"


def test_an_empty_text_prompt_is_a_400_also_for_a_model_with_a_bos_token(tmp_path):
    """The BOS token alone made an empty prompt look non-empty, so the same request was a
    400 on one model and a generation on another; the document says minLength 1 for all."""
    from tinyloop.model.testmodels import make_test_model
    path = tmp_path / "bos.tinyloop"
    make_test_model(path, "tiny-looped", seed=0, max_seq_len=64, bos_token_id=1)
    app = ready_app(path)
    for route, body in (("/generate", {"prompt": ""}), ("/api/v0/completions", {"model": "m", "prompt": ""})):
        refused = run(call(app, "POST", route, body))
        assert refused.status == 400 and refused.json()["error"]["param"] == "prompt"
    assert run(call(app, "POST", "/generate", {"prompt": "a", "max_tokens": 2})).status == 200


def test_streams_are_declared_as_events_and_errors_require_every_field():
    """Found: the document declared a stream as one string (schemathesis reads it as events),
    and its error schema required nothing."""
    post = openapi_document()["paths"]["/generate"]["post"]["responses"]
    event = post["200"]["content"]["text/event-stream"]["schema"]
    jsonschema.validate({"data": '{"token_id": 1, "text": "a"}'}, event)
    error = post["400"]["content"]["application/json"]["schema"]
    jsonschema.validate({"error": {"message": "m", "type": "t", "param": None, "code": None}}, error)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"error": {"message": "m"}}, error)


def test_the_fuzzers_typed_stream_check_takes_whole_streams_and_refuses_cut_ones(app):
    """scripts/fuzz_api.py checks /v1/responses and /v1/messages streams (typed events, no
    [DONE]) by their final event; few generated bodies stream, so the check is tested here."""
    for path, body in (("/v1/messages", {"model": "m", "max_tokens": 3, "stream": True,
                                         "messages": [{"role": "user", "content": "x"}]}),
                       ("/v1/responses", {"input": "x", "max_output_tokens": 3, "stream": True})):
        text = run(call(app, "POST", path, body)).body.decode()
        ends = fuzz_api.TYPED_STREAM_ENDS[path]
        whole, cut = fuzz_api.Report(), fuzz_api.Report()
        fuzz_api.check_typed_stream(text, ends, whole, path, "curl")
        fuzz_api.check_typed_stream(text[:text.rindex("event: ")], ends, cut, path, "curl")
        assert whole.failures == {} and len(cut.failures) == 1, (path, whole.failures)
