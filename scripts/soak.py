"""Soak: a bounded run of mixed traffic against a real Granian server, watching for leaks.

    python scripts/soak.py                      # 15 minutes
    python scripts/soak.py --minutes 2          # the CI run (.ci/run)

Clients (threads) send requests to every generation route and mode (/v1 and /api/v0 chat
and completions, /api/v0 with mode generate, speculative and tree_speculative, native
/generate, /generate/speculative, /generate/tree_speculative), streaming and not, greedy
and sampled, and leave at random points (mid-stream, or before a non-streamed answer
arrives). A 429 is honoured: the client waits its Retry-After. Every few requests a
client sends a greedy probe whose answer must equal the one recorded before the soak.
A sampler reads /metrics every `--sample-s` seconds: the worker's RSS, open file
descriptors and threads, and the admission counters.

Passes when, after the run:
- the KV pool holds nothing for anyone (every block back, or kept idle by the prefix cache;
  nothing reserved): a request that left early must not leak its blocks;
- RSS drift after warm-up is below --rss-drift (default 5%): the mean of the last tenth
  of the post-warm-up samples against the mean of its first tenth (warm-up: the first
  --warmup fraction of the run, default 20%); open fds and threads end within
  --fd-slack / --thread-slack of their post-warm-up start;
- the metrics add up: generation requests = completed + cancelled + refused (429), every
  admitted generation settled, none failed, nothing running or waiting;
- every greedy probe answered exactly the reference;
- the server stayed healthy, and exits 0 on SIGTERM.
The summary (also as JSON with --json FILE) states the drift measured.

The KV pool is a bounded structure that may fill on purpose: its pages are touched as blocks
are first used, and the prefix cache keeps finished requests' full blocks until the pool needs
the room (README, "Prefix caching"), so under varied long prompts the worker's RSS may climb
to the model plus the KV budget and stay there. The soak sets a small budget (--kv-budget-mb,
default 16 MiB) so that this bound is reached early whatever the traffic; growth beyond it is
a leak. (The pool hands out its lowest free blocks first, so what it touches is its peak
use, not a walk over the whole budget: before that fix this soak saw +95% over 2 minutes.)
The summary reports the prefix cache's hits, evictions and cached blocks.
"""
from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from live_server import LiveServer, summed  # noqa: E402

GENERATION_ROUTES = ("/v1/chat/completions", "/v1/completions", "/api/v0/chat/completions",
                     "/api/v0/completions", "/generate", "/generate/speculative", "/generate/tree_speculative")
SPECULATIVE = {"draft_loops": 1, "verify_loops": 4, "draft_ahead": 3}
# Two prompts of ~200 tokens sharing their first ~190 (full 64-row blocks): the prefix cache
# serves them from the second request on, so probes on them check cached answers too.
SHARED_PREFIX = "Weights shared across loops make depth a choice per request. " * 6
PROMPTS = ("The looped transformer", "Once upon a time", "Hello", "A", "Weights shared across loops",
           SHARED_PREFIX + "So how deep", SHARED_PREFIX + "Tell me why")


def traffic_kinds() -> list[tuple[str, dict]]:
    """(route, body without the sampling knobs) for every route and mode."""
    chat = {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}
    completion = {"model": "m", "prompt": "Hi"}
    kinds = [("/v1/chat/completions", chat), ("/v1/completions", completion)]
    for mode, extra in (("generate", {}), ("speculative", SPECULATIVE),
                        ("tree_speculative", {**SPECULATIVE, "K_branches": 2})):
        kinds += [("/api/v0/chat/completions", {**chat, "mode": mode, **extra}),
                  ("/api/v0/completions", {**completion, "mode": mode, **extra})]
    kinds += [("/generate", {"prompt": "Hi"}), ("/generate/speculative", {"prompt": "Hi", **SPECULATIVE}),
              ("/generate/tree_speculative", {"prompt": "Hi", **SPECULATIVE, "K_branches": 2})]
    return kinds


def probes() -> list[tuple[str, dict]]:
    """Greedy requests whose answers must never change (one per mode and API family)."""
    found = []
    for i, (route, body) in enumerate(traffic_kinds()):
        greedy = {**body, "max_tokens": 24, "temperature": 0}
        if "messages" in body:
            found.append((route, greedy))
        else:                                  # a short prompt, and a long one the prefix cache serves
            found += [(route, {**greedy, "prompt": PROMPTS[i % 5]}),
                      (route, {**greedy, "prompt": PROMPTS[5 + i % 2]})]
    return found


def probe_answer(client: httpx.Client, server: LiveServer, route: str, body: dict) -> str | list:
    response = client.post(f"{server.base}{route}", json=body, headers=server.auth, timeout=120)
    response.raise_for_status()
    data = response.json()
    if "tokens" in data:
        return data["tokens"]
    choice = data["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


@dataclass
class Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    statuses: Counter = field(default_factory=Counter)
    sent: int = 0
    left: int = 0                          # the client disconnected on purpose
    retried_after: int = 0                 # 429s honoured
    probes: int = 0
    probe_mismatches: list = field(default_factory=list)
    errors: list = field(default_factory=list)

    def add(self, **changes) -> None:
        with self.lock:
            for name, value in changes.items():
                setattr(self, name, getattr(self, name) + value)


def client_loop(server: LiveServer, seed: int, deadline: float, tally: Tally, references: dict,
                leave_probability: float) -> None:
    rng = random.Random(seed)
    kinds, probe_list = traffic_kinds(), probes()
    with httpx.Client() as client:
        count = 0
        while time.monotonic() < deadline:
            count += 1
            if count % 10 == 0:                       # a greedy probe
                index = rng.randrange(len(probe_list))
                route, body = probe_list[index]
                try:
                    answer = probe_answer(client, server, route, body)
                except httpx.HTTPStatusError as exc:
                    if exc.response.status_code == 429:
                        time.sleep(float(exc.response.headers.get("retry-after", "1")))
                        tally.add(retried_after=1)
                        continue
                    raise
                tally.add(probes=1)
                if answer != references[index]:
                    with tally.lock:
                        tally.probe_mismatches.append((route, body, answer, references[index]))
                continue
            route, body = kinds[rng.randrange(len(kinds))]
            body = dict(body)
            if "messages" not in body:
                body["prompt"] = rng.choice(PROMPTS)
            body["max_tokens"] = rng.randint(1, 48)
            body["temperature"] = rng.choice((0, 0, 0.7, 1.0))
            if "messages" in body or route.startswith("/v1") or route.startswith("/api"):
                body["seed"] = rng.randrange(1 << 30)
            else:
                body["sample_seed"] = rng.randrange(1 << 30)
            body["stream"] = rng.random() < 0.5
            leave = rng.random() < leave_probability
            try:
                status = one_request(client, server, route, body, rng, leave, tally)
            except Exception as exc:                   # noqa: BLE001 - recorded, the soak fails on it
                with tally.lock:
                    tally.errors.append(f"{route} {body}: {type(exc).__name__}: {exc}")
                continue
            if status == 429:
                time.sleep(1.0)


def one_request(client, server, route, body, rng, leave, tally) -> int | None:
    """Send one request (leaving early if `leave`); the status seen, None if the client left first."""
    tally.add(sent=1)
    url = f"{server.base}{route}"
    if body["stream"]:
        events_before_leaving = rng.randint(0, 8) if leave else None
        with client.stream("POST", url, json=body, headers=server.auth, timeout=120) as response:
            status = response.status_code
            with tally.lock:
                tally.statuses[status] += 1
            if status == 429:
                tally.add(retried_after=1)
                time.sleep(float(response.headers.get("retry-after", "1")))
                return status
            seen = 0
            for line in response.iter_lines():
                if line.startswith("data: "):
                    if line != "data: [DONE]":
                        orjson.loads(line[6:])          # whole JSON, or the soak fails
                    seen += 1
                    if events_before_leaving is not None and seen >= events_before_leaving:
                        tally.add(left=1)
                        return status                  # closing the stream drops the connection
        return status
    timeout = rng.uniform(0.005, 0.3) if leave else 120
    try:
        response = client.post(url, json=body, headers=server.auth, timeout=timeout)
    except httpx.TimeoutException:
        tally.add(left=1)
        return None
    with tally.lock:
        tally.statuses[response.status_code] += 1
    if response.status_code == 429:
        tally.add(retried_after=1)
        time.sleep(float(response.headers.get("retry-after", "1")))
    return response.status_code


def sampler(server: LiveServer, stop: threading.Event, every: float, samples: list, started: float) -> None:
    while not stop.wait(every):
        try:
            values = server.metrics()
        except httpx.HTTPError:
            continue
        samples.append({"t": time.monotonic() - started, "rss": values.get("process_resident_memory_bytes"),
                        "fds": values.get("process_open_fds"), "threads": values.get("process_threads"),
                        "running": values["tinyloop_generations_running"],
                        "waiting": values["tinyloop_generations_waiting"],
                        "admitted": values["tinyloop_admitted_total"]})


def drift(samples: list, warmup_s: float) -> dict:
    after = [s for s in samples if s["t"] >= warmup_s and s["rss"] is not None]
    if len(after) < 10:
        return {"samples": len(after)}
    tenth = max(1, len(after) // 10)
    first = sum(s["rss"] for s in after[:tenth]) / tenth
    last = sum(s["rss"] for s in after[-tenth:]) / tenth
    return {"samples": len(after), "rss_first_mb": first / 2**20, "rss_last_mb": last / 2**20,
            "rss_drift": (last - first) / first, "rss_max_mb": max(s["rss"] for s in after) / 2**20,
            "fds_start": after[0]["fds"], "fds_end": after[-1]["fds"], "fds_max": max(s["fds"] for s in after),
            "threads_start": after[0]["threads"], "threads_end": after[-1]["threads"],
            "threads_max": max(s["threads"] for s in after)}


def soak(args) -> tuple[dict, list[str]]:
    from tinyloop.model.testmodels import make_test_model
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "soak.tinyloop"
        make_test_model(path, "tiny-looped", seed=0, eos_token_ids=(), max_seq_len=512)
        env = {"TINYLOOP_MAX_WAITING": str(args.max_waiting), "TINYLOOP_KV_BUDGET_MB": str(args.kv_budget_mb)}
        with LiveServer(path, env=env) as server:
            with httpx.Client() as client:
                references = [probe_answer(client, server, route, body) for route, body in probes()]
            started = time.monotonic()
            deadline = started + args.minutes * 60
            tally, samples, stop = Tally(), [], threading.Event()
            watcher = threading.Thread(target=sampler, args=(server, stop, args.sample_s, samples, started))
            watcher.start()
            clients = [threading.Thread(target=client_loop, args=(server, args.seed * 100 + i, deadline, tally,
                                                                  references, args.leave))
                       for i in range(args.clients)]
            for thread in clients:
                thread.start()
            for thread in clients:
                thread.join()
            stop.set()
            watcher.join()
            # After the clients: wait until every admitted generation has settled.
            wait_until = time.monotonic() + 60
            while True:
                values = server.metrics()
                settled = summed(values, "tinyloop_settled_total")
                if (settled == values["tinyloop_admitted_total"] and values["tinyloop_generations_running"] == 0
                        and values["tinyloop_generations_waiting"] == 0) or time.monotonic() > wait_until:
                    break
                time.sleep(0.2)
            health = server.health()
            exit_status = server.stop(timeout=60)
            log = server.log()
    requests = sum(v for k, v in values.items() if k.startswith("tinyloop_requests_total{")
                   and any(f'route="{r}"' in k for r in GENERATION_ROUTES))
    completed = values.get('tinyloop_settled_total{end="completed"}', 0)
    cancelled = values.get('tinyloop_settled_total{end="cancelled"}', 0)
    failed = values.get('tinyloop_settled_total{end="failed"}', 0)
    refused = summed(values, "tinyloop_refused_total")
    measured = drift(samples, args.minutes * 60 * args.warmup)
    summary = {"minutes": args.minutes, "clients": args.clients, "sent": tally.sent, "left_on_purpose": tally.left,
               "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
               "retry_after_honoured": tally.retried_after,
               "probes": tally.probes, "server": {"requests": requests, "admitted": values["tinyloop_admitted_total"],
                                                  "completed": completed, "cancelled": cancelled, "failed": failed,
                                                  "refused": refused,
                                                  "disconnects": values["tinyloop_client_disconnects_total"]},
               "kv_pool": {"budget_mb": args.kv_budget_mb,
                           "prefix_cache_evictions": values.get("tinyloop_prefix_cache_evictions_total", 0),
                           "prefix_cache_hit_tokens": values.get('tinyloop_prefix_cache_lookups_total{outcome="hit"}', 0),
                           "cached_blocks_at_end": values.get("tinyloop_prefix_cache_blocks", 0)},
               "drift": measured, "exit_status": exit_status}
    if requests != completed + cancelled + refused:
        problems.append(f"metrics do not add up: {requests:.0f} requests != {completed:.0f} completed + "
                        f"{cancelled:.0f} cancelled + {refused:.0f} refused")
    if values["tinyloop_admitted_total"] != completed + cancelled + failed:
        problems.append("admitted generations not all settled")
    held = values.get('tinyloop_kv_blocks{state="held"}', 0)
    if held or values.get("tinyloop_kv_reserved_blocks", 0):
        problems.append(f"the KV pool still holds {held:.0f} block(s) and "
                        f"{values.get('tinyloop_kv_reserved_blocks', 0):.0f} reserved with nothing running")
    if failed:
        problems.append(f"{failed:.0f} generation(s) failed")
    if tally.probe_mismatches:
        problems.append(f"{len(tally.probe_mismatches)} greedy probe(s) differed from the reference, first: "
                        f"{tally.probe_mismatches[0]}")
    if tally.errors:
        problems.append(f"{len(tally.errors)} client error(s), first: {tally.errors[0]}")
    if any(status >= 500 for status in tally.statuses):
        problems.append(f"5xx answers: {dict(tally.statuses)}")
    if health is None or health[0] != 200:
        problems.append(f"/health after the soak: {health}")
    if exit_status != 0:
        problems.append(f"granian exited with {exit_status} on SIGTERM")
    if "Traceback" in log:
        problems.append("a traceback in the server log")
    if "rss_drift" not in measured:
        problems.append(f"too few samples after warm-up ({measured['samples']}) to measure drift")
    else:
        if measured["rss_drift"] > args.rss_drift:
            problems.append(f"RSS grew {measured['rss_drift']:.1%} after warm-up (bound {args.rss_drift:.0%})")
        if measured["fds_end"] - measured["fds_start"] > args.fd_slack:
            problems.append(f"open fds grew {measured['fds_start']:.0f} -> {measured['fds_end']:.0f}")
        if measured["threads_end"] - measured["threads_start"] > args.thread_slack:
            problems.append(f"threads grew {measured['threads_start']:.0f} -> {measured['threads_end']:.0f}")
    return summary, problems


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=15.0, help="length of the run (default 15)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients (default 4)")
    parser.add_argument("--max-waiting", type=int, default=2, help="TINYLOOP_MAX_WAITING (default 2: 429s happen)")
    parser.add_argument("--leave", type=float, default=0.25, help="share of requests left early (0.25)")
    parser.add_argument("--warmup", type=float, default=0.2, help="warm-up share of the run (0.2)")
    parser.add_argument("--rss-drift", type=float, default=0.05, help="RSS drift bound after warm-up (0.05)")
    parser.add_argument("--fd-slack", type=int, default=8, help="allowed growth of open fds (8)")
    parser.add_argument("--thread-slack", type=int, default=2, help="allowed growth of threads (2)")
    parser.add_argument("--kv-budget-mb", type=int, default=16,
                        help="TINYLOOP_KV_BUDGET_MB (default 16: the pool fills during warm-up)")
    parser.add_argument("--sample-s", type=float, default=2.0, help="seconds between samples (2)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the summary here")
    args = parser.parse_args(argv)
    summary, problems = soak(args)
    summary["problems"] = problems
    print(orjson.dumps(summary, option=orjson.OPT_INDENT_2).decode())
    if args.json:
        args.json.write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    d = summary["drift"]
    if "rss_drift" in d:
        print(f"RSS after warm-up {d['rss_first_mb']:.1f} -> {d['rss_last_mb']:.1f} MiB ({d['rss_drift']:+.2%}); "
              f"fds {d['fds_start']:.0f} -> {d['fds_end']:.0f}; threads {d['threads_start']:.0f} -> "
              f"{d['threads_end']:.0f}")
    for problem in problems:
        print(f"FAIL {problem}")
    print("OK" if not problems else f"{len(problems)} problem(s)")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
