"""Weight quantization quality on the default model: RTN vs GPTQ, side by side.

    python scripts/eval_quantize.py [--ppl-tokens 8192] [--calibration-tokens 4096]

The reference is SmolLM2 as loaded (its Q4_1 weights dequantized to float32); every
other row re-quantizes those float32 weights and reports perplexity on the first
--ppl-tokens tokens of tests/data/jargon-4.4.7-excerpt.txt. GPTQ calibrates on
tests/data/jargon-4.4.7-calibration.txt (a disjoint part of the same file).
"""
import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tinyloop.convert.pull import ensure_default_model  # noqa: E402
from tinyloop.model.evaluate import perplexity  # noqa: E402
from tinyloop.model.loader import load_model  # noqa: E402
from tinyloop.quantize.pipeline import quantize_file  # noqa: E402

CONFIGS = [(8, 128, "rtn", False), (8, 128, "gptq", False),
           (4, 128, "rtn", False), (4, 128, "gptq", False), (4, 128, "gptq", True),
           (2, 64, "rtn", False), (2, 64, "gptq", False), (2, 64, "gptq", True),
           (2, 32, "rtn", False), (2, 32, "gptq", False), (2, 32, "gptq", True)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--ppl-tokens", type=int, default=8192)
    parser.add_argument("--calibration-tokens", type=int, default=4096)
    args = parser.parse_args()
    source = args.model or ensure_default_model()
    text = (ROOT / "tests" / "data" / "jargon-4.4.7-excerpt.txt").read_text(encoding="utf-8")
    calibration = (ROOT / "tests" / "data" / "jargon-4.4.7-calibration.txt").read_text(encoding="utf-8")
    reference = perplexity(load_model(source), text, 512, 256, max_tokens=args.ppl_tokens, progress=False)
    print(f"reference (float32 from the Q4_1 file): perplexity {reference.perplexity:.4f} "
          f"over {reference.tokens_scored} tokens", flush=True)
    print(f"{'bits':>4} {'group':>5} {'method':<16} {'ppl':>9} {'vs ref':>7} {'quantize s':>10}")
    folder = Path(tempfile.mkdtemp())
    for bits, group, method, act in CONFIGS:
        target = folder / f"q{bits}-{group}-{method}{'-act' if act else ''}.tinyloop"
        start = time.perf_counter()
        quantize_file(source, target, bits, group, method, act, calibration, args.calibration_tokens, 512,
                      progress=False)
        seconds = time.perf_counter() - start
        result = perplexity(load_model(target), text, 512, 256, max_tokens=args.ppl_tokens, progress=False)
        label = method + (" + act-order" if act else "")
        print(f"{bits:>4} {group:>5} {label:<16} {result.perplexity:>9.4f} "
              f"{result.perplexity / reference.perplexity:>7.3f} {seconds:>10.1f}", flush=True)
        target.unlink()


if __name__ == "__main__":
    main()
