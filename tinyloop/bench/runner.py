"""Interleaved rounds: every engine runs every measurement once per round, in turn.

Drift on a noisy machine (another process, a clock change, a thermal limit) then hits
every engine alike, and a ratio of two engines' runs in the same round compares like
with like. Before each run the machine is left quiet for `settle` seconds, so the
previous engine's BLAS threads stop spinning; the order of the engines rotates from
one round to the next, so neither always runs right after the other. Each run records
how much of the CPUs other processes took meanwhile (interference.py).
"""
from __future__ import annotations

import sys
import time

from tinyloop.bench.interference import Meter


def with_prompts(command: dict, prompts: dict) -> dict:
    """The worker command with its prompt(s) as token ids: `prompt` (a length) becomes
    that many ids, `prompts` (a count) that many different prompts of the context length."""
    out = dict(command)
    if "prompt" in out:
        out["prompt"] = prompts["single"][:out["prompt"]]
    if "prompts" in out:
        out["prompts"] = prompts["several"][:out["prompts"]]
    return out


def run_rounds(workers: dict, items: list, settings, prompts: dict, progress=True) -> dict:
    """-> {item key: {worker name: [result of each timed run]}}."""
    results = {item.key: {name: [] for name in item.engines} for item in items}
    commands = {item.key: with_prompts(item.command, prompts) for item in items}
    total = settings.rounds + settings.warmup
    for round_index in range(total):
        timed = round_index >= settings.warmup
        if progress:
            what = f"round {round_index - settings.warmup + 1}/{settings.rounds}" if timed else "warm-up"
            print(f"tinyloop bench: {what} ({len(items)} measurements)", file=sys.stderr, flush=True)
        for item in items:
            shift = round_index % len(item.engines)
            for name in item.engines[shift:] + item.engines[:shift]:
                time.sleep(settings.settle)
                minimum = settings.min_seconds if timed else settings.min_seconds / 5
                worker = workers[name]
                with Meter(getattr(worker, "pid", 0)) as meter:
                    answer = worker.ask(**commands[item.key], min_seconds=minimum)
                answer["others_cpu_share"] = meter.share
                if timed:
                    results[item.key][name].append(answer)
    return results

