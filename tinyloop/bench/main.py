"""`tinyloop bench`: the command's arguments, and one run from model to report."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tinyloop.argtypes import non_negative_int, non_negative_seconds, positive_int
from tinyloop.backends.select import DEVICES
from tinyloop.errors import TinyLoopError

DESCRIPTION = """\
Measure MODEL on this machine: prefill tokens/s at several prompt lengths, decode
tokens/s and time to first token at several loop counts, and for looped models
speculative and tree decoding at several settings with their acceptance rates. Each
figure is the median of several runs after a warm-up, with min and max; engines run in
worker processes of their own and take turns within every round.

With --gguf (and llama-cpp-python importable, here or by --llama-python), llama.cpp
runs the same prompts and token counts beside TinyLoop on that GGUF, greedy, and each
figure gets the ratio TinyLoop / llama.cpp. Unless --no-http, a tiny random model is
served by `tinyloop serve` and by a FastAPI + uvicorn + sse-starlette app calling the
same engine, under the same bounded load on loopback (needs the `bench` extra).

Serving scenarios, over HTTP on MODEL (each runs only when its flag is given;
--serving-only runs them alone, without the figures above):
  --concurrency N [N ...]  for each N, `tinyloop serve` at TINYLOOP_MAX_RUNNING=N, one at
      TINYLOOP_MAX_RUNNING=1 and (with --gguf and a llama-server binary) llama-server -np N
      take turns answering N concurrent streamed chat completions: greedy, end of sequence
      ignored, --decode-tokens tokens each (default 64), prompts of about --context tokens
      (default 128). Aggregate tokens/s, time to first token and inter-token latency
      p50/p99, with TinyLoop(N) / TinyLoop(1) and TinyLoop(N) / llama-server(N). Then
      --interference-streams K streams (default 7) run and a --long-prompt request (default
      4000 tokens) joins: the running streams' inter-token latency until its first token.
  --chat-turns N  a conversation of N turns on a --system-tokens system prompt (default
      1500), time to first token per turn with TinyLoop's prefix cache, without it
      (TINYLOOP_PREFIX_CACHE=0) and on llama-server with its prompt cache; then N
      one-question conversations on one system prompt (question 1 cold, the rest cached).
llama-server: --llama-server PATH, else `llama-server` on PATH, else where
scripts/build_llama_server.sh installs it; without one (or without --gguf) it is reported
as skipped, with how to build it.

MODEL: a .tinyloop file, `preset:NAME` for a seeded random preset (written once to
--cache-dir), or nothing for the default model (pulled on first use)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from tinyloop.bench.engine_section import threads_default
    from tinyloop.kv.modes import KV_MODES

    parser.add_argument("model", nargs="?", default=None,
                        help="a .tinyloop file, preset:NAME, or nothing for the default model")
    parser.add_argument("--quick", action="store_true", help="fewer, shorter runs: under a minute on a small model")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the report as JSON (progress goes to stderr)")
    output.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    parser.add_argument("--save", metavar="FILE", help="also write the JSON report to FILE")
    parser.add_argument("--plot", metavar="FILE.png", help="draw tokens/s by mode and loops (needs matplotlib)")
    parser.add_argument("--load", metavar="FILE", help="print (and --plot) a report saved by --save, measuring nothing")
    parser.add_argument("--gguf", metavar="FILE", help="run llama.cpp on this GGUF side by side (the GGUF the "
                                                       "model was converted from)")
    parser.add_argument("--llama-python", metavar="PATH", help="the Python interpreter that runs llama.cpp's worker "
                                                               "(one with llama-cpp-python; default: this one)")
    parser.add_argument("--threads", type=positive_int, default=threads_default(), metavar="N",
                        help="llama.cpp threads (default: the CPUs this process may use)")
    parser.add_argument("--baseline", metavar="CHECKOUT", help="another TinyLoop checkout, measured side by side")
    parser.add_argument("--no-http", action="store_true", help="skip the HTTP comparison")
    parser.add_argument("--http-only", action="store_true", help="only the HTTP comparison")
    parser.add_argument("--rounds", type=positive_int, default=None, metavar="N",
                        help="timed runs per figure (default 5, quick 3)")
    parser.add_argument("--settle", type=non_negative_seconds, default=None, metavar="SECONDS",
                        help="seconds of quiet before each run (default 0.3, quick 0.05)")
    parser.add_argument("--prompt-lengths", type=positive_int, nargs="+", default=None, metavar="N",
                        help="prefill prompt lengths (default 32 128 512, quick 32 128)")
    parser.add_argument("--context", type=positive_int, default=None, metavar="N",
                        help="prompt tokens before generation (default 128, quick 64; also the "
                             "--concurrency prompts' length)")
    parser.add_argument("--long-context", type=positive_int, default=None, metavar="N",
                        help="also decode after an N-token prompt (e.g. 4096: long-context decode beside llama.cpp)")
    parser.add_argument("--decode-tokens", type=positive_int, default=None, metavar="N",
                        help="tokens per generation (default 64, quick 16; also per --concurrency stream)")
    parser.add_argument("--loops", type=int, nargs="+", default=None, metavar="N",
                        help="loop counts for decode (default: the model's fewest, default and up to twice default)")
    parser.add_argument("--speculative", type=_setting, action="append", default=None, metavar="D,V,AHEAD,K",
                        help="a speculative setting: draft_loops,verify_loops,draft_ahead,K_branches (K 1: a chain; "
                             "repeatable; default: derived from the loops measured)")
    parser.add_argument("--no-speculative", action="store_true", help="skip speculative and tree decoding")
    parser.add_argument("--kv-cache", nargs="+", default=None, choices=KV_MODES, metavar="MODE",
                        help=f"also measure these KV cache modes ({', '.join(KV_MODES)})")
    parser.add_argument("--device", default=None, type=str.lower, choices=DEVICES,
                        help="TinyLoop's device: auto, cpu or cuda (default: $TINYLOOP_DEVICE or auto)")
    serving = parser.add_argument_group("serving scenarios (over HTTP, beside llama-server)")
    serving.add_argument("--concurrency", type=positive_int, nargs="+", default=None, metavar="N",
                         help="concurrency sweep: N concurrent streams at TINYLOOP_MAX_RUNNING=N, against "
                              "TINYLOOP_MAX_RUNNING=1 and llama-server -np N (e.g. 1 2 4 8 16)")
    serving.add_argument("--interference-streams", type=non_negative_int, default=7, metavar="K",
                         help="with --concurrency: K running streams, then one long prompt joins "
                              "(default 7; 0 skips it)")
    serving.add_argument("--long-prompt", type=positive_int, default=4000, metavar="N",
                         help="tokens of the prompt that joins the running streams (default 4000)")
    serving.add_argument("--chat-turns", type=_turns, default=None, metavar="N",
                         help="multi-turn chat: time to first token per turn, prefix cache on and off (N >= 2)")
    serving.add_argument("--system-tokens", type=positive_int, default=1500, metavar="N",
                         help="tokens of the chat scenarios' system prompt (default 1500)")
    serving.add_argument("--llama-server", metavar="PATH",
                         help="llama.cpp's llama-server binary (default: llama-server on PATH, else "
                              "~/.cache/tinyloop/llama-server/llama-server from scripts/build_llama_server.sh)")
    serving.add_argument("--serving-only", action="store_true",
                         help="only the serving scenarios: no engine figures, no HTTP layer comparison")
    parser.add_argument("--cache-dir", default=os.environ.get("TMPDIR", "/tmp"), metavar="DIR",
                        help="where preset:NAME models are written (default $TMPDIR or /tmp)")


def _setting(text: str) -> tuple:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 4:
        raise argparse.ArgumentTypeError(f"expected D,V,AHEAD,K (four integers), got {text!r}")
    return values


def _turns(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 2:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 2 (turn 1 has nothing cached to compare), "
                                         f"got {text!r}")
    return value


def resolve_model(name: str | None, cache_dir: str) -> str:
    if name is None:
        from tinyloop.convert.pull import ensure_default_model
        return str(ensure_default_model())
    if name.startswith("preset:"):
        import numpy as np

        from tinyloop.model.testmodels import PRESETS, make_test_model
        preset = name.split(":", 1)[1]
        if preset not in PRESETS:
            raise TinyLoopError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
        path = Path(cache_dir) / f"bench-{preset}-seed0.tinyloop"
        if not path.exists():
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise TinyLoopError(f"--cache-dir {cache_dir}: cannot create it: {exc.strerror or exc}") from exc
            make_test_model(path, preset, seed=0, dtype=np.float16 if preset == "doc-407m" else np.float32)
        return str(path)
    if not Path(name).is_file():
        raise TinyLoopError(f"model file not found: {name}")
    return str(Path(name).resolve())


def run(args) -> int:
    from tinyloop import __version__
    from tinyloop.bench.engine_section import engine_section
    from tinyloop.bench.machine import describe
    from tinyloop.bench.serving.compare import http_comparison

    if args.plot:
        from tinyloop.bench.plot import check_matplotlib
        check_matplotlib()                       # before minutes of measuring, not after
    if args.no_http and args.http_only:
        raise TinyLoopError("--no-http and --http-only exclude each other")
    serving = bool(getattr(args, "concurrency", None) or getattr(args, "chat_turns", None))
    if getattr(args, "serving_only", False):
        if args.http_only:
            raise TinyLoopError("--serving-only and --http-only exclude each other")
        if not serving:
            raise TinyLoopError("--serving-only needs --concurrency or --chat-turns")
    check_paths(args)
    if args.load:
        try:
            report = json.loads(Path(args.load).read_text())
        except (OSError, ValueError) as exc:
            raise TinyLoopError(f"cannot read a report from {args.load}: {exc}") from None
        return _output(report, args)
    started = time.time()
    arguments = {k: v for k, v in vars(args).items() if k not in ("func", "command")}
    report = {"tinyloop": __version__, "arguments": arguments,
              "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)), "machine": describe()}
    model = None
    plan = None
    if serving:
        from tinyloop.bench.serving.plan import serving_plan
        model = resolve_model(args.model, args.cache_dir)
        plan = serving_plan(args, model)                # refused here, before minutes of measuring
    if not args.http_only and not getattr(args, "serving_only", False):
        report.update(engine_section(args, model or resolve_model(args.model, args.cache_dir)))
    if getattr(args, "serving_only", False):
        report["http"] = {"status": "skipped", "reason": "--serving-only"}
    else:
        report["http"] = ({"status": "skipped", "reason": "--no-http"} if args.no_http else
                          http_comparison(args.quick, args.rounds or (3 if args.quick else 5)))
    sections = report.setdefault("sections", {})
    if plan is not None:
        from tinyloop.bench.serving.plan import run_serving
        report.update(run_serving(plan))
        for name in ("concurrency", "chat"):
            if name in report:
                sections[name] = {k: v for k, v in report[name].items() if k in ("status", "reason")}
        sections["llama-server"] = plan.llama_status(report)
    if "llama.cpp" in report.get("engines", {}):
        sections["llama.cpp"] = {k: v for k, v in report["engines"]["llama.cpp"].items() if k in ("status", "reason")}
    sections["http"] = {k: v for k, v in report["http"].items() if k in ("status", "reason")}
    report["seconds"] = round(time.time() - started, 1)
    if args.save:
        Path(args.save).write_text(json.dumps(report, indent=2))
    return _output(report, args)


def check_paths(args) -> None:
    """The files and folders named on the command line, checked before minutes of measuring
    (a typo found after the run would throw the run away, or measure the wrong thing)."""
    for flag, target in (("--plot", args.plot), ("--save", args.save)):
        if target and not Path(target).resolve().parent.is_dir():
            raise TinyLoopError(f"{flag} {target}: the folder {Path(target).resolve().parent} does not exist")
    if args.load:
        return
    if args.baseline and not (Path(args.baseline) / "tinyloop" / "__init__.py").is_file():
        # without this a missing checkout would fall back to the installed tinyloop and
        # quietly measure this very code as its own baseline
        raise TinyLoopError(f"--baseline {args.baseline}: not a TinyLoop checkout (no tinyloop/__init__.py there)")
    if args.gguf and not Path(args.gguf).is_file():
        raise TinyLoopError(f"--gguf {args.gguf}: file not found")
    if args.llama_python and not os.access(args.llama_python, os.X_OK):
        raise TinyLoopError(f"--llama-python {args.llama_python}: not an executable file")


def _output(report: dict, args) -> int:
    from tinyloop.bench.report import render
    if args.plot and report.get("figures"):
        from tinyloop.bench.plot import write_plot
        write_plot(report, args.plot)
        print(f"tinyloop bench: wrote {args.plot}", file=sys.stderr)
    print(json.dumps(report, indent=2) if args.json else render(report, markdown=args.markdown))
    if not report.get("exact", True):
        print("tinyloop bench: a speculative output differed from plain decoding (see 'tokens = plain')",
              file=sys.stderr)
        return 1
    return 0
