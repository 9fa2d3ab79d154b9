"""A measuring worker: one process per engine, driven over JSON lines.

    python -m tinyloop.bench.worker tinyloop [--root CHECKOUT]
    python -m tinyloop.bench.worker llama                     # needs llama_cpp importable

The parent (runner.py) sends one command per line, {"op": NAME, **arguments}, and reads
one JSON answer per line: the op's result, or {"error": "..."}. Each engine runs in a
process of its own so its BLAS threads, allocator and imports cannot slow the other,
and several engines take turns within every round. The protocol uses a private copy of
stdout; anything a library prints goes to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def use_checkout(root: str) -> None:
    """Measure the tinyloop of another checkout (--baseline): forget this checkout's
    tinyloop modules and import the model code from ROOT instead. The bench modules
    already imported keep running; they import tinyloop's model code lazily."""
    for name in [name for name in sys.modules if name == "tinyloop" or name.startswith("tinyloop.")]:
        if not name.startswith("tinyloop.bench"):
            del sys.modules[name]
    sys.path.insert(0, os.path.abspath(root))


def serve(ops, protocol) -> None:
    protocol.write(json.dumps({"ready": True}) + "\n")
    protocol.flush()
    for line in sys.stdin:
        command = json.loads(line)
        name = command.pop("op")
        try:
            result = getattr(ops, name)(**command)
        except Exception as exc:            # noqa: BLE001 - reported to the parent, which decides
            result = {"error": f"{type(exc).__name__}: {exc}"}
        protocol.write(json.dumps(result) + "\n")
        protocol.flush()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("engine", choices=("tinyloop", "llama"))
    parser.add_argument("--root", default=None, help="import tinyloop's model code from this checkout")
    args = parser.parse_args(argv)
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)                                   # stray prints go to stderr, not into the protocol
    if args.engine == "tinyloop":
        from tinyloop.bench.ops_tinyloop import TinyLoopOps
        if args.root:
            use_checkout(args.root)
        ops = TinyLoopOps()
    else:
        from tinyloop.bench.ops_llama import LlamaOps
        ops = LlamaOps()
    serve(ops, protocol)


if __name__ == "__main__":
    main()
