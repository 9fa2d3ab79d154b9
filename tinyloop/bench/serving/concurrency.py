"""The concurrency sweep: `tinyloop serve` stepping N generations together against itself
at TINYLOOP_MAX_RUNNING=1 and against llama.cpp's llama-server with N slots, N streamed chat
completions at a time; and the long-prompt interference measurement.

Per level N, each round fires N streamed `POST /v1/chat/completions` at once (greedy,
end-of-sequence ignored, `decode_tokens` tokens each, a different prompt of about
`prompt_tokens` tokens per client and per round, one keep-alive connection each, opened
before the clock starts) at each server in turn, the order rotating from round to round;
a first burst of short streams warms each server up and is not counted. Per run:
- tokens_per_s: all generated tokens / seconds from the first request sent to the last
  stream ended;
- ttft_p50_ms / ttft_p99_ms: time to the first content token, over the N streams;
- itl_p50_ms / itl_p99_ms: gaps between successive tokens of a stream, over every gap of
  every stream (tokens counted, not events: see streaming.py).
Each figure: the median over rounds with min and max; ratios TinyLoop(N) / TinyLoop
(max_running 1) and TinyLoop(N) / llama-server(N) pair runs of the same round.

Interference: K streams (K = interference_streams) run on a server that admits K + 1,
each with a budget of tokens large enough to outlast the measurement; once each has
streamed a few tokens and `before_s` has passed, one request with a prompt of about
`long_prompt` tokens joins. Over the window from its arrival to its first token, the
running streams' gaps are collected, each stream's open gap at the window's end (a stall
not yet over) included; then the streams are cancelled (their connections closed).
Reported: the long request's time to first token, the running streams' gap p50, p99 and
largest in the window, their gap p50 before it, and the tokens they got out in it.
"""
from __future__ import annotations

import asyncio
import sys
import time

from tinyloop.bench.interference import GroupMeter
from tinyloop.bench.serving import llama_server
from tinyloop.bench.serving.loadgen import Connection, wait_ready
from tinyloop.bench.serving.servers import tinyloop_serving
from tinyloop.bench.serving.streaming import STREAM_TIMEOUT_S, StreamRecord, burst_figures, problems_of, \
    run_streams, timed_stream
from tinyloop.bench.stats import percentile, ratio, summarize

HOST = "127.0.0.1"
PATH = "/v1/chat/completions"
MEASURES = (("tokens_per_s", "aggregate tokens/s", "higher"), ("ttft_p50_ms", "time to first token p50 (ms)", "lower"),
            ("ttft_p99_ms", "time to first token p99 (ms)", "lower"),
            ("itl_p50_ms", "inter-token latency p50 (ms)", "lower"),
            ("itl_p99_ms", "inter-token latency p99 (ms)", "lower"))
INTERFERENCE_MEASURES = (("long_ttft_ms", "long prompt: time to first token (ms)"),
                         ("itl_window_p50_ms", "running streams, inter-token latency p50 in the window (ms)"),
                         ("itl_window_p99_ms", "running streams, inter-token latency p99 in the window (ms)"),
                         ("itl_window_max_ms", "running streams, largest gap in the window (ms)"),
                         ("itl_before_p50_ms", "running streams, inter-token latency p50 before (ms)"),
                         ("window_tokens", "tokens the running streams got out in the window"))
TEMPLATE_ROOM = 64              # chat template tokens around a message, for sizing llama-server's context
READY_S = 300


def log(message: str, progress: bool) -> None:
    if progress:
        print(f"tinyloop bench: {message}", file=sys.stderr, flush=True)


def base_payload(tokens: int) -> dict:
    return {"model": "bench", "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}


async def eos_control(port: int, key: str, eos_ids: tuple) -> tuple:
    """The fields that make `tinyloop serve` ignore end-of-sequence: its `ignore_eos`
    extension when it accepts one, else logit_bias -100 on the model's end-of-sequence ids
    (an OpenAI field: those tokens are never picked). -> (fields, how)."""
    connection = Connection(HOST, port, key)
    await connection.open()
    try:
        status, body = await connection.request("POST", PATH, {
            "model": "bench", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "ignore_eos": True})
    finally:
        await connection.close()
    if status == 200:
        return {"ignore_eos": True}, "ignore_eos: true"
    refusal = body.decode("utf-8", "replace")[:160]
    return ({"logit_bias": {str(i): -100 for i in eos_ids}},
            f"logit_bias -100 on the end-of-sequence ids {list(eos_ids)} (the server answered {status} to "
            f"ignore_eos: {refusal})")


class Target:
    """A server under measurement: its process, and the request fields it gets."""

    def __init__(self, key: str, label: str, server, extra: dict, kind: str):
        self.key, self.label, self.server, self.extra, self.kind = key, label, server, extra, kind

    def payload(self, messages: list, tokens: int) -> dict:
        return {**base_payload(tokens), "messages": messages, **self.extra}


LLAMA_EXTRA = {"ignore_eos": True, "cache_prompt": True}


async def ready(targets: list, auth_key: str) -> None:
    for target in targets:
        await wait_ready(HOST, target.server.port, auth_key, "/health", READY_S, target.server.alive)


async def burst(target: Target, auth_key: str, prompts: list, tokens: int) -> tuple:
    payloads = [target.payload([{"role": "user", "content": p}], tokens) for p in prompts]
    return await run_streams(HOST, target.server.port, auth_key, PATH, payloads)


def _prompts(texts, settings: dict, level: int, round_index: int, count: int) -> list:
    return [texts.text(settings["prompt_tokens"], seed=1_000_000 * level + 1000 * round_index + client,
                       label="Request") for client in range(count)]


async def measure_level(level: int, targets: list, auth_key: str, texts, settings: dict, progress: bool,
                        problems: list) -> dict:
    runs = {t.key: [] for t in targets}
    prompt_tokens = {t.key: [] for t in targets}
    for target in targets:                                  # warm-up: short streams, not counted
        log(f"concurrency {level}: warm-up: {target.label}", progress)
        await burst(target, auth_key, _prompts(texts, settings, level, 0, level), min(8, settings["decode_tokens"]))
    for round_index in range(1, settings["rounds"] + 1):
        prompts = _prompts(texts, settings, level, round_index, level)
        shift = round_index % len(targets)
        for target in targets[shift:] + targets[:shift]:
            log(f"concurrency {level}: round {round_index}: {target.label}", progress)
            await asyncio.sleep(settings["settle"])
            with GroupMeter(t.server.process.pid for t in targets) as meter:
                records, wall = await burst(target, auth_key, prompts, settings["decode_tokens"])
            figures = burst_figures(records, wall)
            figures["others_share"] = meter.share
            figures["statuses"] = _statuses(records)
            runs[target.key].append(figures)
            prompt_tokens[target.key] += [r.usage.get("prompt_tokens") for r in records if r.usage]
            problems += problems_of(records, settings["decode_tokens"],
                                    {"scenario": "concurrency", "server": target.label, "concurrency": level,
                                     "round": round_index})
    return {"runs": runs, "prompt_tokens": prompt_tokens}


def _statuses(records: list) -> dict:
    out = {}
    for record in records:
        key = str(record.status) if record.status is not None else "no response"
        out[key] = out.get(key, 0) + 1
    return out


async def interference_once(target: Target, auth_key: str, texts, settings: dict, round_index: int) -> tuple:
    """K running streams, then the long request: (figures, problems)."""
    streams, budget = settings["interference_streams"], settings["interference_budget"]
    prompts = [texts.text(settings["prompt_tokens"], seed=7_000_000 + 1000 * round_index + i, label="Stream")
               for i in range(streams)]
    connections = [Connection(HOST, target.server.port, auth_key) for _ in range(streams)]
    await asyncio.gather(*(c.open() for c in connections))
    long_connection = Connection(HOST, target.server.port, auth_key)   # opened when it is sent: llama-server
    first = None                                                        # closes a connection idle for 5 s
    records = [StreamRecord() for _ in range(streams)]
    long_record = StreamRecord()
    tasks = [asyncio.ensure_future(asyncio.wait_for(
        timed_stream(c, PATH, target.payload([{"role": "user", "content": p}], budget), r), STREAM_TIMEOUT_S))
        for c, p, r in zip(connections, prompts, records)]
    problems = []
    try:
        deadline = time.perf_counter() + STREAM_TIMEOUT_S
        while not all(len(r.events) >= 4 or r.ended for r in records):     # every stream under way
            if time.perf_counter() > deadline:
                raise asyncio.TimeoutError("the running streams did not start")
            await asyncio.sleep(0.01)
        await asyncio.sleep(settings["before_s"])
        long_text = texts.text(settings["long_prompt"], seed=9_000_000 + round_index, label="Long document")
        await long_connection.open()
        arrival = time.perf_counter()
        try:
            await asyncio.wait_for(timed_stream(long_connection, PATH, target.payload(
                [{"role": "user", "content": long_text}], 4), long_record), STREAM_TIMEOUT_S)
        except (OSError, ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            long_record.error = long_record.error or f"{type(exc).__name__}: {exc}"[:500]
        first = long_record.first
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in connections + [long_connection]))
    where = {"scenario": "interference", "server": target.label, "round": round_index}
    problems += problems_of([long_record], None, {**where, "stream": "long prompt"})
    problems += [p for p in problems_of(records, None, where) if p.get("status") != 200 or "error" in p]
    if first is None:
        return None, problems + [{**where, "stream": "long prompt", "status": long_record.status,
                                  "error": long_record.error or "no token came back"}]
    window, before, ended_early, window_tokens = [], [], 0, 0
    for record in records:
        times = record.token_times()
        before += [gap for at, gap in times if at <= arrival]
        inside = [(at, gap) for at, gap in times if arrival < at <= first]
        window += [gap for _, gap in inside]
        window_tokens += len(inside)
        if record.ended is not None and record.ended <= first:
            ended_early += 1
            continue
        last = max([at for at, _ in times if at <= first] or [record.first or arrival])
        window.append(first - last)                  # the gap still open when the long prompt's token came
    figures = {"long_ttft_ms": 1000 * (first - long_record.sent),
               "itl_window_p50_ms": 1000 * percentile(window, 0.5) if window else None,
               "itl_window_p99_ms": 1000 * percentile(window, 0.99) if window else None,
               "itl_window_max_ms": 1000 * max(window) if window else None,
               "itl_before_p50_ms": 1000 * percentile(before, 0.5) if before else None,
               "window_tokens": window_tokens, "window_s": first - arrival, "window_gaps": len(window),
               "streams_ended_early": ended_early,
               "long_prompt_tokens": (long_record.usage or {}).get("prompt_tokens")}
    return figures, problems


async def measure_interference(targets: list, auth_key: str, texts, settings: dict, progress: bool,
                               problems: list) -> dict:
    runs = {t.key: [] for t in targets}
    for round_index in range(settings["rounds"] + 1):           # round 0 warms up
        shift = round_index % len(targets)
        for target in targets[shift:] + targets[:shift]:
            log(f"interference ({settings['interference_streams']} streams + a {settings['long_prompt']}-token "
                f"prompt): {'warm-up' if not round_index else f'round {round_index}'}: {target.label}", progress)
            await asyncio.sleep(max(settings["settle"], 1.0))    # cancelled streams of the last run wind down
            with GroupMeter(t.server.process.pid for t in targets) as meter:
                figures, found = await interference_once(target, auth_key, texts, settings, round_index)
            if round_index:
                problems += found
                if figures is not None:
                    figures["others_share"] = meter.share
                    runs[target.key].append(figures)
    return runs


async def guarded_interference(targets: list, auth_key: str, texts, settings: dict, progress: bool,
                               problems: list) -> dict:
    """measure_interference, its failure reported in its own entry (the sweep's levels kept)."""
    try:
        return await measure_interference(targets, auth_key, texts, settings, progress, problems)
    except (RuntimeError, OSError, ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError) as exc:
        logs = "; ".join(f"{t.label}: {t.server.tail()}" for t in targets if not t.server.alive())
        return {"error": f"{type(exc).__name__}: {exc}" + (f" ({logs})" if logs else "")}


def llama_context(settings: dict, slots: int, interference: bool) -> int:
    per_slot = settings["prompt_tokens"] + settings["decode_tokens"] + TEMPLATE_ROOM
    if interference:
        per_slot = max(per_slot, settings["long_prompt"] + 4 + TEMPLATE_ROOM,
                       settings["prompt_tokens"] + settings["interference_budget"] + TEMPLATE_ROOM)
    per_slot = -(-per_slot // 256) * 256
    return slots * per_slot


async def _sweep(model: str, settings: dict, llama: dict, eos_ids: tuple, key: str, folder: str, texts,
                 progress: bool, started: list, device: str | None) -> dict:
    levels, problems = settings["levels"], []
    interference_level = settings["interference_streams"] + 1 if settings["interference_streams"] else None
    max_waiting = max(levels + [interference_level or 0]) + 8

    def tinyloop(n: int):
        server = tinyloop_serving(model, key, folder, f"TinyLoop (max_running {n})", max_running=n,
                                  max_waiting=max_waiting, device=device)
        started.append(server)
        return server

    base = Target("tinyloop_1", "TinyLoop (max_running 1)", tinyloop(1), {}, "tinyloop")
    await ready([base], key)
    extra, how = await eos_control(base.server.port, key, eos_ids)
    settings["tinyloop_end_of_sequence"] = how
    base.extra = extra
    llama_status = dict(llama)
    levels_out, interference_runs = [], None

    async def start_llama(slots: int, interference: bool):
        if llama_status["status"] not in ("found", "measured"):
            return None
        context = llama_context(settings, slots, interference)
        server = llama_server.start(llama_status["path"], settings["gguf"], key, slots, context, settings["threads"])
        started.append(server)
        target = Target("llama_server", f"llama-server (-np {slots})", server, LLAMA_EXTRA, "llama")
        try:
            await ready([target], key)
        except RuntimeError as exc:
            llama_status.update(status="failed", reason=f"llama-server -np {slots} -c {context}: {exc} "
                                                        f"({server.tail()})")
            server.stop()
            return None
        llama_status["status"] = "measured"
        llama_status.setdefault("contexts", {})[str(slots)] = context
        return target

    def stop(*targets):
        for target in targets:
            if target is not None and target is not base:
                target.server.stop()

    for level in levels:
        interference_here = level == interference_level
        mine = base if level == 1 else Target("tinyloop", f"TinyLoop (max_running {level})", tinyloop(level),
                                              extra, "tinyloop")
        other = await start_llama(level, interference_here)
        try:
            await ready([mine], key)
            targets = [mine] + ([base] if mine is not base else []) + ([other] if other else [])
            measured = await measure_level(level, targets, key, texts, settings, progress, problems)
            if mine is base:                              # at N = 1 the baseline is the server itself
                measured["runs"]["tinyloop"] = measured["runs"]["tinyloop_1"]
                measured["prompt_tokens"]["tinyloop"] = measured["prompt_tokens"]["tinyloop_1"]
            levels_out.append(level_summary(level, measured, other is not None))
            if interference_here:
                interference_runs = await guarded_interference([mine] + ([other] if other else []), key, texts,
                                                               settings, progress, problems)
        finally:
            stop(mine, other)
    if interference_level and interference_runs is None:
        mine = Target("tinyloop", f"TinyLoop (max_running {interference_level})", tinyloop(interference_level),
                      extra, "tinyloop")
        other = await start_llama(interference_level, True)
        try:
            await ready([mine], key)
            interference_runs = await guarded_interference([mine] + ([other] if other else []), key, texts,
                                                           settings, progress, problems)
        finally:
            stop(mine, other)
    base.server.stop()
    return {"levels": levels_out, "interference": interference_summary(settings, interference_runs),
            "llama_server": llama_status, "problems": problems}


def level_summary(level: int, measured: dict, with_llama: bool) -> dict:
    servers = {}
    for key, runs in measured["runs"].items():
        servers[key] = {m: summarize([r[m] for r in runs]) if runs and all(r[m] is not None for r in runs) else None
                        for m, _, _ in MEASURES}
        servers[key]["statuses"] = [r["statuses"] for r in runs]
        servers[key]["unattributed_tokens"] = sum(r["unattributed_tokens"] for r in runs)
        servers[key]["others_share"] = [r["others_share"] for r in runs]
        tokens = [t for t in measured["prompt_tokens"][key] if isinstance(t, int)]
        servers[key]["prompt_tokens"] = sorted(tokens)[len(tokens) // 2] if tokens else None
    ratios = {"tinyloop / tinyloop_1": {m: ratio(servers["tinyloop"][m], servers["tinyloop_1"][m])
                                        for m, _, _ in MEASURES}}
    if with_llama and "llama_server" in servers:
        ratios["tinyloop / llama_server"] = {m: ratio(servers["tinyloop"][m], servers["llama_server"][m])
                                             for m, _, _ in MEASURES}
    return {"concurrency": level, "servers": servers, "ratios": ratios}


def interference_summary(settings: dict, runs: dict | None) -> dict:
    if not settings["interference_streams"]:
        return {"status": "skipped", "reason": "--interference-streams 0"}
    if runs is None:
        return {"status": "failed", "reason": "not measured"}
    if "error" in runs:
        return {"status": "failed", "reason": runs["error"]}
    servers = {}
    for key, server_runs in runs.items():
        if not server_runs:
            servers[key] = None
            continue
        servers[key] = {m: summarize([r[m] for r in server_runs]) if all(r[m] is not None for r in server_runs)
                        else None for m, _ in INTERFERENCE_MEASURES}
        for extra in ("window_s", "long_prompt_tokens", "streams_ended_early", "window_gaps", "others_share"):
            servers[key][extra] = [r[extra] for r in server_runs]
    out = {"status": "measured", "streams": settings["interference_streams"], "long_prompt": settings["long_prompt"],
           "stream_budget": settings["interference_budget"], "servers": servers}
    if servers.get("tinyloop") and servers.get("llama_server"):
        out["ratios"] = {"tinyloop / llama_server": {m: ratio(servers["tinyloop"][m], servers["llama_server"][m])
                                                     for m, _ in INTERFERENCE_MEASURES}}
    return out


def run_scenario(scenario, model: str, settings: dict, llama: dict, eos_ids: tuple, tokenizer, progress: bool,
                 device: str | None) -> dict:
    """Run a serving scenario's coroutine `scenario(model, settings, llama, eos_ids, key, folder,
    texts, progress, started, device)` in a scratch folder, stopping every server it started ->
    {"status": "measured", "measured": ...} or {"status": "failed", "reason", ...} (with the
    log tail of a server that died)."""
    import secrets
    import tempfile

    from tinyloop.bench.serving.texts import Texts
    key = secrets.token_hex(16)
    started: list = []
    with tempfile.TemporaryDirectory(prefix="tinyloop-bench-") as folder:
        try:
            measured = asyncio.run(scenario(model, settings, llama, eos_ids, key, folder, Texts(tokenizer), progress,
                                            started, device))
        except (RuntimeError, OSError, ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError) as exc:
            logs = "; ".join(f"{s.name}: {s.tail()}" for s in started if not s.alive() and not s.stopped)
            return {"status": "failed", "reason": f"{type(exc).__name__}: {exc}" + (f" ({logs})" if logs else ""),
                    "settings": settings, "llama_server": llama}
        finally:
            for server in started:
                server.stop()
    return {"status": "measured", "measured": measured}


def concurrency_section(model: str, settings: dict, llama: dict, eos_ids: tuple, tokenizer,
                        progress: bool = True, device: str | None = None) -> dict:
    """-> the section's JSON (keys in tinyloop/bench/report.py's module docstring)."""
    run = run_scenario(_sweep, model, settings, llama, eos_ids, tokenizer, progress, device)
    if run["status"] != "measured":
        return run
    measured = run["measured"]
    return {"status": "measured", "settings": settings, **measured,
            "disturbed_runs": disturbed_runs(measured)}


def disturbed_runs(measured: dict) -> int:
    """Runs during which other processes used more than DISTURBED of the CPUs."""
    from tinyloop.bench.interference import DISTURBED
    shares = [share for level in measured["levels"] for key, server in level["servers"].items()
              if not (level["concurrency"] == 1 and key == "tinyloop") for share in server["others_share"]]
    for server in (measured["interference"].get("servers") or {}).values():
        shares += (server or {}).get("others_share", [])
    return sum(1 for share in shares if share is not None and share > DISTURBED)
