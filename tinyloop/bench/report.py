"""A bench report as readable tables (plain text or Markdown); the JSON is the report itself.

The serving scenarios' JSON (`tinyloop bench --concurrency ... --chat-turns ... --json`).
A summary below is {"median", "min", "max", "runs"} over the rounds; a ratio is
{"median", "min", "max"}: the ratio of the medians, and the range of the per-round ratios.

report["concurrency"]:
  status: measured | skipped | failed (then reason)
  settings: model, gguf, threads, rounds, settle, levels [N ...], prompt_tokens (the text's
    tokens; the chat template adds some: see prompt_tokens below), decode_tokens,
    interference_streams, long_prompt, interference_budget (tokens each running stream may
    take), before_s, route, sampling, tinyloop_end_of_sequence (how end of sequence was
    ignored on `tinyloop serve`: its ignore_eos field, or logit_bias -100 on the eos ids)
  levels: one per N, {concurrency: N, servers: {KEY: {tokens_per_s, ttft_p50_ms, ttft_p99_ms,
    itl_p50_ms, itl_p99_ms (summaries), statuses [{status: count} per round],
    unattributed_tokens (tokens no event accounted for), prompt_tokens (median, by usage)}},
    ratios: {"tinyloop / tinyloop_1": {measure: ratio}, "tinyloop / llama_server": {...}}}
    where KEY is tinyloop (TINYLOOP_MAX_RUNNING=N), tinyloop_1 (TINYLOOP_MAX_RUNNING=1; at
    N = 1 the same server and runs) or llama_server (-np N)
  interference: {status, streams (K), long_prompt, stream_budget, servers: {tinyloop |
    llama_server: {long_ttft_ms, itl_window_p50_ms, itl_window_p99_ms, itl_window_max_ms,
    itl_before_p50_ms, window_tokens (summaries), window_s, long_prompt_tokens,
    streams_ended_early, window_gaps (per round)}}, ratios: {"tinyloop / llama_server": ...}}
  llama_server: {status: measured | skipped | failed, reason, path, version, contexts {N: -c}}
  problems: [{scenario, server, round, concurrency | turn | question, stream, status, tokens,
    error (the body or error event), expected_tokens (when it came back short)}]

report["chat"]:
  status, settings (model, gguf, threads, rounds, settle, turns, system_tokens, answer_tokens,
    route, sampling, tinyloop_end_of_sequence), llama_server, problems: as above
  servers: {tinyloop_cache | tinyloop_cold | llama_server: {
    turns: [{turn, ttft_ms (summary), cached_tokens (median), cached_tokens_runs, prompt_tokens}],
    second_question: {first_ttft_ms, later_ttft_ms (the median of questions 2.. per round),
      "later / first" (summaries), first_cached_tokens, later_cached_tokens, prompt_tokens}}}
  ratios: {"tinyloop_cache / tinyloop_cold" | "tinyloop_cache / llama_server": {turns: [ratio per
    turn], second_question_first, second_question_later}}
  others_share (per run: a server's conversation and second questions), disturbed_runs: as above

report["sections"] gains concurrency, chat and llama-server: {status, reason}.
"""
from __future__ import annotations

from tinyloop.bench.figures import MAIN
from tinyloop.bench.interference import DISTURBED
from tinyloop.bench.machine import one_line


def number(value) -> str:
    if value is None:
        return "—"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def count(value) -> str:
    """A token count: whole numbers without decimals."""
    if value is None:
        return "—"
    return f"{value:,.0f}" if float(value).is_integer() or abs(value) >= 100 else f"{value:.1f}"


def spread(summary: dict | None) -> str:
    """median (min–max)"""
    if not summary:
        return ""
    if summary.get("min") is None:
        return number(summary["median"])
    return f"{number(summary['median'])} ({number(summary['min'])}–{number(summary['max'])})"


class Table:
    def __init__(self, headers: list):
        self.headers, self.rows = headers, []

    def add(self, *cells) -> None:
        self.rows.append([str(c) for c in cells])

    def text(self) -> str:
        widths = [max(len(r[i]) for r in [self.headers] + self.rows) for i in range(len(self.headers))]
        lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(self.headers, widths)))]
        for row in self.rows:
            lines.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))))
        return "\n".join(lines)

    def markdown(self) -> str:
        lines = ["| " + " | ".join(self.headers) + " |", "|" + "---|" * len(self.headers)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in self.rows]
        return "\n".join(lines)


def engine_table(report: dict) -> Table | None:
    rows = [r for r in report.get("figures", []) if r["figure"] in ("prefill", "decode", "ttft")]
    if not rows:
        return None
    others = [name for name in report["engines"] if name != MAIN and report["engines"][name]["status"] == "measured"]
    table = Table(["figure", MAIN] + others + [f"{MAIN} / {o}" for o in others])
    for row in rows:
        cells = [spread(row["engines"].get(name)) for name in [MAIN] + others]
        cells += [spread(row["ratios"].get(f"{MAIN} / {o}")) for o in others]
        table.add(f"{row['label']} ({row['unit']})", *cells)
    return table


def speculative_table(report: dict) -> Table | None:
    rows = [r for r in report.get("figures", []) if r["figure"] in ("speculative", "tree_speculative")]
    if not rows:
        return None
    table = Table(["setting", "tok/s", "plain at verify loops", "vs plain", "acceptance", "accepted / round",
                   "tokens = plain"])
    for row in rows:
        table.add(row["label"], spread(row["engines"][MAIN]), spread(row["plain"]),
                  spread(row["ratios"][f"{MAIN} / plain at verify loops"]), f"{row['acceptance']:.2f}",
                  f"{row['accepted_per_round']:.2f}", "yes" if row["equal_to_plain"] else "NO")
    return table


def http_table(http: dict) -> Table:
    mine, other = http["servers"]
    table = Table(["measure", mine, other, f"{mine} / {other}", "engine alone, in-process"])
    for row in http["rows"]:
        table.add(row["label"], spread(row["servers"][mine]), spread(row["servers"][other]), spread(row["ratio"]),
                  number(row["engine_alone"]["median"]) if row["engine_alone"] else "")
    return table


SERVING_MEASURES = (("tokens_per_s", "aggregate tokens/s (all streams)"),
                    ("ttft_p50_ms", "time to first token p50 (ms)"), ("ttft_p99_ms", "time to first token p99 (ms)"),
                    ("itl_p50_ms", "inter-token latency p50 (ms)"), ("itl_p99_ms", "inter-token latency p99 (ms)"))
INTERFERENCE_ROWS = (("long_ttft_ms", "long prompt: time to first token (ms)"),
                     ("itl_before_p50_ms", "running streams: inter-token latency p50 before it (ms)"),
                     ("itl_window_p50_ms", "running streams: inter-token latency p50 in the window (ms)"),
                     ("itl_window_p99_ms", "running streams: inter-token latency p99 in the window (ms)"),
                     ("itl_window_max_ms", "running streams: largest gap in the window (ms)"),
                     ("window_tokens", "running streams: tokens out in the window"))


def _median_of(summary: dict | None, key: str):
    entry = (summary or {}).get(key)
    return entry["median"] if isinstance(entry, dict) else entry


def concurrency_tables(section: dict) -> list:
    """(title, Table) per measure of the sweep, then the interference table."""
    llama = any("llama_server" in level["servers"] for level in section["levels"])
    out = []
    for measure, label in SERVING_MEASURES:
        headers = ["N", "TinyLoop (max_running N)", "TinyLoop (max_running 1)"] + \
            (["llama-server (-np N)"] if llama else []) + ["TinyLoop(N) / TinyLoop(1)"] + \
            (["TinyLoop(N) / llama-server(N)"] if llama else [])
        table = Table(headers)
        for level in section["levels"]:
            servers, ratios = level["servers"], level["ratios"]
            cells = [spread(servers["tinyloop"][measure]), spread(servers["tinyloop_1"][measure])]
            if llama:
                cells.append(spread((servers.get("llama_server") or {}).get(measure)))
            cells.append(spread(ratios["tinyloop / tinyloop_1"][measure]))
            if llama:
                cells.append(spread((ratios.get("tinyloop / llama_server") or {}).get(measure)))
            table.add(level["concurrency"], *cells)
        out.append((label, table))
    interference = section.get("interference") or {}
    if interference.get("status") == "measured":
        servers = interference["servers"]
        names = [k for k in ("tinyloop", "llama_server") if servers.get(k)]
        k = interference["streams"]
        labels = {"tinyloop": f"TinyLoop (max_running {k + 1})", "llama_server": f"llama-server (-np {k + 1})"}
        table = Table(["measure"] + [labels[n] for n in names] +
                      (["TinyLoop / llama-server"] if interference.get("ratios") else []))
        for measure, label in INTERFERENCE_ROWS:
            cells = [spread(servers[n][measure]) for n in names]
            if interference.get("ratios"):
                cells.append(spread(interference["ratios"]["tinyloop / llama_server"].get(measure)))
            table.add(label, *cells)
        windows = {labels[n]: number(sorted(servers[n]["window_s"])[len(servers[n]["window_s"]) // 2] * 1000)
                   for n in names}
        prompt = {labels[n]: servers[n]["long_prompt_tokens"][0] for n in names}
        out.append((f"long-prompt interference: {k} streams running, then one request with a "
                    f"{interference['long_prompt']}-token prompt ({', '.join(f'{n}: {p} prompt tokens' for n, p in prompt.items())}); "
                    f"window = its arrival to its first token (median {', '.join(f'{n} {w} ms' for n, w in windows.items())}); "
                    f"a stream's gap still open at the window's end counts", table))
    return out


def chat_tables(section: dict) -> list:
    servers, ratios = section["servers"], section["ratios"]
    llama = "llama_server" in servers
    headers = ["turn", "prompt tokens", "TinyLoop, prefix cache (ms)", "cached tokens",
               "TinyLoop, no prefix cache (ms)", "cache / no cache"]
    if llama:
        headers += ["llama-server (ms)", "llama-server cached", "TinyLoop cache / llama-server"]
    table = Table(headers)
    for index, turn in enumerate(servers["tinyloop_cache"]["turns"]):
        cold = servers["tinyloop_cold"]["turns"][index]
        cells = [count(turn["prompt_tokens"]), spread(turn["ttft_ms"]), count(turn["cached_tokens"]),
                 spread(cold["ttft_ms"]), spread(ratios["tinyloop_cache / tinyloop_cold"]["turns"][index])]
        if llama:
            other = servers["llama_server"]["turns"][index]
            cells += [spread(other["ttft_ms"]), count(other["cached_tokens"]),
                      spread(ratios["tinyloop_cache / llama_server"]["turns"][index])]
        table.add(turn["turn"], *cells)
    out = [(f"multi-turn chat: time to first token per turn ({section['settings']['system_tokens']}-token system "
            f"prompt, {section['settings']['answer_tokens']}-token answers; prompt tokens and cached tokens: "
            f"TinyLoop's usage, medians)", table)]
    labels = {"tinyloop_cache": "TinyLoop, prefix cache", "tinyloop_cold": "TinyLoop, no prefix cache",
              "llama_server": "llama-server (-np 1)"}
    turns = section["settings"]["turns"]
    second = Table(["server", "question 1 (ms)", f"questions 2–{turns}, median (ms)", "later / first",
                    "cached tokens, question 1", "cached tokens, later"])
    for key, label in labels.items():
        if key not in servers:
            continue
        q = servers[key]["second_question"]
        second.add(label, spread(q["first_ttft_ms"]), spread(q["later_ttft_ms"]), spread(q["later / first"]),
                   count(q["first_cached_tokens"]), count(q["later_cached_tokens"]))
    if llama:
        r = ratios["tinyloop_cache / llama_server"]
        second.add("TinyLoop, prefix cache / llama-server", spread(r["second_question_first"]),
                   spread(r["second_question_later"]), "", "", "")
    prompt = servers["tinyloop_cache"]["second_question"]["prompt_tokens"]
    out.append((f"a second question on the same system prompt: {turns} one-question conversations "
                f"(~{count(prompt)} prompt tokens each), time to first token", second))
    return out


def _problem_lines(section: dict) -> list:
    lines = []
    if section.get("disturbed_runs"):
        lines.append(f"WARNING: other processes used more than {DISTURBED:.0%} of the CPUs during "
                     f"{section['disturbed_runs']} runs of this section ('others_share' in --json).")
    problems = section.get("problems") or []
    if not problems:
        return lines
    lines += [f"PROBLEMS: {len(problems)} streams failed or came back short (all in --json 'problems'); the first:"]
    for p in problems[:5]:
        where = ", ".join(f"{k} {p[k]}" for k in ("scenario", "server", "concurrency", "round", "turn", "question",
                                                   "stream") if k in p)
        lines.append(f"  {where}: status {p.get('status')}, {p.get('tokens')} tokens"
                     + (f" of {p['expected_tokens']}" if "expected_tokens" in p else "")
                     + (f", {p['error']}" if p.get("error") else ""))
    return lines


def serving_lines(report: dict, show) -> list:
    out = []
    section = report.get("concurrency")
    if section:
        out.append("")
        if section["status"] == "measured":
            s = section["settings"]
            llama = section.get("llama_server") or {}
            prompts = [level["servers"]["tinyloop"]["prompt_tokens"] for level in section["levels"]]
            out.append(f"serving, concurrency sweep ({s['route']}; N concurrent streams of {s['decode_tokens']} tokens "
                       f"on N keep-alive connections, a different prompt each (~{s['prompt_tokens']} tokens of text, "
                       f"{count(prompts[0]) if prompts and prompts[0] is not None else '?'} with the chat template); {s['sampling']} "
                       f"(tinyloop serve: {s.get('tinyloop_end_of_sequence', '?').split(' (')[0]}; llama-server: "
                       f"ignore_eos); median of {s['rounds']} rounds after a warm-up (min–max), servers taking turns; "
                       f"tokens/s: all tokens / first request sent to last stream ended)")
            if llama.get("status") == "measured":
                out.append(f"llama-server {llama.get('version', '?')}, {s['threads']} threads, {s['gguf']}")
            else:
                out.append(f"llama-server: {llama.get('status')} — {llama.get('reason')}")
            for title, table in concurrency_tables(section):
                out += ["", title, show(table)]
            interference = section.get("interference") or {}
            if interference.get("status") != "measured":
                out += ["", f"long-prompt interference: {interference.get('status')} — {interference.get('reason')}"]
            out += _problem_lines(section)
        else:
            out.append(f"serving, concurrency sweep: {section['status']} — {section['reason']}")
    section = report.get("chat")
    if section:
        out.append("")
        if section["status"] == "measured":
            s = section["settings"]
            llama = section.get("llama_server") or {}
            out.append(f"serving, chat ({s['route']}; {s['sampling']}; TinyLoop with TINYLOOP_PREFIX_CACHE=1 and =0, "
                       f"llama-server -np 1 with cache_prompt; a fresh system prompt each round; median of "
                       f"{s['rounds']} rounds after a warm-up (min–max))")
            if llama.get("status") != "measured":
                out.append(f"llama-server: {llama.get('status')} — {llama.get('reason')}")
            for title, table in chat_tables(section):
                out += ["", title, show(table)]
            out += _problem_lines(section)
        else:
            out.append(f"serving, chat: {section['status']} — {section['reason']}")
    return out


def render(report: dict, markdown: bool = False) -> str:
    show = (lambda t: t.markdown()) if markdown else (lambda t: t.text())
    out = [f"machine: {one_line(report['machine'])}"]
    model, settings = report.get("model"), report.get("settings")
    if model:
        out.append(f"model: {model['path']} ({model['name']}; loops {model['min_loops']}–{model['max_loops']}, "
                   f"default {model['default_loops']}; {model['quantization']}; KV cache {model['kv_mode']}; "
                   f"{model['backend'].split(' (')[0]} backend)")
        out.append(f"each figure: the median of {settings['rounds']} runs after {settings['warmup']} warm-up "
                   f"(min–max); engines take turns within each round, {settings['settle']} s of quiet before each "
                   f"run; greedy, end-of-sequence ignored; decode after a {settings['context']}-token prompt, "
                   f"{settings['decode_tokens']} tokens")
    for name, engine in report.get("engines", {}).items():
        if name == "llama.cpp" and engine["status"] == "measured":
            out.append(f"llama.cpp: llama-cpp-python {engine['version']}, {engine['threads']} threads, "
                       f"{engine['gguf']}")
        elif engine["status"] != "measured":
            out.append(f"{name}: {engine['status']} — {engine['reason']}")
    for title, table in (("", engine_table(report)), ("speculative decoding (decode tok/s)",
                                                      speculative_table(report))):
        if table:
            out += ["", title] if title else [""]
            out.append(show(table))
    if report.get("disturbed_runs"):
        out += ["", f"WARNING: other processes used more than {DISTURBED:.0%} of the CPUs during "
                    f"{report['disturbed_runs']} runs (per figure: 'disturbed_runs' in --json); their minima and "
                    f"maxima show it. Rerun on a quiet machine for figures that describe it."]
    section = report.get("sections", {}).get("speculative")
    if section and section["status"] != "measured":
        out += ["", f"speculative decoding: {section['status']} — {section['reason']}"]
    diagnostics = report.get("diagnostics")
    if diagnostics:
        out.append("")
        out += diagnostic_lines(diagnostics)
    http = report.get("http")
    if http:
        out.append("")
        if http["status"] == "measured":
            s = http["settings"]
            out.append(f"HTTP layer ({s['route']}, {s['model']}; {s['clients']} clients, {s['requests']} 1-token "
                       f"requests per round, {s['streams']} streams of {s['stream_tokens']} tokens; "
                       f"max_waiting {s['max_waiting']}; event loop {s['event_loop']}; median of {s['rounds']} rounds; "
                       f"{'every response 200' if http['all_200'] else 'NOT every response was 200: see statuses'})")
            out.append(show(http_table(http)))
        else:
            out.append(f"HTTP layer: {http['status']} — {http['reason']}")
    out += serving_lines(report, show)
    return "\n".join(out)


def diagnostic_lines(diagnostics: dict) -> list:
    lines = []
    for name, entry in diagnostics.get("verify_and_memory", {}).items():
        if "error" in entry:
            lines.append(f"{name}: verify cost and memory not measured — {entry['error']}")
            continue
        v, m = entry["verify"], entry["memory"]
        rss = f"{m['rss_mb']:.0f} MB" if m.get("rss_mb") is not None else "?"
        lines.append(f"{name}: a {v['rows']}-row forward costs {v['ratio']:.2f} decode steps "
                     f"({v['verify_s'] * 1000:.2f} ms against {v['decode_s'] * 1000:.2f} ms); resident memory "
                     f"{rss}, peak {m['peak_rss_mb']:.0f} MB")
    share = diagnostics.get("matmul_share")
    if share:
        lines.append(f"decode / matrix products alone, step by step (loops {share['loops']}): "
                     f"{spread(share['share'])} — the share of a decode step spent in the linear layers")
    costs = diagnostics.get("cost_model")
    if costs:
        plain = costs["seconds"]["plain"]
        verify = ", ".join(f"n={n}: {s / plain:.2f}" for n, s in costs["seconds"]["verify"].items())
        lines.append(f"cost model at d={costs['draft_loops']}, v={costs['verify_loops']} (one plain step = "
                     f"{plain * 1000:.2f} ms): draft step {costs['seconds']['draft'] / plain:.2f}; verify pass over "
                     f"n tokens {verify}")
        for chain, speedups in costs["predicted_speedup"].items():
            lines.append(f"  predicted speedup, chain of {chain}: " + ", ".join(
                f"acceptance {a}: {number(s)}" for a, s in speedups.items()))
    return lines
