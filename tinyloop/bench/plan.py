"""What a bench run measures: its settings (quick or full, adapted to the model) and the
list of measurements, each a worker command and the engines that run it."""
from __future__ import annotations

from dataclasses import dataclass, field

from tinyloop.errors import TinyLoopError
from tinyloop.limits import MAX_BRANCHES, MAX_DRAFT_AHEAD, MAX_TREE_NODES


@dataclass
class Settings:
    quick: bool
    rounds: int                 # timed runs per figure (the median is reported, with min and max)
    warmup: int                 # untimed runs per figure first
    min_seconds: float          # a run repeats its measurement until this much timed work
    settle: float               # seconds of quiet before each run (the last engine's threads stop spinning)
    prompt_lengths: list        # prefill figures
    context: int                # prompt tokens before generation (time to first token)
    decode_tokens: int          # tokens generated per run
    loops: list                 # decode and time-to-first-token figures
    speculative: list           # (draft_loops, verify_loops, draft_ahead, K_branches)
    speculative_prompts: int
    kv_modes: list = field(default_factory=list)   # extra KV cache modes, besides the model's
    diagnostics: bool = False   # the speculative cost model and the decode / matrix products share
    long_context: int | None = None     # a second decode figure after this many prompt tokens

    def to_dict(self) -> dict:
        out = dict(self.__dict__)
        out["speculative"] = [dict(zip(("draft_loops", "verify_loops", "draft_ahead", "K_branches"), s))
                              for s in self.speculative]
        return out


@dataclass
class Item:
    key: str                    # unique within a run
    section: str                # engine | speculative
    command: dict               # the worker op and its arguments (prompt ids added by the runner)
    engines: list               # worker names that run it
    params: dict                # what the figure is at (prompt tokens, loops, setting ...)


def default_loops(info: dict) -> list:
    """The model's fewest, default and (up to twice the default) most loops."""
    low, default, high = info["min_loops"], info["default_loops"], info["max_loops"]
    return sorted({low, default, min(high, 2 * default)})


def default_speculative(info: dict, loops: list, quick: bool) -> list:
    """Chains drafting at a quarter, half and three quarters of the deepest measured loop
    count, a longer chain, and a tree; quick: one chain and one tree."""
    verify = max(loops)
    if verify <= info["min_loops"] or verify < 2:
        return []
    def draft(share):
        return min(max(info["min_loops"], round(verify * share)), verify - 1)
    half = draft(0.5)
    if quick:
        return [(half, verify, 4, 1), (half, verify, 4, 4)]
    settings = [(draft(0.25), verify, 4, 1), (half, verify, 4, 1), (draft(0.75), verify, 4, 1),
                (half, verify, 8, 1), (half, verify, 4, 4), (draft(0.75), verify, 6, 4)]
    return list(dict.fromkeys(settings))


def make_settings(args, info: dict) -> Settings:
    quick = args.quick
    loops = args.loops or default_loops(info)
    for n in loops:
        if not info["min_loops"] <= n <= info["max_loops"]:
            raise TinyLoopError(f"--loops {n} is outside the model's range [{info['min_loops']}, "
                                f"{info['max_loops']}]")
    room = info["max_seq_len"] - 1
    lengths = args.prompt_lengths or [n for n in ([32, 128] if quick else [32, 128, 512]) if n <= room]
    decode_tokens = args.decode_tokens or (16 if quick else 64)
    context = args.context or (64 if quick else 128)
    long_context = getattr(args, "long_context", None)
    if max(lengths) > room or max(context, long_context or 0) + decode_tokens > info["max_seq_len"]:
        raise TinyLoopError(f"prompt lengths and --context + --decode-tokens must fit the model's context of "
                            f"{info['max_seq_len']} tokens")
    if args.no_speculative:
        speculative = []
    else:
        speculative = args.speculative if args.speculative is not None else default_speculative(info, loops, quick)
        for d, v, ahead, k in speculative:
            if not (info["min_loops"] <= d < v <= info["max_loops"] and 1 <= ahead <= MAX_DRAFT_AHEAD
                    and 1 <= k <= MAX_BRANCHES and k * ahead <= MAX_TREE_NODES):
                raise TinyLoopError(f"--speculative {d},{v},{ahead},{k}: needs min_loops <= D < V <= max_loops "
                                    f"([{info['min_loops']}, {info['max_loops']}] here), 1 <= AHEAD <= "
                                    f"{MAX_DRAFT_AHEAD}, 1 <= K <= {MAX_BRANCHES} and K x AHEAD <= "
                                    f"{MAX_TREE_NODES}")
    return Settings(quick=quick, rounds=args.rounds or (3 if quick else 5), warmup=1,
                    min_seconds=0.05 if quick else 0.25, settle=args.settle if args.settle is not None else
                    (0.05 if quick else 0.3), prompt_lengths=lengths, context=context, long_context=long_context,
                    decode_tokens=decode_tokens, loops=loops, speculative=speculative,
                    speculative_prompts=2 if quick else 3, kv_modes=args.kv_cache or [],
                    diagnostics=not quick)


def make_items(settings: Settings, info: dict, tinyloops: list, llama: str | None) -> list:
    """tinyloops: the TinyLoop workers (this checkout, a baseline); llama: the llama.cpp
    worker's name, which runs the figures at one loop (a GGUF model has no loops)."""
    items = []
    base_loops = info["default_loops"]
    modes = [None] + [m for m in settings.kv_modes if m != info["kv_mode"]]
    for mode in modes:
        tag = f" [{mode} KV]" if mode else ""
        with_llama = tinyloops + ([llama] if llama and base_loops == 1 and mode is None else [])
        for n in settings.prompt_lengths:
            items.append(Item(f"prefill-{n}{tag}", "engine",
                              dict(op="prefill", prompt=n, loops=base_loops, kv_mode=mode), with_llama,
                              {"prompt_tokens": n, "loops": base_loops, "kv_mode": mode or info["kv_mode"]}))
        for loops in settings.loops:
            engines = tinyloops + ([llama] if llama and loops == 1 and mode is None else [])
            items.append(Item(f"generate-{loops}{tag}", "engine",
                              dict(op="generate", prompt=settings.context, tokens=settings.decode_tokens,
                                   loops=loops, kv_mode=mode), engines,
                              {"prompt_tokens": settings.context, "tokens": settings.decode_tokens, "loops": loops,
                               "kv_mode": mode or info["kv_mode"]}))
        if settings.long_context:               # decode over a long context: attention's share grows
            items.append(Item(f"generate-long{tag}", "engine",
                              dict(op="generate", prompt=settings.long_context, tokens=settings.decode_tokens,
                                   loops=base_loops, kv_mode=mode), with_llama,
                              {"prompt_tokens": settings.long_context, "tokens": settings.decode_tokens,
                               "loops": base_loops, "kv_mode": mode or info["kv_mode"]}))
    for d, v, ahead, k in settings.speculative:
        items.append(Item(f"speculative-{d}-{v}-{ahead}-{k}", "speculative",
                          dict(op="speculative", prompts=settings.speculative_prompts, tokens=settings.decode_tokens,
                               draft_loops=d, verify_loops=v, draft_ahead=ahead, branches=k), tinyloops[:1],
                          {"mode": "speculative" if k == 1 else "tree_speculative", "draft_loops": d,
                           "verify_loops": v, "draft_ahead": ahead, "K_branches": k,
                           "prompts": settings.speculative_prompts, "prompt_tokens": settings.context,
                           "tokens": settings.decode_tokens}))
    return items
