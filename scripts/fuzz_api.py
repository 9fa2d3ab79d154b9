"""Schema-driven fuzzing of every route, from the server's own /openapi.json.

    python scripts/fuzz_api.py                       # 10,000 requests against a fresh Granian server
    python scripts/fuzz_api.py --requests 1000 --seed 7

Starts a real Granian process on a small random model (tiny-looped, 64-token context, so
a generation is short), loads the document it serves with schemathesis, and sends
requests drawn by Hypothesis from each operation's schema: schema-valid ones (positive)
and schema-violating ones (negative), spread over every route, until the count is
reached. Every response is checked:

- no 5xx, ever;
- every 4xx is the OpenAI error shape {"error": {message, type, param, code}} with a
  non-empty message, and a 400/422 names the offending field in `param` unless the body
  as a whole was wrong (invalid_json, unsupported_media_type, body_too_large); on the
  Anthropic Messages routes it is Anthropic's {"type": "error", "error": {type, message}}
  instead (no `param` there: the message names the field);
- schemathesis's conformance checks: the status code and content type are ones the
  document declares, JSON bodies match the declared response schemas, and a request
  that violates the schema is rejected with a 4xx. (A schema-valid request may still
  get a 400 the document cannot express, e.g. verify_loops above the model's max_loops
  or a prompt longer than the context: those must then name their field, as above);
- a 200 stream is well-formed server-sent events ending in [DONE] (on /v1/responses and
  /v1/messages: typed `event:`/`data:` pairs ending with the API's final event);

and afterwards the server must be healthy, its admission counters back to zero
(admitted = settled, nothing running or waiting) and a greedy generation must still
equal the reference answered before fuzzing. Exit status 0 when all of this holds;
failures are listed with a curl line to reproduce each.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from live_server import LiveServer, summed  # noqa: E402

from asgi.openapi import openapi_document  # noqa: E402

# A 400/422 whose code says the body as a whole was wrong need not name a field.
WHOLE_BODY_CODES = {"invalid_json", "unsupported_media_type", "body_too_large", "invalid_type"}
ANTHROPIC_ROUTES = {"/v1/messages", "/v1/messages/count_tokens"}
ANTHROPIC_ERROR_TYPES = {"invalid_request_error", "authentication_error", "not_found_error", "request_too_large",
                         "rate_limit_error", "api_error", "overloaded_error"}
# Typed event streams (no [DONE]) and the events that may end them.
TYPED_STREAM_ENDS = {"/v1/responses": {"response.completed", "response.incomplete", "response.failed"},
                     "/v1/messages": {"message_stop", "error"}}
GREEDY_PROBE = {"prompt": "The looped transformer", "max_tokens": 24, "temperature": 0}


@dataclass
class Report:
    requests: int = 0
    by_status: Counter = field(default_factory=Counter)
    by_route: Counter = field(default_factory=Counter)
    failures: dict = field(default_factory=dict)       # (check, route, detail) -> curl line

    def fail(self, check: str, route: str, detail: str, curl: str) -> None:
        self.failures.setdefault((check, route, detail[:400]), curl[:1000])


@lru_cache(maxsize=None)
def _validator(path: str):
    from jsonschema import Draft202012Validator
    schema = openapi_document()["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return Draft202012Validator(schema)


def body_is_valid(operation, body) -> bool:
    """Whether a JSON body conforms to the route's declared request schema. (Our own check
    for "a schema-violating request must be refused": schemathesis's counts only 400, 401,
    403-406, 409, 415, 422, 428 and 429 as refusals, not 413 for a body over the size limit.)"""
    return _validator(operation.path).is_valid(body)


def content_type(response) -> str:
    value = response.headers.get("content-type") or ""
    return value[0] if isinstance(value, list) else value      # schemathesis keeps header lists


def check_error_shape(response, report: Report, route: str, curl: str) -> None:
    try:
        body = response.json()
    except ValueError:
        report.fail("4xx body is not JSON", route, response.text[:120], curl)
        return
    if route.split(" ", 1)[1] in ANTHROPIC_ROUTES:
        check_anthropic_error_shape(body, report, route, curl)
        return
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or set(error) != {"message", "type", "param", "code"}:
        report.fail("4xx not in the OpenAI error shape", route, str(body)[:120], curl)
        return
    if not isinstance(error["message"], str) or not error["message"].strip():
        report.fail("4xx without a message", route, str(body)[:120], curl)
    if response.status_code in (400, 422) and error["param"] is None and error["code"] not in WHOLE_BODY_CODES:
        report.fail("400/422 does not name the field (param is null)", route, error["message"], curl)


def check_anthropic_error_shape(body, report: Report, route: str, curl: str) -> None:
    error = body.get("error") if isinstance(body, dict) else None
    if body.get("type") != "error" or not isinstance(error, dict) or set(error) != {"type", "message"} \
            or error["type"] not in ANTHROPIC_ERROR_TYPES:
        report.fail("4xx not in the Anthropic error shape", route, str(body)[:120], curl)
    elif not isinstance(error["message"], str) or not error["message"].strip():
        report.fail("4xx without a message", route, str(body)[:120], curl)


def check_typed_stream(text: str, ends: set, report: Report, route: str, curl: str) -> None:
    """`event: <type>` / `data: <json>` pairs, the type repeated in the payload, ending with one of `ends`."""
    name = None
    for block in [b for b in text.split("\n\n") if b]:
        lines = block.split("\n")
        if len(lines) != 2 or not lines[0].startswith("event: ") or not lines[1].startswith("data: "):
            report.fail("typed stream block is not an event and a data line", route, block[:120], curl)
            return
        name = lines[0][len("event: "):]
        try:
            payload = orjson.loads(lines[1][len("data: "):])
        except orjson.JSONDecodeError:
            report.fail("stream event is not JSON", route, block[:120], curl)
            return
        if not isinstance(payload, dict) or payload.get("type") != name:
            report.fail("typed stream event's type differs from its event line", route, block[:120], curl)
            return
    if name not in ends:
        report.fail("typed stream does not end with its final event", route, text[-120:], curl)


def check_stream(response, report: Report, route: str, curl: str) -> None:
    text = response.text
    if response.stream_cut_short:
        # schemathesis reads only the first events of a stream: send the same bytes again, read it all.
        sent = response.request
        text = httpx.request(sent.method, sent.url, headers=dict(sent.headers), content=sent.body, timeout=60).text
    path = route.split(" ", 1)[1]
    if path in TYPED_STREAM_ENDS:
        check_typed_stream(text, TYPED_STREAM_ENDS[path], report, route, curl)
        return
    blocks = [b for b in text.split("\n\n") if b]
    if not blocks or blocks[-1] != "data: [DONE]":
        report.fail("stream does not end with [DONE]", route, text[-120:], curl)
        return
    for block in blocks[:-1]:
        if not block.startswith("data: "):
            report.fail("stream block is not a data line", route, block[:120], curl)
            return
        try:
            orjson.loads(block[len("data: "):])
        except orjson.JSONDecodeError:
            report.fail("stream event is not JSON", route, block[:120], curl)
            return


def fuzz(server: LiveServer, requests: int, seed: int, progress=None) -> Report:
    """Send about `requests` generated requests to the server; return what was seen."""
    import hypothesis
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schemathesis.checks import negative_data_rejection, positive_data_acceptance
    from schemathesis.generation import GenerationMode

    schema = schemathesis.openapi.from_url(f"{server.base}/openapi.json", headers=server.auth)
    operations = [result.ok() for result in schema.get_all_operations()]
    # Generation routes carry the fields worth fuzzing; GET routes have few distinct requests.
    weights = {op: (8 if op.method.upper() == "POST" else 1) for op in operations}
    report = Report()
    session = __import__("requests").Session()
    round_index = 0
    while report.requests < requests:
        round_index += 1
        start_count = report.requests
        for op in operations:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                budget = max(1, (requests * weights[op]) // (2 * sum(weights.values())))
                budget = min(budget, requests - report.requests)
                if budget <= 0:
                    break
                route = f"{op.method.upper()} {op.path}"

                @settings(max_examples=budget, deadline=None, database=None, derandomize=False,
                          suppress_health_check=list(HealthCheck), phases=[hypothesis.Phase.generate])
                @hypothesis.seed(seed * 1000 + round_index * 10 + int(mode == GenerationMode.NEGATIVE))
                @given(op.as_strategy(generation_mode=mode))
                def one(case):
                    if report.requests >= requests:
                        return
                    try:
                        response = case.call(base_url=server.base, session=session, headers=server.auth,
                                             timeout=60)
                    except Exception as exc:       # noqa: BLE001 - a dropped connection is a finding
                        report.fail("no response", route, f"{type(exc).__name__}: {exc}", case.as_curl_command())
                        report.requests += 1
                        return
                    report.requests += 1
                    report.by_status[response.status_code] += 1
                    report.by_route[route] += 1
                    curl = case.as_curl_command(headers={"Authorization": "Bearer $KEY"})
                    status = response.status_code
                    if status >= 500:
                        report.fail(f"{status} response", route, response.text[:160], curl)
                    elif status >= 400:
                        check_error_shape(response, report, route, curl)
                    elif content_type(response).startswith("text/event-stream"):
                        check_stream(response, report, route, curl)
                    if status < 400 and isinstance(case.body, dict) and not body_is_valid(op, case.body):
                        report.fail("schema-violating body accepted", route, f"{status}: {response.text[:200]}",
                                    curl)
                    try:
                        case.validate_response(response, excluded_checks=[positive_data_acceptance,
                                                                          negative_data_rejection])
                    except (AssertionError, BaseExceptionGroup) as exc:   # schemathesis: a FailureGroup
                        for failure in getattr(exc, "exceptions", [exc]):
                            title = getattr(failure, "title", type(failure).__name__)
                            detail = " ".join(line.strip() for line in str(failure).splitlines()[1:8] if line.strip())
                            report.fail(f"schemathesis: {title}", route, detail, curl)
                    if progress and report.requests % 500 == 0:
                        progress(report)

                one()
        if report.requests == start_count:
            break                              # nothing more can be generated
    return report


def greedy_answer(server: LiveServer) -> list:
    response = httpx.post(f"{server.base}/generate", json=GREEDY_PROBE, headers=server.auth, timeout=60)
    response.raise_for_status()
    return response.json()["tokens"]


def after_checks(server: LiveServer, reference: list) -> list[str]:
    """What must hold once the fuzzing stops: problems found (empty when healthy)."""
    problems = []
    deadline = time.monotonic() + 30
    while True:
        values = server.metrics(timeout=10)
        idle = values.get("tinyloop_generations_running") == 0 and values.get("tinyloop_generations_waiting") == 0
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    if not idle:
        problems.append("the engine is not idle 30 s after the last request")
    admitted, settled = summed(values, "tinyloop_admitted_total"), summed(values, "tinyloop_settled_total")
    if admitted != settled:
        problems.append(f"admission slots leaked: {admitted:.0f} admitted, {settled:.0f} settled")
    health = server.health()
    if health is None or health[0] != 200 or health[1].get("status") != "ready":
        problems.append(f"/health is not ready: {health}")
    answer = greedy_answer(server)
    if answer != reference:
        problems.append(f"the greedy answer changed: {answer} != {reference}")
    if server.process.poll() is not None:
        problems.append(f"granian exited with {server.process.returncode}")
    return problems


def make_fuzz_model(directory: Path) -> Path:
    from tinyloop.model.testmodels import make_test_model
    path = directory / "fuzz-tiny.tinyloop"
    make_test_model(path, "tiny-looped", seed=0, max_seq_len=64)
    return path


def run(requests: int, seed: int, model: Path | None = None, quiet: bool = False) -> tuple[Report, list[str]]:
    with tempfile.TemporaryDirectory() as tmp:
        model = model or make_fuzz_model(Path(tmp))
        with LiveServer(model, key="fuzz-key", env={"TINYLOOP_MAX_WAITING": "2"}) as server:
            reference = greedy_answer(server)
            started = time.monotonic()

            def progress(report):
                if not quiet:
                    print(f"  {report.requests} requests, {time.monotonic() - started:.0f} s, "
                          f"statuses {dict(sorted(report.by_status.items()))}", file=sys.stderr)

            report = fuzz(server, requests, seed, progress)
            problems = after_checks(server, reference)
            exit_status = server.stop()
            if exit_status != 0:
                problems.append(f"granian exited with status {exit_status} on SIGTERM")
            log = server.log()
            if "Traceback" in log:
                problems.append("a traceback in the server log:\n" + log[log.index("Traceback"):][:2000])
    return report, problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000, help="requests to send (default 10000)")
    parser.add_argument("--seed", type=int, default=0, help="Hypothesis seed (default 0)")
    parser.add_argument("--model", type=Path, help="a .tinyloop file (default: a tiny random one, 64-token context)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    report, problems = run(args.requests, args.seed, args.model)
    print(f"{report.requests} requests in {time.monotonic() - started:.0f} s; "
          f"statuses {dict(sorted(report.by_status.items()))}")
    for route, count in sorted(report.by_route.items()):
        print(f"  {route}: {count}")
    for (check, route, detail), curl in sorted(report.failures.items()):
        print(f"FAIL {check} on {route}: {detail}\n     {curl}")
    for problem in problems:
        print(f"FAIL after fuzzing: {problem}")
    print("OK" if not report.failures and not problems else
          f"{len(report.failures)} distinct failure(s), {len(problems)} problem(s) after fuzzing")
    return 0 if not report.failures and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
