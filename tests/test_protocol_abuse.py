"""Raw-protocol abuse of a real Granian process (tests/protocol_abuse.py; the full counts
run with scripts/abuse_protocol.py, with more slow connections): slowloris headers and bodies, bodies that stop
mid-JSON, chunked bodies over the size limit, invalid UTF-8 in paths and headers, many
connections opened and dropped, pipelining, half-closed clients. Afterwards the server
must be healthy, every admitted generation settled (no leaked slot), nothing running or
waiting, and the engine must give the same greedy answer as before."""
import protocol_abuse as abuse
import pytest
from live_server import LiveServer

from tinyloop.model.testmodels import make_test_model

BODY_LIMIT = 4096


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("abuse") / "tiny.tinyloop"
    make_test_model(path, "tiny-looped", seed=0, eos_token_ids=(), max_seq_len=256)
    with LiveServer(path, env={"TINYLOOP_MAX_BODY_BYTES": str(BODY_LIMIT), "TINYLOOP_MAX_WAITING": "2"}) as live:
        live.reference = abuse.reference_answer(live)
        yield live


@pytest.fixture
def healthy_after(server):
    yield
    assert abuse.after_abuse(server, server.reference) == []


def test_slowloris_connections_do_not_block_others(server, healthy_after):
    seen = abuse.slowloris(server, connections=50)
    assert seen == {"status_while_stalled": 200, "tokens": server.reference}


def test_a_body_that_stops_mid_json_is_a_400_or_a_dropped_request(server, healthy_after):
    assert abuse.body_stops_mid_json(server) == {"status": 400, "code": "invalid_json"}


def test_a_chunked_body_over_the_limit_is_a_413(server, healthy_after):
    seen = abuse.chunked_over_limit(server, BODY_LIMIT)
    assert (seen["status"], seen["code"]) == (413, "body_too_large")


def test_invalid_utf8_in_paths_and_headers_is_a_4xx(server, healthy_after):
    statuses = abuse.invalid_utf8(server)
    assert statuses["auth_value"] == 401 and statuses["header_value"] == 200
    for name in ("path", "generate_path"):
        assert statuses[name] is None or 400 <= statuses[name] < 500, statuses   # 404, or refused by Granian


def test_the_responses_and_messages_routes_under_abuse(server, healthy_after):
    assert abuse.agent_routes(server) == {
        "/v1/responses": (400, "invalid_json", "invalid_request_error"),
        "/v1/messages": (400, "error", "invalid_request_error"),        # Anthropic's shape: {"type": "error", ...}
        "/v1/responses stream start": "HTTP/1.1 200 OK",
        "/v1/messages stream start": "HTTP/1.1 200 OK",
        "pipelined": (200, True, "message")}


def test_many_connections_opened_and_dropped(server, healthy_after):
    abuse.open_and_drop(server, connections=1000)


def test_pipelined_requests_are_answered_in_order(server, healthy_after):
    assert abuse.pipelining(server) == [200, 200, 200, server.reference]


def test_a_request_after_the_client_half_closes(server, healthy_after):
    # Granian reads the half-close as the client leaving: the request is cancelled like any
    # disconnect (nothing answered, nothing leaked; healthy_after checks the slot came back).
    assert abuse.half_close(server) == {"answered": False, "status": None}


def test_held_connections_show_in_the_fd_count_and_are_released(server, healthy_after):
    """/metrics' process_open_fds (what scripts/soak.py watches for leaks) counts the
    worker's sockets: 40 held connections add at least 40; dropped, they are given back."""
    import time
    before = abuse.metrics(server)["process_open_fds"]
    held = [abuse.connect(server) for _ in range(40)]
    for sock in held:
        sock.sendall(b"GET /health HTTP/1.1\r\n")          # half a request: the server holds the socket
    time.sleep(0.5)
    during = abuse.metrics(server)["process_open_fds"]
    for sock in held:
        sock.close()
    deadline = time.monotonic() + 30
    while abuse.metrics(server)["process_open_fds"] > before + 2:
        assert time.monotonic() < deadline, "the dropped connections' descriptors were not released"
        time.sleep(0.1)
    assert during >= before + 40
