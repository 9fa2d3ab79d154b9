"""Hugging Face checkpoint layouts: config.json -> ModelConfig, and which stored tensor
(and which rows of it) becomes each TinyLoop weight.

Supported (config.json "architectures"):
- LlamaForCausalLM: a standard transformer, one loop (SmolLM2 and friends).
- OuroForCausalLM (ByteDance LoopLM): the whole stack looped total_ut_steps times,
  sandwich norms on each sublayer's output, the final norm between loops, an early-exit gate.
- RavenForCausalLM (Huginn-0125): prelude / core / coda, noise initial state, concat
  adapter, sandwich norms of the sum, fused Wqkv with per-head q/k bias, fused
  [gate | up], scaled tied embeddings.
- RavenForCausalLM in the retrofitted-recurrence layout (a Llama cut into prelude / core /
  coda, hf_retrofit.py): pre-norm Llama blocks in the same tensor names, GQA, Llama RoPE.

Anything else, and any option of these layouts we do not implement, is refused by
name rather than converted into a model that computes something else.

RoPE: Llama and Ouro rotate dims (i, i + hd/2) together ("rotate half"); TinyLoop
rotates interleaved pairs (2i, 2i + 1), so their q and k rows are permuted per head
(scores are unchanged: q and k get the same permutation); so are the retrofitted
models'. Huginn already rotates interleaved pairs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tinyloop.convert.safetensors_dir import CheckpointError
from tinyloop.errors import ConfigError
from tinyloop.model.config import MAX_LOOPS_LIMIT, ModelConfig

SUPPORTED = ("LlamaForCausalLM", "OuroForCausalLM", "RavenForCausalLM")


@dataclass(frozen=True)
class Piece:
    """TinyLoop weight `target` = transform(stored tensor `source`)."""
    target: str
    source: str
    transform: object = None    # ndarray -> ndarray (rows picked or permuted), or None: as stored


def architecture(hf: dict) -> str:
    names = hf.get("architectures") or []
    if not names:
        raise CheckpointError("config.json names no architecture ('architectures' is missing)")
    for name in names:
        if name in SUPPORTED:
            return name
    raise CheckpointError(f"architecture {', '.join(names)} is not supported; "
                          f"supported: {', '.join(SUPPORTED)}")


def rotate_half_to_interleaved(n_heads: int, head_dim: int):
    """Row permutation of a (n_heads * hd, in) q/k weight: per head, new row 2i = old row i,
    new row 2i + 1 = old row i + hd/2."""
    half = head_dim // 2
    within = np.stack([np.arange(half), np.arange(half) + half], axis=1).reshape(-1)   # (hd,)
    order = (np.arange(n_heads)[:, None] * head_dim + within[None, :]).reshape(-1)
    return lambda w: w[order]


def rows(start: int, stop: int):
    return lambda w: w[start:stop]


def _refuse_if(condition, what: str):
    if condition:
        raise CheckpointError(f"{what} is not supported")


def _eos(hf: dict, generation: dict) -> tuple:
    value = generation.get("eos_token_id", hf.get("eos_token_id"))
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list) else [value]))


LLAMA3_KEYS = {"factor": "rope_factor", "low_freq_factor": "rope_low_freq_factor",
               "high_freq_factor": "rope_high_freq_factor",
               "original_max_position_embeddings": "rope_original_max_positions"}


def rope_scaling_options(hf: dict) -> dict:
    """config.json's `rope_scaling` as ModelConfig fields: none (absent, null, or transformers'
    "default" type) or "llama3" (Llama 3.1 and later, the Llama-3.2 retrofits) with its four
    parameters. Other types (linear, dynamic, yarn, longrope, ...) are refused by name, and
    so is a llama3 entry missing a parameter or holding one that is not a number."""
    scaling = hf.get("rope_scaling")
    if not scaling:
        return {}
    if not isinstance(scaling, dict):
        raise CheckpointError(f"config.json's rope_scaling must be an object, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type"))       # "type": transformers' older spelling
    if kind == "default":
        return {}
    _refuse_if(kind != "llama3", f"rope_scaling of type {kind!r} (only 'llama3' RoPE scaling)")
    missing = [key for key in LLAMA3_KEYS if scaling.get(key) is None]
    if missing:
        raise CheckpointError(f"config.json's llama3 rope_scaling lacks {', '.join(missing)}")
    options = {"rope_scaling": "llama3"}
    for key, field in LLAMA3_KEYS.items():
        value = scaling[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise CheckpointError(f"config.json's rope_scaling {key} must be a number, got {value!r}")
        if field == "rope_original_max_positions":
            if value != int(value):
                raise CheckpointError(f"config.json's rope_scaling {key} must be a whole number, got {value!r}")
            options[field] = int(value)
        else:
            options[field] = float(value)
    return options


# ------------------------------------------------------------------------ llama and ouro
def _llama_like(hf: dict, generation: dict, add_bos: bool, name: str, **shape) -> ModelConfig:
    _refuse_if(hf.get("attention_bias") or hf.get("mlp_bias"), "attention_bias / mlp_bias")
    _refuse_if(hf.get("hidden_act", "silu") != "silu", f"hidden_act {hf.get('hidden_act')!r} (only silu)")
    _refuse_if(hf.get("use_sliding_window") or "sliding_attention" in (hf.get("layer_types") or []),
               "sliding-window attention")
    dim, heads = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    bos = hf.get("bos_token_id")
    return ModelConfig(
        vocab_size=int(hf["vocab_size"]), dim=dim, n_heads=heads,
        n_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(hf.get("head_dim") or dim // heads), ffn_dim=int(hf["intermediate_size"]),
        max_seq_len=int(hf.get("max_position_embeddings", 2048)), norm="rmsnorm",
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)), mlp="swiglu", positions="rope",
        rope_theta=float(hf.get("rope_theta", 10000.0)), tied_head=bool(hf.get("tie_word_embeddings", False)),
        bos_token_id=int(bos) if add_bos and bos is not None else None, eos_token_ids=_eos(hf, generation),
        name=name, **shape)


def llama_config(hf, generation, add_bos, name) -> ModelConfig:
    return _llama_like(hf, generation, add_bos, name, n_core=int(hf["num_hidden_layers"]),
                       **rope_scaling_options(hf))


def ouro_config(hf, generation, add_bos, name) -> ModelConfig:
    # no Ouro checkpoint scales RoPE, and no golden checks that its modeling would scale it as Llama's does
    _refuse_if(hf.get("rope_scaling"), f"rope_scaling {hf.get('rope_scaling')!r} (RoPE scaling in Ouro)")
    for key in ("kv_cache_policy", "kv_slots_per_layer"):
        _refuse_if(hf.get(key) not in (None, "full", "depth_indexed"), f"{key} {hf.get(key)!r} (KV sharing)")
    steps = int(hf.get("total_ut_steps", 4))
    threshold = hf.get("early_exit_threshold")
    return _llama_like(hf, generation, add_bos, name, n_core=int(hf["num_hidden_layers"]),
                       default_loops=steps, min_loops=1, max_loops=steps, post_norm="branch",
                       loop_norm="between", exit_gate=True,
                       exit_threshold=float(threshold) if threshold is not None else 1.0)


def llama_pieces(c: ModelConfig, hf: dict, ouro: bool = False) -> list[Piece]:
    q_perm = rotate_half_to_interleaved(c.n_heads, c.head_dim)
    k_perm = rotate_half_to_interleaved(c.n_kv_heads, c.head_dim)
    pieces = [Piece("embed.weight", "model.embed_tokens.weight"), Piece("final_norm.weight", "model.norm.weight")]
    for i in range(c.n_core):
        src, dst = f"model.layers.{i}", f"core.{i}"
        pieces += [
            Piece(f"{dst}.attn_norm.weight", f"{src}.input_layernorm.weight"),
            Piece(f"{dst}.attn.q.weight", f"{src}.self_attn.q_proj.weight", q_perm),
            Piece(f"{dst}.attn.k.weight", f"{src}.self_attn.k_proj.weight", k_perm),
            Piece(f"{dst}.attn.v.weight", f"{src}.self_attn.v_proj.weight"),
            Piece(f"{dst}.attn.o.weight", f"{src}.self_attn.o_proj.weight"),
            Piece(f"{dst}.mlp_norm.weight", f"{src}.post_attention_layernorm.weight"),
            Piece(f"{dst}.mlp.gate.weight", f"{src}.mlp.gate_proj.weight"),
            Piece(f"{dst}.mlp.up.weight", f"{src}.mlp.up_proj.weight"),
            Piece(f"{dst}.mlp.down.weight", f"{src}.mlp.down_proj.weight"),
        ]
        if ouro:
            pieces += [Piece(f"{dst}.attn_post_norm.weight", f"{src}.input_layernorm_2.weight"),
                       Piece(f"{dst}.mlp_post_norm.weight", f"{src}.post_attention_layernorm_2.weight")]
    if not c.tied_head:
        pieces.append(Piece("head.weight", "lm_head.weight"))
    if ouro:
        pieces += [Piece("exit_gate.weight", "model.early_exit_gate.weight"),
                   Piece("exit_gate.bias", "model.early_exit_gate.bias")]
    return pieces


# ------------------------------------------------------------------------------- huginn
RAVEN_EXPECTED = {"block_class_name": "SandwichBlock", "norm_class_name": "RMSNorm_llama",
                  "mlp_class_name": "GatedMLP", "nonlin_name": "SiLU", "injection_type": "linear"}


def check_raven_options(hf: dict) -> None:
    """Refuse the RavenConfig options (Huginn and the retrofitted layout share the class)
    whose other values the published checkpoints do not use."""
    for key, expected in RAVEN_EXPECTED.items():
        _refuse_if(hf.get(key, expected) != expected, f"{key} {hf.get(key)!r} (only {expected!r})")
    _refuse_if(hf.get("state_init", "like-init") not in ("like-init", "zero"), f"state_init {hf.get('state_init')!r}")
    _refuse_if(hf.get("bias"), "bias = true (biased linears)")
    _refuse_if(hf.get("lookup_strategy", "full") != "full",
               f"lookup_strategy {hf.get('lookup_strategy')!r} (KV sharing)")
    _refuse_if(hf.get("test_time_noise", 0), "test_time_noise")


def raven_init_values(hf: dict, dim: int) -> tuple[float, float]:
    """(initial-state std, embedding scale) as RavenConfig gives them: config.json's
    `init_values` when saved there (it overrides the derived ones on loading: the
    retrofitted models keep Huginn's std and set embed_scale 1), else std sqrt(2 / (5 dim))
    and scale sqrt(dim). The state is drawn with that std, then scaled like the embeddings."""
    values = hf.get("init_values") or {}
    std = float(values.get("std", math.sqrt(2 / (5 * dim))))
    scale = float(values.get("embed_scale", math.sqrt(dim)))
    return (0.0 if hf.get("state_init") == "zero" else std), scale


def raven_config(hf, generation, add_bos, name) -> ModelConfig:
    check_raven_options(hf)
    dim, heads = int(hf["n_embd"]), int(hf["n_heads"] if "n_heads" in hf else hf["num_attention_heads"])
    mean = int(hf.get("mean_recurrence", 32))
    std, embed_scale = raven_init_values(hf, dim)
    bos = hf.get("bos_token_id")
    return ModelConfig(
        vocab_size=int(hf.get("padded_vocab_size") or hf["vocab_size"]), dim=dim, n_heads=heads,
        n_kv_heads=heads, head_dim=dim // heads, ffn_dim=int(hf["intermediate_size"]),
        max_seq_len=int(hf.get("block_size", 4096)), n_prelude=int(hf["n_layers_in_prelude"]),
        n_core=int(hf["n_layers_in_recurrent_block"]), n_coda=int(hf["n_layers_in_coda"]),
        default_loops=min(mean, MAX_LOOPS_LIMIT), min_loops=1, max_loops=MAX_LOOPS_LIMIT,
        norm="rmsnorm", norm_eps=float(hf.get("norm_eps", 1e-6)), mlp="swiglu", positions="rope",
        rope_theta=float(hf.get("rope_base", 50000.0)), tied_head=bool(hf.get("tie_embeddings", True)),
        input_injection="concat", post_norm="sum", loop_norm="after", initial_state="random",
        state_std=std * embed_scale, qk_bias=bool(hf.get("qk_bias", True)), embed_scale=embed_scale,
        bos_token_id=int(bos) if add_bos and bos is not None else None, eos_token_ids=_eos(hf, generation),
        name=name)


def raven_pieces(c: ModelConfig, hf: dict, sandwich: bool = True, llama_rope: bool = False) -> list[Piece]:
    """The RavenForCausalLM tensors: Huginn's sandwich blocks (norm_1..norm_4, its own
    interleaved RoPE), or with sandwich=False and llama_rope=True the retrofitted layout's
    pre-norm Llama blocks (norm_1, norm_2; q/k rows in rotate-half order, permuted)."""
    q, kv, ffn = c.q_dim, c.kv_dim, c.ffn_dim

    def keep(w):
        return w
    q_perm = rotate_half_to_interleaved(c.n_heads, c.head_dim) if llama_rope else keep
    k_perm = rotate_half_to_interleaved(c.n_kv_heads, c.head_dim) if llama_rope else keep
    pieces = [Piece("embed.weight", "transformer.wte.weight"), Piece("final_norm.weight", "transformer.ln_f.weight"),
              Piece("adapter.weight", "transformer.adapter.weight")]
    for stage, source_stage, count in (("prelude", "prelude", c.n_prelude), ("core", "core_block", c.n_core),
                                       ("coda", "coda", c.n_coda)):
        for i in range(count):
            src, dst = f"transformer.{source_stage}.{i}", f"{stage}.{i}"
            norms = ({"attn_norm": 1, "attn_post_norm": 2, "mlp_norm": 3, "mlp_post_norm": 4} if sandwich
                     else {"attn_norm": 1, "mlp_norm": 2})
            pieces += [Piece(f"{dst}.{name}.weight", f"{src}.norm_{n}.weight") for name, n in norms.items()]
            pieces += [
                Piece(f"{dst}.attn.q.weight", f"{src}.attn.Wqkv.weight", lambda w: q_perm(w[0:q])),
                Piece(f"{dst}.attn.k.weight", f"{src}.attn.Wqkv.weight", lambda w: k_perm(w[q:q + kv])),
                Piece(f"{dst}.attn.v.weight", f"{src}.attn.Wqkv.weight", rows(q + kv, q + 2 * kv)),
                Piece(f"{dst}.attn.o.weight", f"{src}.attn.proj.weight"),
                Piece(f"{dst}.mlp.gate.weight", f"{src}.mlp.fc.weight", rows(0, ffn)),
                Piece(f"{dst}.mlp.up.weight", f"{src}.mlp.fc.weight", rows(ffn, 2 * ffn)),
                Piece(f"{dst}.mlp.down.weight", f"{src}.mlp.proj.weight"),
            ]
            if c.qk_bias:       # qk_bias: (2, 1, heads, hd), q's then k's, added before RoPE: permuted like their rows
                pieces += [Piece(f"{dst}.attn.q.bias", f"{src}.attn.qk_bias", lambda b: q_perm(b[0].reshape(-1))),
                           Piece(f"{dst}.attn.k.bias", f"{src}.attn.qk_bias", lambda b: k_perm(b[1].reshape(-1)))]
    if not c.tied_head:
        pieces.append(Piece("head.weight", "lm_head.weight"))
    return pieces


def layout(hf: dict, generation: dict, add_bos: bool, name: str, tensor_names=(),
           tokenizer_ids=None) -> tuple[ModelConfig, list[Piece]]:
    """tensor_names: the checkpoint's stored tensors (two layouts share the name RavenForCausalLM);
    tokenizer_ids: {"bos", "eos"} ids of the tokenizer's own special tokens."""
    # imported here: hf_retrofit builds on this module's helpers
    from tinyloop.convert.hf_retrofit import is_retrofitted, retrofit_config
    arch = architecture(hf)
    try:
        if arch == "LlamaForCausalLM":
            config = llama_config(hf, generation, add_bos, name)
            return config, llama_pieces(config, hf)
        if arch == "OuroForCausalLM":
            config = ouro_config(hf, generation, add_bos, name)
            return config, llama_pieces(config, hf, ouro=True)
        if is_retrofitted(tensor_names):
            config = retrofit_config(hf, generation, add_bos, name, tokenizer_ids or {})
            return config, raven_pieces(config, hf, sandwich=False, llama_rope=True)
        config = raven_config(hf, generation, add_bos, name)
        return config, raven_pieces(config, hf)
    except KeyError as exc:
        raise CheckpointError(f"config.json of a {arch} lacks {exc.args[0]!r}") from None
    except ConfigError as exc:      # values that pass as JSON but not as a model (e.g. rope_scaling factor 0.5)
        raise CheckpointError(f"config.json of a {arch}: {exc}") from None
