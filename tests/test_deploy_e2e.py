"""Replicas behind a real load balancer, end to end: Debian's nginx running
deploy/nginx/tinyloop.conf (only its addresses and log path changed) in front of three
`tinyloop serve` replicas of a tiny model, on loopback ports chosen at run time, all
started and stopped here.

A slot is held deterministically, not by timing luck: a held generation asks for ~8,000
tokens of a long-context tiny model (tens of seconds of work on this machine), and the
test ends it by closing its connection, which nginx passes on and the replica cancels.
Every wait has a timeout and fails saying what it waited for.

Marked `deploy` (not in the default run): .ci/run installs nginx and runs it. Without
nginx it skips, except in CI (CI=1/true), where a missing nginx is a failure.
Run: python -m pytest -m deploy tests/test_deploy_e2e.py -s   (-s prints the numbers)
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import openai
import pytest

from tinyloop.model.testmodels import make_test_model

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parent.parent
NGINX_CONF = ROOT / "deploy" / "nginx" / "tinyloop.conf"
KEY = "deploy-e2e-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
REPLICAS = 3
MAX_WAITING = 2
SLOTS = 1 + MAX_WAITING                       # per replica: one running (--max-running 1), MAX_WAITING waiting
DRAIN_TIMEOUT = 10.0                          # seconds a stopping replica lets admitted work run
CONTEXT = 8192
HOLD = {"prompt": "Hi", "max_tokens": 8000, "loops": 8, "stream": True}   # tens of seconds of work
STARTUP_TIMEOUT = 120
WAIT = 60                                     # any other wait
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def nginx_binary() -> str | None:
    found = shutil.which("nginx")
    if found:
        return found
    return next((path for path in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(path, os.X_OK)), None)


def wait_until(condition, what: str, timeout: float = WAIT, interval: float = 0.02):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except OSError:
        return True


# ----------------------------------------------------------------------------- the processes
@dataclass
class Replica:
    name: str
    port: int
    process: subprocess.Popen
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def metric(self, name: str) -> float:
        text = httpx.get(f"{self.url}/metrics", headers=AUTH, timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith((name + " ", name + "{")))

    def load(self) -> tuple[int, int]:
        """(running, waiting), read from the replica itself, not through nginx."""
        return (int(self.metric("tinyloop_generations_running")),
                int(self.metric("tinyloop_generations_waiting")))

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@dataclass
class Deployment:
    replicas: list[Replica]
    port: int                                  # nginx
    access_log: Path
    error_log: Path
    nginx: subprocess.Popen
    numbers: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.alive()]

    def by_address(self, address: str) -> Replica:
        return next(r for r in self.replicas if r.address == address)

    def wait_idle(self):
        for replica in self.live():
            wait_until(lambda replica=replica: replica.load() == (0, 0), f"{replica.name} to be idle")

    def log_entries(self) -> list[dict]:
        if not self.access_log.exists():
            return []
        return [json.loads(line) for line in self.access_log.read_text().splitlines() if line.strip()]

    def logged(self, since: int, request: str, count: int) -> list[dict]:
        """The `count` access log lines for `request` ("POST /path") after line `since`.
        nginx writes a line once it has finished the request, which can be just after the
        client has its answer: wait for them."""
        def found():
            entries = [e for e in self.log_entries()[since:] if e["request"] == request]
            return entries if len(entries) >= count else None
        entries = wait_until(found, f"{count} access log lines for {request}", 10)
        assert len(entries) == count, entries
        return entries


def render_nginx_conf(replica_ports: list[int], listen_port: int, access_log: Path) -> str:
    """deploy/nginx/tinyloop.conf with the test's replica addresses, port and log path; every
    other line as shipped."""
    text = NGINX_CONF.read_text()
    server_line = re.compile(r"^(\s*)server 127\.0\.0\.1:\d+( [^;]*)?;\n", re.MULTILINE)
    shipped = server_line.findall(text)
    assert shipped and len(set(shipped)) == 1, "the shipped upstream should list alike replicas"
    indent, parameters = shipped[0]
    ours = "".join(f"{indent}server 127.0.0.1:{port}{parameters};\n" for port in replica_ports)
    first = server_line.search(text)
    text = text[:first.start()] + ours + server_line.sub("", text[first.start():])
    text, listens = re.subn(r"^(\s*)listen 8000;", rf"\g<1>listen 127.0.0.1:{listen_port};", text, flags=re.MULTILINE)
    text, logs = re.subn(r"access_log /var/log/nginx/tinyloop\.access\.log ", f"access_log {access_log} ", text)
    assert listens == 1 and logs == 1, "deploy/nginx/tinyloop.conf changed shape: update render_nginx_conf"
    return text


def nginx_main_conf(directory: Path, include: Path) -> str:
    temp = "\n".join(f"    {name}_temp_path {directory / name};"
                     for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    # As root, nginx's workers would switch to the user "nobody" of group "nobody", which
    # Debian does not have (and which could not enter pytest's 0700 temporary folders).
    user = "user root;\n" if os.geteuid() == 0 else ""
    return (f"daemon off;\nworker_processes 1;\npid {directory / 'nginx.pid'};\n"
            f"error_log {directory / 'error.log'} notice;\n{user}"
            f"events {{ worker_connections 512; }}\n"
            f"http {{\n{temp}\n    include {include};\n}}\n")


def start_replica(name: str, model: Path, directory: Path) -> Replica:
    port = free_port()
    log = directory / f"{name}.log"
    env = {**os.environ, "TINYLOOP_API_KEY": KEY, "TINYLOOP_STATE_DIR": str(directory / "state"),
           "TINYLOOP_DRAIN_TIMEOUT": str(DRAIN_TIMEOUT), "OPENBLAS_NUM_THREADS": "1"}
    # The command a replica runs in production (deploy/systemd, deploy/kubernetes), in its own
    # process group so that the test can kill Granian's main process and its worker together.
    process = subprocess.Popen(
        [sys.executable, "-m", "tinyloop.cli", "serve", "--model", str(model), "--host", "127.0.0.1",
         "--port", str(port), "--max-running", "1", "--max-waiting", str(MAX_WAITING)],
        cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
    return Replica(name, port, process, log)


def stop(process: subprocess.Popen, grace: float = 30) -> None:
    if process.poll() is None:
        try:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)    # whatever is left of its group (Granian's worker)
    except ProcessLookupError:
        pass
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    nginx = nginx_binary()
    if nginx is None:
        if IN_CI:
            pytest.fail("nginx is not installed, and in CI this test must run: apt-get install -y nginx")
        pytest.skip("nginx is not installed (apt-get install nginx); CI installs it and runs this test")
    directory = tmp_path_factory.mktemp("deploy")
    model = directory / "tiny-long.tinyloop"
    make_test_model(model, "tiny-looped", seed=0, eos_token_ids=(), max_seq_len=CONTEXT)
    replicas, proxy = [], None
    try:
        for index in range(REPLICAS):
            replicas.append(start_replica("ABC"[index], model, directory))
        for replica in replicas:
            def ready(replica=replica):
                if not replica.alive():
                    raise AssertionError(f"replica {replica.name} exited:\n{replica.log_tail()}")
                try:
                    return httpx.get(f"{replica.url}/health", headers=AUTH, timeout=2).status_code == 200
                except httpx.HTTPError:
                    return False
            wait_until(ready, f"replica {replica.name} to answer /health 200", STARTUP_TIMEOUT, 0.1)

        port = free_port()
        access_log = directory / "access.log"
        include = directory / "tinyloop.conf"
        include.write_text(render_nginx_conf([r.port for r in replicas], port, access_log))
        main_conf = directory / "nginx.conf"
        main_conf.write_text(nginx_main_conf(directory, include))
        error_log = directory / "error.log"
        proxy = subprocess.Popen([nginx, "-p", str(directory), "-e", str(error_log), "-c", str(main_conf)],
                                 stdout=(directory / "nginx.out").open("w"), stderr=subprocess.STDOUT,
                                 start_new_session=True)

        def nginx_ready():
            if proxy.poll() is not None:
                raise AssertionError("nginx exited:\n" + (directory / "nginx.out").read_text()
                                     + (error_log.read_text() if error_log.exists() else ""))
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", headers=AUTH, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False
        wait_until(nginx_ready, "nginx to answer /health 200", WAIT, 0.1)
        deployment = Deployment(replicas, port, access_log, error_log, proxy)
        yield deployment
        if deployment.numbers:
            print("\n[deploy e2e] " + json.dumps(deployment.numbers, indent=1))
    finally:
        if proxy is not None:
            stop(proxy, grace=10)
        for replica in replicas:
            stop(replica.process)
        for replica in replicas:
            assert KEY not in replica.log.read_text(errors="replace"), "the API key appeared in a replica's log"


# ----------------------------------------------------------------------------- a raw stream
class Stream(threading.Thread):
    """One streaming request on its own socket, read on its own thread: when its response
    headers came (for a stream, that is admission), the time of each read and how many
    events it completed, the decoded body, and whether the body ended with its final
    chunk. `release()` closes the connection from the test's thread (the client leaving)."""

    def __init__(self, port: int, path: str, body: dict, timeout: float = 120):
        super().__init__(daemon=True)
        payload = json.dumps(body).encode()
        self.request = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {KEY}\r\n"
                        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
                        f"Connection: close\r\n\r\n").encode() + payload
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.settimeout(timeout)         # a read that hangs this long ends the stream, as a failure
        self.status: int | None = None
        self.headers: dict = {}
        self.headers_in = threading.Event()
        self.ended = threading.Event()
        self.sent_at = self.headers_at = self.ended_at = None
        self.reads: list[tuple[float, int]] = []      # (time, events completed by this read)
        self.body = b""
        self.complete = False                 # the final (zero-size) chunk arrived
        self.error: Exception | None = None
        self._raw = b""
        self._chunked = b""

    def run(self):
        try:
            self.sent_at = time.monotonic()
            self.sock.sendall(self.request)
            while not self.complete:
                data = self.sock.recv(65536)
                if not data:
                    break
                self._feed(data, time.monotonic())
        except OSError as exc:                # a reset, a timeout, or release()
            self.error = exc
        finally:
            self.ended_at = time.monotonic()
            self.headers_in.set()
            self.ended.set()
            self.sock.close()

    def _feed(self, data: bytes, now: float) -> None:
        if self.status is None:
            self._raw += data
            if b"\r\n\r\n" not in self._raw:
                return
            head, data = self._raw.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            self.status = int(lines[0].split()[1])
            self.headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
            self.headers_at = now
            self.headers_in.set()
        events_before = self.body.count(b"\n\n")
        if self.headers.get("transfer-encoding") == "chunked":
            self._chunked += data
            while True:
                line_end = self._chunked.find(b"\r\n")
                if line_end < 0:
                    break
                size = int(self._chunked[:line_end].split(b";")[0], 16)
                if len(self._chunked) < line_end + 2 + size + 2:
                    break
                if size == 0:
                    self.complete = True
                    break
                self.body += self._chunked[line_end + 2:line_end + 2 + size]
                self._chunked = self._chunked[line_end + 2 + size + 2:]
        else:
            self.body += data
            self.complete = len(self.body) >= int(self.headers.get("content-length", -1))
        events = self.body.count(b"\n\n") - events_before
        if events:
            self.reads.append((now, events))

    def release(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def events(self) -> list:
        out = []
        for block in self.body.split(b"\n\n")[:-1]:
            assert block.startswith(b"data: "), block
            data = block[len(b"data: "):]
            out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
        return out

    def tokens(self) -> int:
        return sum(1 for e in self.events() if isinstance(e, dict) and e.get("token_id", -1) >= 0)

    def wait_headers(self, what: str) -> int:
        assert self.headers_in.wait(WAIT), f"no response headers within {WAIT} s for {what}"
        return self.status

    def wait_end(self, what: str, timeout: float = WAIT) -> None:
        assert self.ended.wait(timeout), f"{what} did not end within {timeout:.0f} s"


def open_streams(port: int, count: int, body: dict, path: str = "/generate") -> list[Stream]:
    streams = [Stream(port, path, body) for _ in range(count)]
    for stream in streams:
        stream.start()
    return streams


def release(streams: list[Stream]) -> None:
    for stream in streams:
        stream.release()
    for stream in streams:
        stream.wait_end("a released stream", 10)


def post(url: str, path: str, body: dict, timeout: float = WAIT) -> httpx.Response:
    return httpx.post(f"{url}{path}", headers=AUTH, json=body, timeout=timeout)


# ----------------------------------------------------------------------------- the checks
def test_the_same_greedy_request_answers_identically_on_every_replica(deployment):
    deployment.wait_idle()
    request = {"model": "tiny", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 24,
               "temperature": 0}
    direct = [openai.OpenAI(base_url=f"{r.url}/v1", api_key=KEY, max_retries=0)
              .chat.completions.create(**request).choices[0].message.content for r in deployment.replicas]
    assert len(set(direct)) == 1, direct
    seen = len(deployment.log_entries())
    through = openai.OpenAI(base_url=f"{deployment.url}/v1", api_key=KEY, max_retries=0)
    answers = [through.chat.completions.create(**request).choices[0].message.content for _ in range(2 * REPLICAS)]
    assert answers == direct[:1] * (2 * REPLICAS)
    served = {e["upstream_addr"] for e in deployment.logged(seen, "POST /v1/chat/completions", 2 * REPLICAS)}
    assert served == {r.address for r in deployment.replicas}, served      # nginx spread them over all three


def test_the_kubernetes_readiness_probe_passes_on_a_ready_replica_and_only_there(deployment):
    import yaml
    manifest = [d for d in yaml.safe_load_all((ROOT / "deploy/kubernetes/tinyloop.yaml").read_text()) if d]
    (pod,) = [d["spec"]["template"]["spec"] for d in manifest if d["kind"] == "Deployment"]
    python, flag, source = pod["containers"][0]["readinessProbe"]["exec"]["command"]
    assert (python, flag) == ("python", "-c")
    replica = deployment.live()[0]

    def probe(port: int, key: str) -> int:
        on_port = source.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        assert on_port != source
        return subprocess.run([sys.executable, flag, on_port], env={**os.environ, "TINYLOOP_API_KEY": key},
                              capture_output=True, timeout=WAIT, check=False).returncode

    assert probe(replica.port, KEY) == 0
    assert probe(replica.port, "not-the-key") != 0              # 401: urllib raises on any non-2xx
    assert probe(free_port(), KEY) != 0                          # nothing listening


def test_streaming_through_nginx_arrives_token_by_token(deployment):
    deployment.wait_idle()
    stream = Stream(deployment.port, "/generate", {"prompt": "Hi", "max_tokens": 1500, "loops": 8, "stream": True})
    stream.start()
    stream.wait_end("the stream through nginx")
    assert stream.status == 200 and stream.complete and stream.error is None
    events = stream.events()
    assert events[-1] == "[DONE]" and stream.tokens() == 1500
    first, last = stream.reads[0][0], stream.reads[-1][0]
    duration = last - stream.sent_at
    per_read = sorted(count for _, count in stream.reads)
    median = per_read[len(per_read) // 2]
    deployment.numbers["stream"] = {"tokens": 1500, "first_event_s": round(first - stream.sent_at, 3),
                                    "last_event_s": round(duration, 3), "reads": len(stream.reads),
                                    "median_events_per_read": median}
    # Token by token: the first event long before the last, and events arrive a few at a time
    # (a buffering proxy hands them on a buffer at a time: about a hundred events each).
    assert first - stream.sent_at < 0.1 * duration, deployment.numbers["stream"]
    assert median <= 8 and len(stream.reads) >= 50, deployment.numbers["stream"]


def test_a_full_replica_s_429_sends_the_request_on_to_another_replica(deployment):
    deployment.wait_idle()
    full = deployment.live()[0]
    held = open_streams(full.port, SLOTS, HOLD)           # straight to it: it is known to be full
    try:
        assert [s.wait_headers("a held stream") for s in held] == [200] * SLOTS
        assert full.load() == (1, MAX_WAITING)
        seen = len(deployment.log_entries())
        for _ in range(2 * REPLICAS):
            response = post(deployment.url, "/generate", {"prompt": "Hi", "max_tokens": 4})
            assert response.status_code == 200 and len(response.json()["tokens"]) == 4
        entries = deployment.logged(seen, "POST /generate", 2 * REPLICAS)
    finally:
        release(held)
    offered_first = [e for e in entries if e["upstream_addr"].startswith(full.address + ", ")]
    assert offered_first, "nginx never offered a request to the full replica"
    assert all(e["upstream_status"] == "429, 200" for e in offered_first), offered_first
    assert all(e["upstream_addr"].split(", ")[-1] != full.address for e in entries)
    deployment.numbers["failover_on_429"] = {
        "requests": len(entries), "offered_to_the_full_replica_first": len(offered_first),
        "their_request_s": [e["request_time"] for e in offered_first],
        "the_others_request_s": [e["request_time"] for e in entries if e not in offered_first]}


def test_every_slot_is_admitted_across_replicas_and_only_then_nginx_answers_429(deployment):
    deployment.wait_idle()
    live = deployment.live()
    capacity = SLOTS * len(live)
    seen = len(deployment.log_entries())
    disconnects = sum(r.metric("tinyloop_client_disconnects_total") for r in live)
    held = open_streams(deployment.port, capacity, HOLD)
    try:
        statuses = [s.wait_headers("a held stream") for s in held]
        assert statuses == [200] * capacity, statuses          # all admitted: nobody saw a 429
        loads = {r.name: r.load() for r in live}
        assert all(load == (1, MAX_WAITING) for load in loads.values()), loads
        refused = [post(deployment.url, "/v1/chat/completions",
                        {"model": "tiny", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
                   for _ in range(REPLICAS)]
        assert [r.status_code for r in refused] == [429] * REPLICAS
        assert all(r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "queue_full" for r in refused)
        assert {r.name: r.load() for r in live} == loads       # the refused ones took no place anywhere
    finally:
        released_at = time.monotonic()
        release(held)
    # Each held generation is tens of seconds of work: idle this soon means that closing the
    # client's connection to nginx reached the replica, which cancelled it or dropped it
    # from its queue.
    for replica in live:
        wait_until(lambda replica=replica: replica.load() == (0, 0), f"{replica.name} to drop released work", 15)
    released_to_idle = time.monotonic() - released_at
    assert sum(r.metric("tinyloop_client_disconnects_total") for r in live) - disconnects == capacity
    admitted = deployment.logged(seen, "POST /generate", capacity)
    refusals = deployment.logged(seen, "POST /v1/chat/completions", REPLICAS)
    assert all(e["status"] == "200" for e in admitted) and all(e["status"] == "429" for e in refusals)
    for entry in refusals:                 # each was offered to every replica, which each said 429
        assert sorted(entry["upstream_addr"].split(", ")) == sorted(r.address for r in live), entry
        assert entry["upstream_status"] == ", ".join(["429"] * len(live)), entry
    deployment.numbers["admission"] = {
        "admitted_per_replica": {r.name: load[0] + load[1] for r, load in zip(live, loads.values())},
        "admitted_after_a_429_elsewhere": sum("429" in e["upstream_status"] for e in admitted),
        "refused_with_429_by_every_replica": len(refusals),
        "released_to_idle_s": round(released_to_idle, 3)}


def test_a_replica_killed_mid_stream_ends_that_stream_while_the_others_keep_serving(deployment):
    deployment.wait_idle()
    assert len(deployment.live()) >= 2, "needs two live replicas"
    streams = []
    for _ in range(len(deployment.live())):           # one each: nginx goes round the idle replicas
        stream = Stream(deployment.port, "/generate", {"prompt": "Hi", "max_tokens": 2500, "loops": 8,
                                                       "stream": True})
        stream.start()
        assert stream.wait_headers("a stream") == 200
        streams.append(stream)
    wait_until(lambda: all(s.tokens() >= 20 for s in streams), "every stream to be under way")
    victim = next(r for r in deployment.live() if r.load()[0] == 1)
    on_victim = sum(victim.load())
    tokens_at_kill = [s.tokens() for s in streams]
    killed_at = time.monotonic()
    os.killpg(victim.process.pid, signal.SIGKILL)        # Granian's main process and worker, at once
    victim.process.wait(timeout=WAIT)

    wait_until(lambda: any(s.ended.is_set() for s in streams), "the killed replica's stream to end", 10)
    for stream in streams:
        stream.wait_end("a stream", WAIT * 2)
    cut = [s for s in streams if not s.complete]
    kept = [s for s in streams if s.complete]
    assert len(cut) == on_victim >= 1
    for stream in cut:                      # ended promptly, visibly unfinished, nothing made up
        assert stream.ended_at - killed_at < 5
        assert "[DONE]" not in stream.events() and not any("finish_reason" in e for e in stream.events())
    for stream, before in zip(streams, tokens_at_kill):
        if stream in kept:                  # the other replicas went on and finished properly
            assert stream.events()[-1] == "[DONE]" and stream.tokens() == 2500 > before

    # New requests: nginx tries the dead replica's port in its turn, is refused, moves on.
    seen = len(deployment.log_entries())
    latencies = []
    for _ in range(2 * REPLICAS):
        started = time.monotonic()
        response = post(deployment.url, "/v1/completions", {"model": "tiny", "prompt": "Hi", "max_tokens": 4})
        latencies.append(time.monotonic() - started)
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4
    entries = deployment.logged(seen, "POST /v1/completions", 2 * REPLICAS)
    failed_over = [e for e in entries if e["upstream_addr"].startswith(victim.address + ", ")]
    assert failed_over, "no request was first offered to the dead replica"
    assert all(e["upstream_status"] == "502, 200" for e in failed_over), failed_over
    assert all(victim.address != e["upstream_addr"].split(", ")[-1] for e in entries)
    deployment.numbers["kill"] = {
        "victim": victim.name, "streams_on_victim": on_victim,
        "cut_stream_ended_after_kill_s": round(max(s.ended_at for s in cut) - killed_at, 3),
        "other_streams_finished": len(kept),
        "requests_failed_over": len(failed_over),
        "refused_connect_s": [e["upstream_connect_time"].split(", ")[0] for e in failed_over],
        "failed_over_request_s": [e["request_time"] for e in failed_over],
        "direct_request_s": [e["request_time"] for e in entries if e not in failed_over],
        "client_latency_s": [round(x, 4) for x in latencies]}


def test_a_stopping_replica_finishes_or_stops_its_work_and_gets_no_new_work(deployment):
    deployment.wait_idle()
    live = deployment.live()
    assert len(live) >= 2, "needs two live replicas"
    draining, others = live[0], live[1:]
    # Its work, sent to it directly so that it is known to be there: a running stream and a
    # waiting request that finish well within the drain, then a stream too long to finish.
    running = Stream(draining.port, "/generate", {"prompt": "Hi", "max_tokens": 1000, "loops": 8, "stream": True})
    running.start()
    assert running.wait_headers("the running stream") == 200
    waiting_result = {}
    waiting = threading.Thread(target=lambda: waiting_result.update(
        response=post(draining.url, "/generate", {"prompt": "Hi", "max_tokens": 100})), daemon=True)
    waiting.start()
    wait_until(lambda: draining.load()[1] == 1, "the second request to wait")
    too_long = Stream(draining.port, "/generate", HOLD)
    too_long.start()
    assert too_long.wait_headers("the long stream") == 200
    assert draining.load()[1] == 2

    stopped_at = time.monotonic()
    draining.process.send_signal(signal.SIGTERM)       # what systemd and Kubernetes send
    wait_until(lambda: refuses_connections(draining.port), "the stopping replica to close its port", 10)
    closed_after = time.monotonic() - stopped_at
    seen = len(deployment.log_entries())
    for _ in range(2 * REPLICAS):
        response = post(deployment.url, "/v1/completions", {"model": "tiny", "prompt": "Hi", "max_tokens": 4})
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4
    entries = deployment.logged(seen, "POST /v1/completions", 2 * REPLICAS)
    assert all(e["upstream_addr"].split(", ")[-1] in {r.address for r in others} for e in entries), entries
    offered = [e for e in entries if draining.address in e["upstream_addr"]]
    assert all(e["upstream_status"].startswith("502, ") for e in offered), offered    # refused, not sent

    running.wait_end("the running stream")
    assert running.complete and running.events()[-1] == "[DONE]" and running.tokens() == 1000
    waiting.join(WAIT)
    assert not waiting.is_alive(), f"the waiting request was not answered within {WAIT} s"
    assert waiting_result["response"].status_code == 200
    assert len(waiting_result["response"].json()["tokens"]) == 100
    too_long.wait_end("the stream the drain had to stop", DRAIN_TIMEOUT + WAIT)
    last = too_long.events()
    assert too_long.complete and last[-1] == "[DONE]", last[-2:]
    assert isinstance(last[-2], dict) and last[-2].get("error", {}).get("code") == "shutting_down", (
        f"the drain did not stop the long stream with a shutting_down error event: {last[-2]}")
    assert 0 < too_long.tokens() < HOLD["max_tokens"]
    stopped_after = too_long.ended_at - stopped_at
    assert DRAIN_TIMEOUT - 0.5 < stopped_after < DRAIN_TIMEOUT + 30, stopped_after
    assert draining.process.wait(timeout=WAIT) == 0
    exited_after = time.monotonic() - stopped_at
    deployment.numbers["drain"] = {
        "replica": draining.name, "port_closed_after_s": round(closed_after, 3),
        "new_requests_during_drain": len(entries), "offered_to_it_and_refused": len(offered),
        "finished_within_drain": 2, "running_stream_done_after_s": round(running.ended_at - stopped_at, 3),
        "stopped_at_timeout_after_s": round(stopped_after, 3), "tokens_before_stop": too_long.tokens(),
        "process_exited_after_s": round(exited_after, 3)}
