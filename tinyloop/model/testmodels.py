"""Seeded random looped models with a real byte-level BPE tokenizer, for tests and benches.

`tinyloop new-model --preset NAME --seed S OUT` writes one. The tokenizer is trained
with the `tokenizers` library on a small built-in corpus; the weights are random.
"""
from __future__ import annotations

from importlib import resources

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from tinyloop.model.config import ModelConfig
from tinyloop.model.modelfile import write_model_file
from tinyloop.model.weights import expected_tensors

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TINY_VOCAB = 512

# Shapes of the presets. vocab_size/eos come from the trained tokenizer unless given.
PRESETS: dict[str, dict] = {
    # RMSNorm + SwiGLU, RoPE, GQA, prelude and coda around a shared core.
    "tiny-looped": dict(dim=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=128, max_seq_len=512,
                        n_prelude=1, n_core=2, n_coda=1, default_loops=4, min_loops=1, max_loops=8,
                        norm="rmsnorm", mlp="swiglu", positions="rope", input_injection="add",
                        tied_head=False),
    # LayerNorm + GELU, learned positions, MHA with biases, no prelude/coda, untied head.
    "tiny-looped-gpt": dict(dim=48, n_heads=3, n_kv_heads=3, head_dim=16, ffn_dim=96, max_seq_len=256,
                            n_prelude=0, n_core=2, n_coda=0, default_loops=3, min_loops=1, max_loops=6,
                            norm="layernorm", mlp="gelu", positions="learned", bias=True,
                            tied_head=False),
    # A standard transformer: the max_loops = 1 case.
    "tiny-standard": dict(dim=64, n_heads=4, n_kv_heads=1, head_dim=16, ffn_dim=160, max_seq_len=512,
                          n_prelude=0, n_core=3, n_coda=0, default_loops=1, min_loops=1, max_loops=1,
                          norm="rmsnorm", mlp="swiglu", positions="rope"),
    # The shape of the API document's model (~405M parameters), for benchmarks.
    "doc-407m": dict(dim=2048, n_heads=16, n_kv_heads=16, head_dim=128, ffn_dim=8192, max_seq_len=8192,
                     n_prelude=1, n_core=4, n_coda=1, default_loops=8, min_loops=1, max_loops=64,
                     norm="layernorm", mlp="gelu", positions="rope", bias=True, vocab_size=50257),
}


def train_tokenizer(vocab_size: int = TINY_VOCAB) -> Tokenizer:
    """A byte-level BPE (GPT-2 style) trained on the built-in corpus. Deterministic."""
    corpus = resources.files("tinyloop.data").joinpath("bpe_corpus.txt").read_text("utf-8")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(corpus.splitlines(keepends=True), trainer)
    return tokenizer


def preset_config(preset: str, tokenizer: Tokenizer, **overrides) -> ModelConfig:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {', '.join(PRESETS)}")
    shape = dict(PRESETS[preset])
    shape.setdefault("vocab_size", tokenizer.get_vocab_size())
    shape.update(overrides)
    shape.setdefault("eos_token_ids", (tokenizer.token_to_id("<|endoftext|>"),))
    shape.setdefault("name", preset)
    return ModelConfig(**shape)


def random_weights(config: ModelConfig, seed: int, dtype=np.float32) -> dict[str, np.ndarray]:
    """Random weights that give varied text, with fewer loops agreeing often (not always)
    with more: residual branches are damped (x0.5) so each core iteration moves the
    hidden state a little. A tied head gets small embeddings so that the layers, not
    the input token's own embedding, decide the next token."""
    rng = np.random.default_rng(seed)
    embed_std = 0.1 if config.tied_head else 1.0
    tensors = {}
    for name, shape in expected_tensors(config).items():
        if name.endswith("norm.weight"):
            value = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            value = 0.02 * rng.standard_normal(shape)
        elif name in ("embed.weight", "pos_embed.weight", "head.weight"):
            value = rng.standard_normal(shape) * (embed_std if name != "pos_embed.weight" else 0.3 * embed_std)
        else:
            fan_in = shape[1]
            value = rng.standard_normal(shape) / np.sqrt(fan_in)
            if name.endswith(("attn.o.weight", "mlp.down.weight")):
                value *= 0.5
        tensors[name] = value.astype(dtype)
    return tensors


def make_test_model(path, preset: str = "tiny-looped", seed: int = 0, dtype=np.float32,
                    **overrides) -> ModelConfig:
    """Write a seeded random model of a preset to `path`; returns its config."""
    tokenizer = train_tokenizer()
    config = preset_config(preset, tokenizer, **overrides)
    write_model_file(path, config, random_weights(config, seed, dtype), tokenizer.to_str(),
                     chat_template="plain", extra_metadata={"seed": str(seed), "preset": preset})
    return config
