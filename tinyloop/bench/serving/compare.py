"""The HTTP layer side by side: `tinyloop serve` (Granian, raw ASGI) and the same engine
behind FastAPI + uvicorn + sse-starlette (fastapi_app.py), on the same tiny random model.

Both servers run at once on loopback ports (an idle one costs nothing) and take turns
within every round under the same bounded load:
- 1-token completions (`POST /v1/completions`, max_tokens 1, greedy) from `clients`
  keep-alive connections, `requests` in all: requests per second, p50 and p99 latency;
- streamed completions of `stream_tokens` tokens, one after another on one connection:
  server-sent events (chunks) per second and tokens per second.
Concurrency is sized to the engine's admission rule: one generation runs and both
servers are started with max_waiting = clients, so every request is admitted (none gets
429) and both queue the same way; any other status is counted and reported.
The engine alone, called in this process between the servers' turns, shows what the
HTTP layers add.
"""
from __future__ import annotations

import asyncio
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tinyloop.bench.serving import loadgen
from tinyloop.bench.serving.servers import event_loops, fastapi_server, missing_comparison_stack, tinyloop_server
from tinyloop.bench.stats import ratio, summarize

HOST = "127.0.0.1"
MEASURES = (("requests_per_s", "1-token requests/s", "higher"), ("p50_ms", "1-token latency p50 (ms)", "lower"),
            ("p99_ms", "1-token latency p99 (ms)", "lower"), ("chunks_per_s", "streamed chunks/s", "higher"),
            ("tokens_per_s", "streamed tokens/s", "higher"))


def engine_alone(loaded, pool, prompt_ids: list, stream_tokens: int, calls: int) -> dict:
    """The same generations called in-process: 1-token latency (median of `calls`) and
    the decode rate of a `stream_tokens` generation."""
    from tinyloop.engine.generate import GenerationRequest, generate
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        generate(loaded.model, GenerationRequest(list(prompt_ids), 1), tokenizer=loaded.tokenizer, pool=pool)
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    result = generate(loaded.model, GenerationRequest(list(prompt_ids), stream_tokens), tokenizer=loaded.tokenizer,
                      pool=pool)
    seconds = time.perf_counter() - start
    median = statistics.median(times)
    return {"requests_per_s": 1 / median, "p50_ms": 1000 * median, "tokens_per_s": result.completion_tokens / seconds}


async def _measure(servers, key, settings, loaded, pool, prompt_ids, progress) -> dict:
    for server in servers:
        await loadgen.wait_ready(HOST, server.port, key, "/health", 120, server.alive)
    one = {"model": "tiny", "prompt": "Hi", "max_tokens": 1, "temperature": 0}
    stream = {"model": "tiny", "prompt": "Hi", "max_tokens": settings["stream_tokens"], "temperature": 0,
              "stream": True, "stream_options": {"include_usage": True}}
    runs = {server.name: [] for server in servers}
    alone = []
    for round_index in range(settings["rounds"] + 1):                    # the first round warms up
        shift = round_index % len(servers)
        for server in servers[shift:] + servers[:shift]:
            if progress:
                print(f"tinyloop bench: HTTP {'warm-up' if not round_index else f'round {round_index}'}: "
                      f"{server.name}", file=sys.stderr, flush=True)
            requests = settings["requests"] if round_index else max(settings["requests"] // 5, 10)
            closed = await loadgen.closed_loop(HOST, server.port, key, "/v1/completions", one, requests,
                                               settings["clients"])
            streamed = await loadgen.streams(HOST, server.port, key, "/v1/completions", stream, settings["streams"])
            if round_index:
                runs[server.name].append({**closed, **streamed, "statuses": {
                    "1-token": closed["statuses"], "stream": streamed["statuses"]}})
        if round_index:
            alone.append(engine_alone(loaded, pool, prompt_ids, settings["stream_tokens"], 50))
    return {"runs": runs, "alone": alone}


def http_comparison(quick: bool, rounds: int, progress: bool = True) -> dict:
    """-> the section's JSON: settings, per server each measure's median/min/max and the
    ratios TinyLoop / FastAPI; or {"status": "skipped", "reason"} when the comparison
    stack is not installed."""
    reason = missing_comparison_stack()
    if reason:
        return {"status": "skipped", "reason": reason}
    from tinyloop.kv.pool import KVPool, default_pool_bytes
    from tinyloop.model.loader import load_model
    from tinyloop.model.testmodels import make_test_model
    settings = {"model": "tiny-looped preset, seed 0, no end-of-sequence token", "route": "POST /v1/completions",
                "clients": 4 if quick else 8, "requests": 200 if quick else 1000,
                "streams": 3 if quick else 5, "stream_tokens": 128 if quick else 256, "rounds": rounds,
                "event_loop": event_loops()}
    settings["max_waiting"] = settings["clients"]
    key = secrets.token_hex(16)
    with tempfile.TemporaryDirectory(prefix="tinyloop-bench-") as folder:
        model = str(Path(folder) / "tiny.tinyloop")
        make_test_model(model, "tiny-looped", seed=0, eos_token_ids=())
        loaded = load_model(model)
        pool = KVPool.for_model(loaded.model, default_pool_bytes(loaded.model))
        prompt_ids = loaded.encode_prompt("Hi")
        servers = [tinyloop_server(model, key, settings["max_waiting"], folder),
                   fastapi_server(model, key, settings["max_waiting"])]
        try:
            measured = asyncio.run(_measure(servers, key, settings, loaded, pool, prompt_ids, progress))
        except (RuntimeError, OSError, ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError) as exc:
            logs = "; ".join(f"{s.name}: {s.tail()}" for s in servers if s.tail())
            return {"status": "failed", "reason": f"{type(exc).__name__}: {exc}" + (f" ({logs})" if logs else ""),
                    "settings": settings}
        finally:
            for server in servers:
                server.stop()
    return summary(settings, servers, measured)


def summary(settings: dict, servers: list, measured: dict) -> dict:
    mine, other = servers[0].name, servers[1].name
    servers_out = {}
    for name, runs in measured["runs"].items():
        servers_out[name] = {key: summarize([run[key] for run in runs]) for key, _, _ in MEASURES}
        servers_out[name]["statuses"] = [run["statuses"] for run in runs]
    alone = {key: summarize([run[key] for run in measured["alone"]]) for key in ("requests_per_s", "p50_ms",
                                                                                  "tokens_per_s")}
    rows = []
    for key, label, better in MEASURES:
        rows.append({"measure": key, "label": label, "better": better,
                     "servers": {name: servers_out[name][key] for name in servers_out},
                     "engine_alone": alone.get(key),
                     "ratio": ratio(servers_out[mine][key], servers_out[other][key])})
    admitted = all(set(statuses) <= {"200"} for name in servers_out
                   for run in servers_out[name]["statuses"] for statuses in run.values())
    return {"status": "measured", "settings": settings, "servers": [mine, other], "rows": rows,
            "statuses": {name: servers_out[name]["statuses"] for name in servers_out}, "all_200": admitted}
