"""Mean loops per generated token under adaptive depth (loops "auto") on the tiny test
checkpoints of tests/data/hf, at several exit thresholds.

    .venv/bin/python scripts/adaptive_loops.py [--tokens 40]

Random weights: this shows the mechanism and its bookkeeping, not what a real model
saves. The prompt is prefilled at full depth; the figures cover the decoded tokens.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np

from tinyloop.convert.from_hf import convert_hf
from tinyloop.engine.generate import GenerationRequest, generate
from tinyloop.model.loader import load_model

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "hf"
THRESHOLDS = {"ouro": (1.0, 0.9, 0.5, 0.1), "huginn": (1e-3, 1e-2, 0.1, 1.0), "retrofit": (1e-3, 1e-2, 0.1, 1.0)}
PROMPT = "The looped transformer thinks again and"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=40, help="tokens to generate per run (default 40)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for layout, thresholds in THRESHOLDS.items():
            path = Path(folder) / f"{layout}.tinyloop"
            convert_hf(DATA / layout, path, progress=False)
            loaded = load_model(path, "cpu")
            prompt = loaded.encode_prompt(PROMPT)
            criterion = "gate CDF" if loaded.config.exit_gate else "KL"
            for threshold in thresholds:
                result = generate(loaded.model, GenerationRequest(prompt, args.tokens, loops="auto",
                                                                  exit_threshold=threshold, ignore_eos=True))
                decoded = result.loops_used[1:]          # the first token comes from the full-depth prefill
                depths, counts = np.unique(decoded, return_counts=True)
                histogram = ", ".join(f"{int(d)}: {int(n)}" for d, n in zip(depths, counts))
                print(f"{layout:8s} {criterion:8s} threshold {threshold:<6g} mean loops {np.mean(decoded):.2f} "
                      f"of {loaded.config.default_loops}  histogram {{{histogram}}}")


if __name__ == "__main__":
    main()
