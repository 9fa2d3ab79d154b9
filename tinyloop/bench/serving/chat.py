"""Multi-turn chat over a long system prompt: time to first token turn by turn, with and
without a prefix cache, beside llama-server's per-slot prompt cache.

Servers: `tinyloop serve` with its prefix cache (TINYLOOP_PREFIX_CACHE=1, the default),
`tinyloop serve` with it off (TINYLOOP_PREFIX_CACHE=0: every turn computes its whole prompt)
and, when at hand, llama-server with one slot (-np 1; it keeps that slot's prompt and
reuses the common prefix, `cache_prompt: true`). TINYLOOP_MAX_RUNNING is left at the
server's default. Each round (the first warms up and is not counted) takes a fresh system
prompt of about `system_tokens` tokens (shuffled lines of the shipped text, a label with
the round's seed first, so no round hits another round's cache) and, server after server
(the order rotating):
- conversation: `turns` turns, each the whole conversation so far (system prompt, every
  earlier question and the answer that server gave) plus a new question; streamed,
  greedy, `answer_tokens` tokens, end-of-sequence ignored. Per turn: time to the first
  content token, prompt tokens, and the cached prompt tokens the server reports
  (usage.prompt_tokens_details.cached_tokens; llama-server: timings.cache_n);
- second question: a second fresh system prompt, then `turns` one-question conversations
  on it, each a different question: question 1 finds nothing cached, questions 2.. find
  the system prompt. Per server: question 1's time to first token, the median of the
  others', and their ratio.
"""
from __future__ import annotations

import asyncio
import statistics
import sys

from tinyloop.bench.interference import DISTURBED, GroupMeter
from tinyloop.bench.serving import llama_server
from tinyloop.bench.serving.concurrency import (HOST, LLAMA_EXTRA, PATH, TEMPLATE_ROOM, Target, eos_control, ready,
                                                  run_scenario)
from tinyloop.bench.serving.loadgen import Connection
from tinyloop.bench.serving.servers import tinyloop_serving
from tinyloop.bench.serving.streaming import STREAM_TIMEOUT_S, StreamRecord, problems_of, timed_stream
from tinyloop.bench.stats import ratio, summarize

QUESTION_ROOM = 40              # tokens a question takes with its turn markers, for the context check


def log(message: str, progress: bool) -> None:
    if progress:
        print(f"tinyloop bench: {message}", file=sys.stderr, flush=True)


def needed_context(system_tokens: int, turns: int, answer_tokens: int) -> int:
    """Tokens the longest prompt of the conversation takes, its answer included."""
    return system_tokens + TEMPLATE_ROOM + turns * (QUESTION_ROOM + answer_tokens)


async def _ask(target: Target, key: str, messages: list, tokens: int) -> StreamRecord:
    connection = Connection(HOST, target.server.port, key)
    await connection.open()
    record = StreamRecord()
    try:
        await asyncio.wait_for(timed_stream(connection, PATH, target.payload(messages, tokens), record),
                               STREAM_TIMEOUT_S)
    except (OSError, ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError) as exc:
        record.error = record.error or f"{type(exc).__name__}: {exc}"
    finally:
        await connection.close()
    return record


def _turn(record: StreamRecord) -> dict:
    return {"ttft_ms": None if record.ttft_s is None else 1000 * record.ttft_s,
            "cached_tokens": record.cached_tokens,
            "prompt_tokens": (record.usage or {}).get("prompt_tokens"), "tokens": record.tokens}


async def conversation(target: Target, key: str, texts, settings: dict, round_index: int, problems: list) -> dict:
    system = texts.text(settings["system_tokens"], seed=5_000_000 + round_index, label="Notes")
    messages = [{"role": "system", "content": "Answer questions about these notes.\n" + system}]
    turns = []
    for turn in range(settings["turns"]):
        messages.append({"role": "user", "content": texts.question(turn)})
        await asyncio.sleep(settings["settle"])
        record = await _ask(target, key, messages, settings["answer_tokens"])
        problems += problems_of([record], settings["answer_tokens"], {
            "scenario": "chat", "server": target.label, "round": round_index, "turn": turn + 1})
        turns.append(_turn(record))
        messages.append({"role": "assistant", "content": "".join(record.text)})
    second = []
    system = texts.text(settings["system_tokens"], seed=6_000_000 + round_index, label="Reference")
    for index in range(settings["turns"]):
        await asyncio.sleep(settings["settle"])
        record = await _ask(target, key, [{"role": "system", "content": "Answer questions about these notes.\n"
                                           + system},
                                          {"role": "user", "content": texts.question(settings["turns"] + index)}],
                            settings["answer_tokens"])
        problems += problems_of([record], settings["answer_tokens"], {
            "scenario": "second question", "server": target.label, "round": round_index, "question": index + 1})
        second.append(_turn(record))
    return {"turns": turns, "second": second}


async def _chat(model: str, settings: dict, llama: dict, eos_ids: tuple, key: str, folder: str, texts,
                progress: bool, started: list, device: str | None) -> dict:
    problems: list = []
    cached = tinyloop_serving(model, key, folder, "TinyLoop, prefix cache", prefix_cache=True, device=device)
    started.append(cached)
    cold = tinyloop_serving(model, key, folder, "TinyLoop, no prefix cache", prefix_cache=False, device=device)
    started.append(cold)
    targets = [Target("tinyloop_cache", "TinyLoop, prefix cache", cached, {}, "tinyloop"),
               Target("tinyloop_cold", "TinyLoop, TINYLOOP_PREFIX_CACHE=0", cold, {}, "tinyloop")]
    llama_status = dict(llama)
    if llama_status["status"] == "found":
        context = -(-(needed_context(settings["system_tokens"], settings["turns"], settings["answer_tokens"]) + 128)
                    // 256) * 256
        server = llama_server.start(llama_status["path"], settings["gguf"], key, 1, context, settings["threads"])
        started.append(server)
        target = Target("llama_server", "llama-server (-np 1)", server, LLAMA_EXTRA, "llama")
        try:
            await ready([target], key)
            targets.append(target)
            llama_status.update(status="measured", context=context)
        except RuntimeError as exc:
            llama_status.update(status="failed", reason=f"llama-server -np 1 -c {context}: {exc} ({server.tail()})")
            server.stop()
    await ready(targets[:2], key)
    extra, how = await eos_control(cached.port, key, eos_ids)
    settings["tinyloop_end_of_sequence"] = how
    for target in targets[:2]:
        target.extra = extra
    runs = {t.key: [] for t in targets}
    for round_index in range(settings["rounds"] + 1):
        shift = round_index % len(targets)
        for target in targets[shift:] + targets[:shift]:
            log(f"chat ({settings['turns']} turns on a {settings['system_tokens']}-token system prompt): "
                f"{'warm-up' if not round_index else f'round {round_index}'}: {target.label}", progress)
            found: list = []
            with GroupMeter(t.server.process.pid for t in targets) as meter:
                run = await conversation(target, key, texts, settings, round_index, found)
            run["others_share"] = meter.share
            if round_index:
                runs[target.key].append(run)
                problems += found
    return {"runs": runs, "llama_server": llama_status, "problems": problems}


def _summ(values: list):
    values = [v for v in values if v is not None]
    return summarize(values) if values else None


def _median(values: list):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def chat_summary(settings: dict, measured: dict) -> dict:
    runs = measured["runs"]
    servers = {}
    for key, server_runs in runs.items():
        turns = []
        for turn in range(settings["turns"]):
            entries = [run["turns"][turn] for run in server_runs]
            turns.append({"turn": turn + 1, "ttft_ms": _summ([e["ttft_ms"] for e in entries]),
                          "cached_tokens": _median([e["cached_tokens"] for e in entries]),
                          "cached_tokens_runs": [e["cached_tokens"] for e in entries],
                          "prompt_tokens": _median([e["prompt_tokens"] for e in entries])})
        first = [run["second"][0]["ttft_ms"] for run in server_runs]
        later = [_median([q["ttft_ms"] for q in run["second"][1:]]) for run in server_runs]
        second = {"first_ttft_ms": _summ(first), "later_ttft_ms": _summ(later),
                  "later / first": _summ([b / a for a, b in zip(first, later) if a and b is not None]),
                  "first_cached_tokens": _median([run["second"][0]["cached_tokens"] for run in server_runs]),
                  "later_cached_tokens": _median([q["cached_tokens"] for run in server_runs
                                                  for q in run["second"][1:]]),
                  "prompt_tokens": _median([q["prompt_tokens"] for run in server_runs for q in run["second"]])}
        servers[key] = {"turns": turns, "second_question": second}
    ratios = {}
    pairs = [("tinyloop_cache", "tinyloop_cold")] + ([("tinyloop_cache", "llama_server")] if "llama_server" in servers
                                                     else [])
    for mine, other in pairs:
        ratios[f"{mine} / {other}"] = {
            "turns": [ratio(a["ttft_ms"], b["ttft_ms"]) for a, b in zip(servers[mine]["turns"],
                                                                      servers[other]["turns"])],
            "second_question_first": ratio(servers[mine]["second_question"]["first_ttft_ms"],
                                           servers[other]["second_question"]["first_ttft_ms"]),
            "second_question_later": ratio(servers[mine]["second_question"]["later_ttft_ms"],
                                           servers[other]["second_question"]["later_ttft_ms"])}
    shares = [run["others_share"] for server_runs in runs.values() for run in server_runs]
    return {"servers": servers, "ratios": ratios, "others_share": shares,
            "disturbed_runs": sum(1 for share in shares if share is not None and share > DISTURBED)}


def chat_section(model: str, settings: dict, llama: dict, eos_ids: tuple, tokenizer, progress: bool = True,
                 device: str | None = None) -> dict:
    """-> the section's JSON (keys in tinyloop/bench/report.py's module docstring)."""
    run = run_scenario(_chat, model, settings, llama, eos_ids, tokenizer, progress, device)
    if run["status"] != "measured":
        return run
    measured = run["measured"]
    return {"status": "measured", "settings": settings, "llama_server": measured["llama_server"],
            "problems": measured["problems"], **chat_summary(settings, measured)}
