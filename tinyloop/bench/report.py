"""A bench report as readable tables (plain text or Markdown); the JSON is the report itself."""
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
