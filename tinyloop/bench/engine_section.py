"""The engine figures: TinyLoop in a worker, beside llama.cpp on the same GGUF and/or
another checkout when asked, then speculative decoding and (full runs) diagnostics."""
from __future__ import annotations

import os
from pathlib import Path

from tinyloop.bench.figures import MAIN, figures_from, predicted_speedup
from tinyloop.bench.plan import make_items, make_settings
from tinyloop.bench.runner import run_rounds
from tinyloop.bench.stats import summarize
from tinyloop.bench.workers import Worker, WorkerError, llama_available

LLAMA = "llama.cpp"


def skipped(reason: str) -> dict:
    return {"status": "skipped", "reason": reason}


def _start_llama(args, info: dict, settings) -> tuple:
    """(worker or None, the engine's report entry)."""
    if not args.gguf:
        return None, skipped("no GGUF given: --gguf FILE, the GGUF this model was converted from "
                             "(llama.cpp runs on it through llama-cpp-python)")
    if not Path(args.gguf).is_file():
        return None, skipped(f"GGUF not found: {args.gguf}")
    if info["max_loops"] != 1:
        return None, skipped("this model loops (max_loops > 1); llama.cpp runs standard transformers only")
    reason = llama_available(args.llama_python)
    if reason:
        return None, skipped(reason)
    n_ctx = max(settings.prompt_lengths + [max(settings.context, settings.long_context or 0)
                                           + settings.decode_tokens]) + 64
    worker = None
    try:
        worker = Worker(LLAMA, "llama", python=args.llama_python)
        loaded = worker.ask(op="load", path=str(Path(args.gguf).resolve()), threads=args.threads, n_ctx=n_ctx)
    except WorkerError as exc:
        if worker:
            worker.close()
        return None, skipped(f"llama.cpp could not load {args.gguf}: {exc}")
    if loaded["vocab_size"] != info["vocab_size"]:
        worker.close()
        return None, skipped(f"the GGUF's vocabulary ({loaded['vocab_size']}) is not the model's "
                             f"({info['vocab_size']}): not the same model")
    return worker, {"status": "measured", "gguf": str(args.gguf), **loaded}


VERIFY_ROWS = 16


def _verify_and_memory(workers: dict, prompts: dict, settings) -> dict:
    """Per engine: one decode step against one 16-row forward (a verify pass's cost, or a batch
    of 16 users' rows), at the decode context; and the worker's resident memory after all runs."""
    context = prompts["single"][:settings.context]
    out = {}
    for name, worker in workers.items():
        try:
            out[name] = {"verify": worker.ask(op="verify_cost", prompt=context, rows=VERIFY_ROWS,
                                              repeats=max(3, settings.rounds)),
                         "memory": worker.ask(op="memory")}
        except WorkerError as exc:
            out[name] = {"error": str(exc)}
    return out


def _diagnostics(workers: dict, settings, info: dict, prompts: dict) -> dict:
    out = {}
    main = workers[MAIN]
    if info["backend"].startswith("cpu"):          # the share needs host-timed products, a GPU queues them
        context = prompts["single"][:settings.context]
        shares = [main.ask(op="matmul_share", prompt=context, steps=4 * settings.decode_tokens,
                           loops=info["default_loops"])["value"] for _ in range(settings.rounds)]
        out["matmul_share"] = {"loops": info["default_loops"], "share": summarize(shares)}
    chains = [s for s in settings.speculative if s[3] == 1]
    if chains:                                  # the chain drafting nearest half the verify loops
        draft, verify = min(chains, key=lambda s: abs(s[0] - s[1] / 2))[:2]
        sizes = [1, 2, 3, 5, 9] + ([17] if info["dim"] <= 512 else [])
        seconds = main.ask(op="cost_model", draft_loops=draft, verify_loops=verify, context=settings.context,
                           sizes=sizes, repeats=5)
        out["cost_model"] = {"draft_loops": draft, "verify_loops": verify, "context": settings.context,
                             "seconds": seconds, "predicted_speedup": {
                                 str(k): {str(a): predicted_speedup(seconds, k, a) for a in (0.5, 0.7, 0.9)}
                                 for k in (2, 4, 8) if str(k + 1) in seconds["verify"]}}
    return out


def engine_section(args, model_path: str, progress: bool = True) -> dict:
    """-> {"model", "settings", "engines", "sections", "figures", "diagnostics"}."""
    workers = {}
    try:
        workers[MAIN] = Worker(MAIN, "tinyloop")
        info = workers[MAIN].ask(op="load", path=model_path, device=args.device, kv_modes=args.kv_cache)
        info["path"] = model_path
        settings = make_settings(args, info)
        engines = {MAIN: {"status": "measured", "checkout": "this"}}
        tinyloops = [MAIN]
        if args.baseline:
            workers["baseline"] = Worker("baseline", "tinyloop", root=args.baseline)
            workers["baseline"].ask(op="load", path=model_path, device=args.device, kv_modes=args.kv_cache)
            engines["baseline"] = {"status": "measured", "checkout": str(Path(args.baseline).resolve())}
            tinyloops.append("baseline")
        llama, engines[LLAMA] = _start_llama(args, info, settings)
        if llama:
            workers[LLAMA] = llama
        longest = max(settings.prompt_lengths + [settings.context, settings.long_context or 0])
        prompts = {"single": workers[MAIN].ask(op="prompt_ids", count=longest)["prompts"][0],
                   "several": workers[MAIN].ask(op="prompt_ids", count=settings.context,
                                                prompts=settings.speculative_prompts)["prompts"]}
        items = make_items(settings, info, tinyloops, LLAMA if llama else None)
        results = run_rounds(workers, items, settings, prompts, progress)
        if settings.speculative:
            speculative = {"status": "measured"}
        elif info["max_loops"] == 1:
            speculative = skipped("the model has one loop (max_loops = 1): there is nothing to draft with")
        else:
            speculative = skipped("--no-speculative" if args.no_speculative else "no speculative settings")
        sections = {"engine": {"status": "measured"}, "speculative": speculative}
        diagnostics = _diagnostics(workers, settings, info, prompts) if settings.diagnostics else {}
        diagnostics["verify_and_memory"] = _verify_and_memory(workers, prompts, settings)
    finally:
        for worker in workers.values():
            worker.close()
    figures = figures_from(items, results, info["kv_mode"])
    return {"model": info, "settings": settings.to_dict(), "engines": engines, "sections": sections,
            "figures": figures, "diagnostics": diagnostics,
            "exact": all(row.get("equal_to_plain", True) for row in figures),
            "disturbed_runs": sum(row["disturbed_runs"] for row in figures)}


def threads_default() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
