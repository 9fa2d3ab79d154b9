"""A small HTTP/1.1 load generator on asyncio streams, for loopback benchmarks.

Keep-alive connections, a bounded number of requests, per-request latency; bodies by
Content-Length or chunked transfer encoding; server-sent events counted as they arrive.
Deliberately minimal, so the client spends as little of the machine as it can: on a
small machine the client shares the CPUs with the server it measures.
"""
from __future__ import annotations

import asyncio
import json
import time

from tinyloop.bench.stats import percentile

TIMEOUT_S = 60


class Connection:
    def __init__(self, host: str, port: int, key: str | None):
        self.host, self.port = host, port
        self.auth = f"Authorization: Bearer {key}\r\n" if key else ""
        self.reader = self.writer = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass
            self.writer = None

    def _send(self, method: str, path: str, body: bytes = b"") -> None:
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{self.auth}"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        self.writer.write(head.encode() + body)

    async def _head(self) -> tuple:
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError("the server closed the connection")
        status = int(status_line.split()[1])
        headers = {}
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        return status, headers

    async def _pieces(self, headers: dict):
        """The body as it arrives."""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await self.reader.readline()).split(b";")[0], 16)
                if size == 0:
                    while (await self.reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass                                        # trailers
                    return
                piece = await self.reader.readexactly(size)
                await self.reader.readexactly(2)
                yield piece
        elif "content-length" in headers:
            length = int(headers["content-length"])
            if length:
                yield await self.reader.readexactly(length)
        else:
            while piece := await self.reader.read(65536):
                yield piece

    async def request(self, method: str, path: str, payload=None) -> tuple:
        """-> (status, body bytes)."""
        self._send(method, path, json.dumps(payload).encode() if payload is not None else b"")
        status, headers = await self._head()
        body = b"".join([piece async for piece in self._pieces(headers)])
        return status, body

    async def stream(self, path: str, payload) -> dict:
        """A streamed request: status, data events (the final [DONE] not counted), the
        completion tokens the usage event reports, and seconds to the first event."""
        start = time.perf_counter()
        self._send("POST", path, json.dumps(payload).encode())
        status, headers = await self._head()
        buffer, events, first, tokens = b"", 0, None, None
        async for piece in self._pieces(headers):
            buffer += piece.replace(b"\r\n", b"\n")
            *complete, buffer = buffer.split(b"\n\n")
            for event in complete:
                for line in event.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        continue
                    events += 1
                    first = first or time.perf_counter() - start
                    if b'"usage"' in data:
                        tokens = json.loads(data)["usage"]["completion_tokens"]
        return {"status": status, "events": events, "tokens": tokens, "first_event_s": first}


async def wait_ready(host: str, port: int, key: str | None, path: str, seconds: float, alive) -> None:
    """Poll GET path until 200; alive() False (the server process ended) stops early."""
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        if not alive():
            raise RuntimeError("the server process exited before it was ready")
        connection = Connection(host, port, key)
        try:
            await connection.open()
            status, _ = await asyncio.wait_for(connection.request("GET", path), 5)
            if status == 200:
                return
        except (OSError, ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            await connection.close()
        await asyncio.sleep(0.1)
    raise RuntimeError(f"the server was not ready within {seconds:.0f} s")


async def closed_loop(host: str, port: int, key: str | None, path: str, payload: dict, requests: int,
                      clients: int) -> dict:
    """`clients` keep-alive connections, each sending its next request when the last one
    is answered, until `requests` in all: requests per second and latency percentiles."""
    connections = [Connection(host, port, key) for _ in range(clients)]
    await asyncio.gather(*(c.open() for c in connections))
    remaining, latencies, statuses = [requests], [], {}

    async def client(connection):
        while remaining[0] > 0:
            remaining[0] -= 1
            start = time.perf_counter()
            status, _ = await asyncio.wait_for(connection.request("POST", path, payload), TIMEOUT_S)
            latencies.append(time.perf_counter() - start)
            statuses[status] = statuses.get(status, 0) + 1
    start = time.perf_counter()
    try:
        await asyncio.gather(*(client(c) for c in connections))
    finally:
        elapsed = time.perf_counter() - start
        await asyncio.gather(*(c.close() for c in connections))
    return {"requests": len(latencies), "seconds": elapsed, "requests_per_s": len(latencies) / elapsed,
            "p50_ms": 1000 * percentile(latencies, 0.5), "p99_ms": 1000 * percentile(latencies, 0.99),
            "statuses": {str(k): v for k, v in sorted(statuses.items())}}


async def streams(host: str, port: int, key: str | None, path: str, payload: dict, count: int) -> dict:
    """`count` streamed requests one after another on one connection: events and tokens
    per second over all of them."""
    connection = Connection(host, port, key)
    await connection.open()
    events = tokens = 0
    statuses, firsts = {}, []
    start = time.perf_counter()
    try:
        for _ in range(count):
            result = await asyncio.wait_for(connection.stream(path, payload), TIMEOUT_S)
            statuses[result["status"]] = statuses.get(result["status"], 0) + 1
            events += result["events"]
            tokens += result["tokens"] or 0
            if result["first_event_s"] is not None:
                firsts.append(result["first_event_s"])
    finally:
        elapsed = time.perf_counter() - start
        await connection.close()
    return {"streams": count, "seconds": elapsed, "chunks_per_s": events / elapsed, "tokens_per_s": tokens / elapsed,
            "first_chunk_ms": 1000 * sum(firsts) / len(firsts) if firsts else None,
            "statuses": {str(k): v for k, v in sorted(statuses.items())}}
