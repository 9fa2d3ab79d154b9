"""Streamed chat completions timed token by token, and the latency figures made of them.

A stream's record holds the time each content-bearing event arrived, with the number of
tokens it carried: one, unless the event says otherwise (OpenAI logprobs list one entry
per token). An event that carries k tokens after a gap g counts as k gaps of g / k (the
tokens are spread over the gap). Events that arrive in one read of the socket share its
time. The usage event's completion_tokens is the stream's true token count; when it is
larger than the tokens the events account for (a token whose text was held back and
published with a later one, without a count), the difference is kept as
`unattributed_tokens` and reported, never silently folded in.
"""
from __future__ import annotations

import asyncio
import json
import time

from tinyloop.bench.serving.loadgen import Connection
from tinyloop.bench.stats import percentile

STREAM_TIMEOUT_S = 900          # a 4k-token prompt beside running streams takes tens of seconds on 2 cores


class StreamRecord:
    """What one streamed request saw. Times are time.perf_counter() values, so records of
    concurrent streams share one clock."""

    def __init__(self):
        self.sent: float | None = None
        self.status: int | None = None
        self.events: list = []              # (arrival time, tokens carried) of content-bearing events
        self.text: list = []                # the content deltas, in order
        self.usage: dict | None = None
        self.cached_tokens: int | None = None
        self.error: str | None = None       # a non-200 body, an error event, a broken connection
        self.ended: float | None = None

    @property
    def first(self) -> float | None:
        return self.events[0][0] if self.events else None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first is None or self.sent is None else self.first - self.sent

    @property
    def counted_tokens(self) -> int:
        return sum(count for _, count in self.events)

    @property
    def tokens(self) -> int:
        """The usage event's completion_tokens, else the tokens the events account for."""
        if self.usage and isinstance(self.usage.get("completion_tokens"), int):
            return self.usage["completion_tokens"]
        return self.counted_tokens

    @property
    def unattributed_tokens(self) -> int:
        return max(self.tokens - self.counted_tokens, 0)

    def token_times(self) -> list:
        """(arrival time, gap) per token after the first: an event of k tokens after a gap g
        gives k tokens arriving at its time, each with the gap g / k."""
        out, previous = [], None
        for index, (at, count) in enumerate(self.events):
            if index == 0:
                previous = at
                if count > 1:                        # tokens that came with the first one: no wait between them
                    out += [(at, 0.0)] * (count - 1)
                continue
            gap = (at - previous) / count
            out += [(at, gap)] * count
            previous = at
        return out

    def gaps(self) -> list:
        return [gap for _, gap in self.token_times()]

    def summary(self) -> dict:
        out = {"status": self.status, "tokens": self.tokens, "events": len(self.events),
               "ttft_ms": None if self.ttft_s is None else round(1000 * self.ttft_s, 3)}
        if self.unattributed_tokens:
            out["unattributed_tokens"] = self.unattributed_tokens
        if self.usage:
            out["prompt_tokens"] = self.usage.get("prompt_tokens")
        if self.cached_tokens is not None:
            out["cached_tokens"] = self.cached_tokens
        if self.error:
            out["error"] = self.error
        return out


def _cached_of(data: dict):
    """Prompt tokens served from a cache: OpenAI's usage.prompt_tokens_details.cached_tokens,
    else llama-server's timings.cache_n."""
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    if isinstance(details.get("cached_tokens"), int):
        return details["cached_tokens"]
    timings = data.get("timings") or {}
    if isinstance(timings.get("cache_n"), int):
        return timings["cache_n"]
    return None


def _content(choice: dict) -> tuple:
    """(text, tokens carried or None) of one streamed choice (chat delta or completion text)."""
    delta = choice.get("delta")
    if isinstance(delta, dict):
        text = (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    else:
        text = choice.get("text") or ""
    logprobs = choice.get("logprobs")
    count = None
    if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
        count = len(logprobs["content"]) or None
    return text, count


async def timed_stream(connection: Connection, path: str, payload: dict, record: StreamRecord) -> StreamRecord:
    """POST a streamed request on an open connection, filling `record` as events arrive
    (another task may read it meanwhile: the interference measurement does)."""
    record.sent = time.perf_counter()
    connection._send("POST", path, json.dumps(payload).encode())
    status, headers = await connection._head()
    record.status = status
    if status != 200:
        body = b"".join([piece async for piece in connection._pieces(headers)])
        record.error = body.decode("utf-8", "replace")[:500]
        record.ended = time.perf_counter()
        return record
    buffer = b""
    async for piece in connection._pieces(headers):
        at = time.perf_counter()
        buffer += piece.replace(b"\r\n", b"\n")
        *complete, buffer = buffer.split(b"\n\n")
        for event in complete:
            for line in event.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]" or not data:
                    continue
                try:
                    parsed = json.loads(data)
                except ValueError:
                    record.error = f"an event that is not JSON: {data[:200]!r}"
                    continue
                if "error" in parsed:
                    record.error = json.dumps(parsed["error"])[:500]
                for choice in parsed.get("choices") or ():
                    text, count = _content(choice)
                    if text or count:
                        record.events.append((at, count or 1))
                        record.text.append(text)
                if parsed.get("usage"):
                    record.usage = parsed["usage"]
                cached = _cached_of(parsed)
                if cached is not None:
                    record.cached_tokens = cached
    record.ended = time.perf_counter()
    return record


async def run_streams(host: str, port: int, key: str | None, path: str, payloads: list) -> tuple:
    """All payloads at once, one connection each (opened before the clock starts):
    (records, wall seconds from the first request sent to the last stream ended)."""
    connections = [Connection(host, port, key) for _ in payloads]
    await asyncio.gather(*(c.open() for c in connections))
    records = [StreamRecord() for _ in payloads]

    async def one(connection, payload, record):
        try:
            await asyncio.wait_for(timed_stream(connection, path, payload, record), STREAM_TIMEOUT_S)
        except (OSError, ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            record.error = record.error or f"{type(exc).__name__}: {exc}"[:500]
            record.ended = time.perf_counter()
    try:
        await asyncio.gather(*(one(c, p, r) for c, p, r in zip(connections, payloads, records)))
    finally:
        await asyncio.gather(*(c.close() for c in connections))
    start = min(r.sent for r in records if r.sent is not None)
    end = max(r.ended for r in records if r.ended is not None)
    return records, end - start


def burst_figures(records: list, wall_s: float) -> dict:
    """One burst of concurrent streams: aggregate tokens/s, time to first token p50/p99
    over the streams, inter-token latency p50/p99 over every gap of every stream."""
    ttfts = [r.ttft_s for r in records if r.ttft_s is not None]
    gaps = [g for r in records for g in r.gaps()]
    tokens = sum(r.tokens for r in records if r.status == 200)
    return {"tokens_per_s": tokens / wall_s if wall_s > 0 else None,
            "ttft_p50_ms": 1000 * percentile(ttfts, 0.5) if ttfts else None,
            "ttft_p99_ms": 1000 * percentile(ttfts, 0.99) if ttfts else None,
            "itl_p50_ms": 1000 * percentile(gaps, 0.5) if gaps else None,
            "itl_p99_ms": 1000 * percentile(gaps, 0.99) if gaps else None,
            "tokens": tokens, "wall_s": wall_s, "gaps": len(gaps),
            "unattributed_tokens": sum(r.unattributed_tokens for r in records)}


def problems_of(records: list, expected_tokens: int | None, where: dict) -> list:
    """A line per stream that failed or came back short: status, error body, tokens."""
    out = []
    for index, record in enumerate(records):
        short = expected_tokens is not None and record.status == 200 and record.tokens < expected_tokens
        if record.status != 200 or record.error or short:
            entry = {**where, "stream": index, "status": record.status, "tokens": record.tokens}
            if record.error:
                entry["error"] = record.error
            if short:
                entry["expected_tokens"] = expected_tokens
            out.append(entry)
    return out
