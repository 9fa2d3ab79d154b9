"""Raw-socket abuse of a live server, shared by tests/test_protocol_abuse.py (reduced
counts) and scripts/abuse_protocol.py (the full counts). Each attack returns what it saw;
`after_abuse` checks the server is healthy, no admission slot leaked and the engine
still gives the reference answer."""
from __future__ import annotations

import socket
import time

import httpx
import orjson
from live_server import summed

GREEDY_PROBE = {"prompt": "The looped transformer", "max_tokens": 16, "temperature": 0}


def connect(server, timeout: float = 30) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def head(server, method: str, path: bytes, length: int | None = None, extra: bytes = b"") -> bytes:
    lines = [method.encode() + b" " + path + b" HTTP/1.1", b"Host: 127.0.0.1",
             f"Authorization: Bearer {server.key}".encode(), b"Content-Type: application/json"]
    if length is not None:
        lines.append(f"Content-Length: {length}".encode())
    return b"\r\n".join(lines) + b"\r\n" + extra + b"\r\n"


def read_responses(sock: socket.socket, count: int = 1, timeout: float = 30) -> list[tuple[int, dict, bytes]]:
    """Read `count` HTTP/1.1 responses (Content-Length or chunked bodies) from the socket."""
    sock.settimeout(timeout)
    buffer, out = b"", []
    while len(out) < count:
        while b"\r\n\r\n" not in buffer:
            data = sock.recv(65536)
            if not data:
                return out
            buffer += data
        header_block, buffer = buffer.split(b"\r\n\r\n", 1)
        status_line, *header_lines = header_block.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in header_lines)}
        if "content-length" in headers:
            size = int(headers["content-length"])
            while len(buffer) < size:
                data = sock.recv(65536)
                if not data:
                    break
                buffer += data
            body, buffer = buffer[:size], buffer[size:]
        else:                                                    # chunked
            body = b""
            while True:
                while b"\r\n" not in buffer:
                    buffer += sock.recv(65536)
                size_line, buffer = buffer.split(b"\r\n", 1)
                size = int(size_line.split(b";")[0], 16)
                while len(buffer) < size + 2:
                    buffer += sock.recv(65536)
                body, buffer = body + buffer[:size], buffer[size + 2:]
                if size == 0:
                    break
        out.append((int(status_line.split()[1]), headers, body))
    return out


def error_code(body: bytes) -> str | None:
    error = orjson.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    return error["code"]


# ------------------------------------------------------------------------------ attacks
def slowloris(server, connections: int) -> dict:
    """Connections that send half a header block, or headers and part of a body, and
    stall; meanwhile a normal request must be answered. Then they all drop."""
    stalled = []
    for index in range(connections):
        sock = connect(server)
        if index % 2:
            sock.sendall(b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty")
        else:
            sock.sendall(head(server, "POST", b"/generate", length=200) + b'{"prompt": "Hel')
        stalled.append(sock)
    answer = httpx.post(f"{server.base}/generate", json=GREEDY_PROBE, headers=server.auth, timeout=60)
    for sock in stalled:
        sock.close()
    return {"status_while_stalled": answer.status_code, "tokens": answer.json().get("tokens")}


def body_stops_mid_json(server) -> dict:
    """A body whose JSON ends early (length honest): 400 invalid_json. A body shorter than
    its Content-Length, then the client leaves: nothing to answer, nothing queued."""
    sock = connect(server)
    body = b'{"prompt": "Hello", "max_tokens": 4, "stre'
    sock.sendall(head(server, "POST", b"/generate", length=len(body)) + body)
    ((status, _, answer),) = read_responses(sock)
    sock.close()
    sock = connect(server)
    sock.sendall(head(server, "POST", b"/generate", length=500) + b'{"prompt": "Hello", "max_tok')
    time.sleep(0.2)
    sock.close()
    return {"status": status, "code": error_code(answer)}


def chunked_over_limit(server, limit: int) -> dict:
    """A chunked body (no Content-Length) that grows past TINYLOOP_MAX_BODY_BYTES: 413."""
    sock = connect(server)
    sock.sendall(head(server, "POST", b"/generate", extra=b"Transfer-Encoding: chunked\r\n"))
    chunk = b'{"prompt": "' + b"x" * 1000
    sent = 0
    try:
        while sent <= limit * 2:
            sock.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            sent += len(chunk)
        sock.sendall(b"0\r\n\r\n")
    except OSError:
        pass                                   # the server may close once it has answered 413
    ((status, _, answer),) = read_responses(sock)
    sock.close()
    return {"status": status, "code": error_code(answer), "sent": sent}


def invalid_utf8(server) -> dict:
    """Bytes that are not UTF-8 in the path and in header values."""
    statuses = {}
    for name, request in {
        "path": head(server, "GET", b"/v1/mod\xff\xfeels"),
        "generate_path": head(server, "POST", b"/gener\xc3\x28ate", length=2) + b"{}",
        "header_value": head(server, "GET", b"/v1/models", extra=b"X-Odd: \xff\xfe\xfd\r\n"),
        "auth_value": (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer \xff\xfe\r\n\r\n"),
    }.items():
        sock = connect(server)
        sock.sendall(request)
        responses = read_responses(sock)
        sock.close()
        statuses[name] = responses[0][0] if responses else None
    return statuses


def open_and_drop(server, connections: int) -> dict:
    """Many connections at once, each with a request started or not, all dropped."""
    sockets = []
    for index in range(connections):
        sock = connect(server)
        if index % 3 == 1:
            sock.sendall(head(server, "POST", b"/generate", length=len(orjson.dumps(GREEDY_PROBE)))
                         + orjson.dumps(GREEDY_PROBE))
        elif index % 3 == 2:
            sock.sendall(b"GET /health HTTP/1.1\r\n")
        sockets.append(sock)
    for sock in sockets:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
        sock.close()
    return {"opened": connections}


def wait_idle(server, timeout: float = 30) -> None:
    """Until nothing runs or waits in the engine (an earlier probe's generation, cancelled by
    its client, may still be ending): a probe that needs the admission slot waits for it
    instead of assuming it is free."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        values = metrics(server)
        if values["tinyloop_generations_running"] == 0 and values["tinyloop_generations_waiting"] == 0:
            return
        time.sleep(0.05)


def pipelining(server) -> list:
    """Three requests in one write; three responses back, in order: their statuses, then the
    generation's tokens (or, if it was refused, its error body, so the caller sees why)."""
    wait_idle(server)
    body = orjson.dumps(GREEDY_PROBE)
    sock = connect(server)
    sock.sendall(head(server, "GET", b"/health") + head(server, "POST", b"/generate", length=len(body)) + body
                 + head(server, "GET", b"/v1/models"))
    responses = read_responses(sock, 3, timeout=60)
    sock.close()
    answer = orjson.loads(responses[1][2]) if len(responses) > 1 else {}
    return [status for status, _, _ in responses] + [answer.get("tokens", answer)]


def half_close(server) -> dict:
    """The client sends a whole request, then shuts down its sending side."""
    body = orjson.dumps(GREEDY_PROBE)
    sock = connect(server)
    sock.sendall(head(server, "POST", b"/generate", length=len(body)) + body)
    sock.shutdown(socket.SHUT_WR)
    responses = read_responses(sock, timeout=60)
    sock.close()
    return {"answered": bool(responses), "status": responses[0][0] if responses else None}


def agent_routes(server) -> dict:
    """The Responses and Messages routes under the same abuse: a body that stops mid-JSON
    (a 400 in each route's own error shape), a stream the client resets after its first
    events (cancelled, its slot given back: after_abuse checks), and count_tokens then a
    message pipelined in one write (answered in order)."""
    seen = {}
    for path, body in ((b"/v1/responses", b'{"input": "Hello", "max_output'),
                       (b"/v1/messages", b'{"model": "m", "max_tokens": 4, "messa')):
        sock = connect(server)
        sock.sendall(head(server, "POST", path, length=len(body)) + body)
        ((status, _, answer),) = read_responses(sock)
        sock.close()
        error = orjson.loads(answer)
        seen[path.decode()] = (status, error.get("type") or error["error"]["code"], error["error"]["type"])
    streams = {b"/v1/responses": {"input": "Hello", "stream": True, "max_output_tokens": 200},
               b"/v1/messages": {"model": "m", "max_tokens": 200, "stream": True,
                                 "messages": [{"role": "user", "content": "Hello"}]}}
    for path, request in streams.items():
        body = orjson.dumps(request)
        sock = connect(server)
        sock.sendall(head(server, "POST", path, length=len(body)) + body)
        seen[path.decode() + " stream start"] = sock.recv(65536).split(b"\r\n", 1)[0].decode()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
        sock.close()
    count = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "Hello"}]})
    message = orjson.dumps({"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "Hello"}]})
    sock = connect(server)
    sock.sendall(head(server, "POST", b"/v1/messages/count_tokens", length=len(count)) + count
                 + head(server, "POST", b"/v1/messages", length=len(message)) + message)
    first, second = read_responses(sock, 2, timeout=60)
    sock.close()
    seen["pipelined"] = (first[0], orjson.loads(first[2])["input_tokens"] == orjson.loads(second[2])["usage"][
        "input_tokens"], orjson.loads(second[2])["type"])
    return seen


# ------------------------------------------------------------------------------ afterwards
def metrics(server) -> dict:
    return server.metrics(timeout=10)


def after_abuse(server, reference: list, timeout: float = 30) -> list[str]:
    """Problems left after the attacks (empty: healthy, nothing leaked, same answer)."""
    deadline = time.monotonic() + timeout
    while True:
        values = metrics(server)
        idle = values["tinyloop_generations_running"] == 0 and values["tinyloop_generations_waiting"] == 0
        settled = summed(values, "tinyloop_settled_total") == values["tinyloop_admitted_total"]
        if (idle and settled) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    problems = []
    if not idle:
        problems.append(f"engine not idle: {values['tinyloop_generations_running']:.0f} running, "
                        f"{values['tinyloop_generations_waiting']:.0f} waiting")
    if not settled:
        problems.append(f"admission slots leaked: admitted {values['tinyloop_admitted_total']:.0f}, settled "
                        f"{summed(values, 'tinyloop_settled_total'):.0f}")
    health = server.health()
    if health is None or health[0] != 200:
        problems.append(f"/health: {health}")
    answer = httpx.post(f"{server.base}/generate", json=GREEDY_PROBE, headers=server.auth, timeout=60)
    if answer.status_code != 200 or answer.json()["tokens"] != reference:
        problems.append(f"the engine's answer changed: {answer.status_code} {answer.text[:200]}")
    if server.process.poll() is not None:
        problems.append(f"granian exited with {server.process.returncode}")
    return problems


def reference_answer(server) -> list:
    answer = httpx.post(f"{server.base}/generate", json=GREEDY_PROBE, headers=server.auth, timeout=60)
    answer.raise_for_status()
    return answer.json()["tokens"]
