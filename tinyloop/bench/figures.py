"""Raw runs -> figures: each the median of its runs with min and max, and ratios of
engines measured in the same rounds."""
from __future__ import annotations

import statistics

from tinyloop.bench.interference import DISTURBED
from tinyloop.bench.stats import ratio, summarize

MAIN = "TinyLoop"


def _figure(figure: str, label: str, unit: str, better: str, params: dict, per_engine: dict,
            runs: dict) -> dict:
    engines = {name: summarize(values) for name, values in per_engine.items() if values}
    ratios = {f"{MAIN} / {name}": ratio(engines[MAIN], engines[name]) for name in engines if name != MAIN}
    shares = [r.get("others_cpu_share") for name in per_engine for r in runs[name]]
    known = [s for s in shares if s is not None]
    return {"figure": figure, "label": label, "unit": unit, "better": better, "params": params,
            "engines": engines, "ratios": ratios,
            "others_cpu_share_max": max(known) if known else None,
            "disturbed_runs": sum(s > DISTURBED for s in known)}


def figures_from(items: list, results: dict, model_kv_mode: str) -> list:
    """model_kv_mode: the model's own KV cache mode; figures in another mode say theirs."""
    rows = []
    for item in items:
        runs, p = results[item.key], item.params
        kv = f", {p['kv_mode']} KV" if p.get("kv_mode", model_kv_mode) != model_kv_mode else ""
        op = item.command["op"]
        if op == "prefill":
            rows.append(_figure("prefill", f"prefill, {p['prompt_tokens']}-token prompt{kv}", "tok/s", "higher", p,
                                {name: [r["value"] for r in runs[name]] for name in item.engines}, runs))
        elif op == "generate":
            rows.append(_figure("decode", f"decode after {p['prompt_tokens']} tokens, loops {p['loops']}{kv}", "tok/s",
                                "higher", p,
                                {name: [r["decode_tok_s"] for r in runs[name]] for name in item.engines}, runs))
            rows.append(_figure("ttft", f"time to first token, {p['prompt_tokens']}-token prompt, loops "
                                        f"{p['loops']}{kv}", "ms", "lower", p,
                                {name: [r["ttft_ms"] for r in runs[name]] for name in item.engines}, runs))
        elif op == "speculative":
            mine = runs[item.engines[0]]
            name = "tree" if p["K_branches"] > 1 else "speculative"
            row = _figure(p["mode"], f"{name} d{p['draft_loops']}/v{p['verify_loops']}, ahead {p['draft_ahead']}"
                                     f"{', K ' + str(p['K_branches']) if p['K_branches'] > 1 else ''}",
                          "tok/s", "higher", p, {MAIN: [r["tok_s"] for r in mine]},
                          {MAIN: mine})
            plain = summarize([r["plain_tok_s"] for r in mine])
            row.update(plain=plain, ratios={f"{MAIN} / plain at verify loops": ratio(row["engines"][MAIN], plain)},
                       acceptance=statistics.median(r["acceptance"] for r in mine),
                       accepted_per_round=statistics.median(r["accepted_per_round"] for r in mine),
                       equal_to_plain=all(r["equal_to_plain"] for r in mine))
            rows.append(row)
    return rows


def predicted_speedup(costs: dict, chain: int, acceptance: float) -> float | None:
    """Speedup of a chain of `chain` drafts over plain decoding, if each drafted token is
    accepted with probability `acceptance` independently: the expected tokens per round
    (1 - a^(k+1)) / (1 - a), times a plain step, over k draft steps and one verify pass
    over k + 1 tokens."""
    verify = costs["verify"].get(str(chain + 1))
    if verify is None:
        return None
    tokens = (1 - acceptance ** (chain + 1)) / (1 - acceptance) if acceptance < 1 else chain + 1
    return tokens * costs["plain"] / (chain * costs["draft"] + verify)
