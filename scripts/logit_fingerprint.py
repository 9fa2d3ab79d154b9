"""Logits of every forward path, bit for bit: one file, to compare across CPUs and compile targets.

    python scripts/logit_fingerprint.py OUT.npz          # writes the logits, prints their SHA-256

Run it under two configurations (numba compile targets with NUMBA_CPU_NAME, OpenBLAS core
types, NumPy SIMD levels, TINYLOOP_CPU_KERNELS) and compare the files: on the CPU a row's
bits may depend on its own inputs and position only, never on the instructions the machine
offers. Each array is saved under its path name; compare with numpy.array_equal. The models are the seeded random test
presets (a looped GQA model with RoPE, a GPT-style one), float and quantized (int8, int4
and int2 weights, act-order included), every KV cache mode, a sliding window; the paths
are the prompt's prefill, decode steps, a chain verify pass and a draft-tree verify pass.
"""
from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tinyloop.model.plan import TreeRows  # noqa: E402
from tinyloop.model.quant import quantize_rtn  # noqa: E402


def _quantized(path: Path, source: Path, bits: int, act_order: bool) -> None:
    """A copy of `source` with every linear weight quantized (RTN, groups of 16)."""
    from tinyloop.model.modelfile import ModelFile, write_model_file
    rng = np.random.default_rng(bits)
    with ModelFile(source) as mf:
        tensors = {}
        for name in mf.weight_names():
            value = np.array(mf.get(name))
            if name.endswith(".weight") and value.ndim == 2 and not name.startswith(("embed", "pos_embed")):
                tensor = quantize_rtn(value, bits, 16)
                if act_order:
                    tensor.perm = rng.permutation(tensor.padded_in).astype(np.int32)
                value = tensor
            tensors[name] = value
        write_model_file(path, mf.config, tensors, mf.tokenizer_json, mf.chat_template)


def fingerprint(workdir: Path) -> dict:
    from tinyloop.model.loader import load_model
    from tinyloop.model.testmodels import make_test_model
    out = {}
    files = {}
    for preset, seed in (("tiny-looped", 0), ("tiny-looped-gpt", 1)):
        files[preset] = workdir / f"{preset}.tinyloop"
        make_test_model(files[preset], preset, seed=seed)
    for bits, act in ((8, False), (4, True), (2, False)):
        files[f"tiny-looped int{bits}"] = workdir / f"tiny-looped-int{bits}.tinyloop"
        _quantized(files[f"tiny-looped int{bits}"], files["tiny-looped"], bits, act)
    runs = [(name, "fp16", 0) for name in files] + [("tiny-looped", mode, 0) for mode in ("fp32", "int8", "int4", "int4-h")]
    runs.append(("tiny-looped", "fp16", 24))
    rng = np.random.default_rng(7)
    for name, kv_mode, window in runs:
        loaded = load_model(files[name], device="cpu", kv_mode=kv_mode)
        model, c = loaded.model, loaded.config
        loops = min(c.max_loops, 3)
        prompt = rng.integers(0, c.vocab_size, 40)
        cache = model.new_cache(80, loops, extra_slots=c.n_coda, window=window)
        tag = f"{name}/{kv_mode}/w{window}"
        out[f"{tag}/prefill"] = np.asarray(model.forward(prompt, np.arange(40), cache, loops, exact=False))
        for step in range(3):
            out[f"{tag}/decode{step}"] = np.asarray(model.forward([int(prompt[step])], [40 + step], cache, loops))
        chain = rng.integers(0, c.vocab_size, 5)
        out[f"{tag}/verify"] = np.asarray(model.forward(chain, np.arange(43, 48), cache, loops))
        # a draft tree under the root at row 47: nodes 1, 2 its children, 3 and 4 their children
        positions, tree = np.array([48, 48, 49, 49]), TreeRows(47, np.array([[47, 48, 0], [47, 49, 0],
                                                                              [47, 48, 50], [47, 49, 51]]))
        plan = model.plan(positions, 48, cache, tree=tree)
        trunk = model.trunk(rng.integers(0, c.vocab_size, 4), plan, cache, loops)
        out[f"{tag}/tree"] = np.asarray(model.head(model.coda(trunk.hidden, plan, cache, model.coda_base(loops))))
    return out


def main(argv=None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        logits = fingerprint(Path(tmp))
    np.savez(args[0], **{k.replace("/", "|"): v for k, v in logits.items()})
    digest = hashlib.sha256()
    for key in sorted(logits):
        digest.update(key.encode())
        digest.update(np.ascontiguousarray(logits[key]).tobytes())
    print(f"{len(logits)} logit arrays, sha256 {digest.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
