"""The bench as a chart (PNG): decode tokens/s by mode and loops, and prefill tokens/s by
prompt length, each bar the median with its min–max. Needs matplotlib (the `bench` extra)."""
from __future__ import annotations

from tinyloop.bench.figures import MAIN
from tinyloop.errors import TinyLoopError

MISSING = "--plot needs matplotlib, which is not installed: pip install -e '.[bench]' (or pip install matplotlib)"


def check_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise TinyLoopError(MISSING) from None


def _bars(axis, labels, summaries, colors, title, unit):
    medians = [s["median"] for s in summaries]
    low = [s["median"] - s["min"] for s in summaries]
    high = [s["max"] - s["median"] for s in summaries]
    positions = range(len(labels))
    axis.barh(list(positions), medians, xerr=[low, high], color=colors, capsize=3)
    axis.set_yticks(list(positions), labels)
    axis.invert_yaxis()
    axis.set_xlabel(unit)
    axis.set_title(title, fontsize=10)
    for y, value, summary in zip(positions, medians, summaries):
        axis.text(summary["max"], y, f"  {value:,.0f}" if value >= 100 else f"  {value:.1f}", va="center",
                  fontsize=8)
    axis.set_xlim(0, max(s["max"] for s in summaries) * 1.15)


def write_plot(report: dict, path: str) -> None:
    check_matplotlib()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {MAIN: "#3b6ea8", "baseline": "#9bb3cf", "llama.cpp": "#c9783a", "speculative": "#5a9e5a",
              "tree_speculative": "#8c5ab0"}
    decode, prefill = ([], [], []), ([], [], [])
    model_kv = report.get("model", {}).get("kv_mode")
    for row in report.get("figures", []):
        kv = row["params"].get("kv_mode", model_kv)
        kv = f", {kv} KV" if kv != model_kv else ""
        if row["figure"] == "decode":
            for name, summary in row["engines"].items():
                decode[0].append(f"{name}: plain, loops {row['params']['loops']}{kv}")
                decode[1].append(summary)
                decode[2].append(colors.get(name, "#777777"))
        elif row["figure"] in ("speculative", "tree_speculative"):
            decode[0].append(f"{MAIN}: {row['label']}")
            decode[1].append(row["engines"][MAIN])
            decode[2].append(colors[row["figure"]])
        elif row["figure"] == "prefill":
            for name, summary in row["engines"].items():
                prefill[0].append(f"{name}: {row['params']['prompt_tokens']} tokens{kv}")
                prefill[1].append(summary)
                prefill[2].append(colors.get(name, "#777777"))
    panels = [p for p in ((decode, "decode tokens/s by mode and loops"),
                          (prefill, "prefill tokens/s by prompt length")) if p[0][0]]
    if not panels:
        raise TinyLoopError("nothing to plot: the report has no engine figures")
    heights = [max(1.5, 0.32 * len(p[0][0]) + 0.8) for p in panels]
    figure, axes = plt.subplots(len(panels), 1, figsize=(9, sum(heights) + 0.6),
                                gridspec_kw={"height_ratios": heights}, squeeze=False)
    for axis, ((labels, summaries, bar_colors), title) in zip(axes[:, 0], panels):
        _bars(axis, labels, summaries, bar_colors, title, "tokens/s (median, bars: min–max)")
    model = report.get("model", {})
    figure.suptitle(f"tinyloop bench: {model.get('name', '')} on {report['machine']['cpu']}", fontsize=11)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
