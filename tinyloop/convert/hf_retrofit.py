"""The retrofitted-recurrence layout (McLeish et al. 2025, "Teaching Pretrained Language
Models to Think Deeper with Retrofitted Recurrence"): a pretrained Llama (TinyLlama,
Llama-3.2) whose layers were cut into prelude / core / coda and saved under Huginn's
`RavenForCausalLM` name and config class, but run by a Llama-style modeling file.

What differs from Huginn (hf_layouts.raven_*), all read from the authors' modeling code:
- blocks are plain pre-norm Llama layers, h + attn(norm_1(h)), then h + mlp(norm_2(h)):
  two norms per block, no sandwich;
- no final norm between the recurrence and the coda (ln_f only before the head);
- RoPE is transformers' Llama rotary embedding ("rotate half", `rope_theta`, not Huginn's
  `rope_base`), so q and k rows are permuted to interleaved pairs as for Llama; it honours
  config.json's `rope_scaling`, which the Llama-3.2 retrofits set to Llama 3's ("llama3");
- grouped-query attention (`num_key_value_heads`), untied head, and the embedding scale
  and initial-state std taken from the config's `init_values` (the conversion sets
  embed_scale 1 and keeps Huginn's std).
The same `RavenForCausalLM` name covers both, so the tensors decide: a block with
norm_3/norm_4 is Huginn's sandwich, one without is this layout. The authors' OLMo-2
variant (post-norms plus q_norm/k_norm) is refused by name.
"""
from __future__ import annotations

from tinyloop.convert.hf_layouts import (
    _eos,
    _refuse_if,
    check_raven_options,
    raven_init_values,
    rope_scaling_options,
)
from tinyloop.convert.safetensors_dir import CheckpointError
from tinyloop.model.config import MAX_LOOPS_LIMIT, ModelConfig

SANDWICH_NORM = ".norm_3.weight"        # only Huginn's SandwichBlock has a third and fourth norm
QK_NORMS = (".attn.q_norm.weight", ".attn.k_norm.weight")


def is_retrofitted(tensor_names) -> bool:
    """A RavenForCausalLM checkpoint in the retrofitted-Llama layout (True) or Huginn's (False)."""
    names = list(tensor_names)
    for qk_norm in (n for n in names if n.endswith(QK_NORMS)):
        _refuse_if(True, f"QK-norm ({qk_norm}: the retrofitted OLMo-2 layout, or Huginn with QK-norm)")
    return bool(names) and not any(n.endswith(SANDWICH_NORM) for n in names)


def _special_ids(hf, generation, vocab: int, tokenizer_ids: dict) -> tuple:
    """(bos, eos ids). The conversion starts from Huginn's config.json, so the ids it inherits
    name Huginn's vocabulary (65504 / 65505), not the Llama one the weights and the tokenizer
    use; inside a large vocabulary (Llama 3's 128256) they are other tokens. So the tokenizer's
    own bos / eos tokens win; config.json's ids count only where the tokenizer names none
    (and only inside the vocabulary)."""
    bos = tokenizer_ids.get("bos", hf.get("bos_token_id"))
    if bos is not None and not 0 <= int(bos) < vocab:
        bos = None
    if "eos" in tokenizer_ids:
        return bos, (tokenizer_ids["eos"],)
    return bos, tuple(i for i in _eos(hf, generation) if 0 <= i < vocab)


def retrofit_config(hf, generation, add_bos, name, tokenizer_ids: dict) -> ModelConfig:
    check_raven_options(hf)
    _refuse_if(hf.get("partial_rotary_factor", 1.0) != 1.0, "partial_rotary_factor (partial RoPE)")
    # a later fork of the authors' code added other ways to start the recurrence
    _refuse_if(hf.get("initial_state_mode", "random") != "random",
               f"initial_state_mode {hf.get('initial_state_mode')!r}")
    if hf.get("rope_theta") is None:        # Huginn's rope_base is not what this modeling reads
        raise CheckpointError("config.json of a retrofitted RavenForCausalLM lacks rope_theta (its Llama RoPE base)")
    dim, heads = int(hf["n_embd"]), int(hf["n_heads"] if "n_heads" in hf else hf["num_attention_heads"])
    head_dim = dim // heads
    # the attention splits n_embd into heads while the rotary embedding reads config.head_dim:
    # they only agree when head_dim is n_embd / n_heads
    _refuse_if(int(hf.get("head_dim") or head_dim) != head_dim,
               f"head_dim {hf.get('head_dim')} other than n_embd / n_heads ({head_dim})")
    kv_heads = int(hf.get("num_key_value_heads") or heads)
    # the reference's qk_bias has one bias per query head for k too: it only runs without GQA
    _refuse_if(hf.get("qk_bias", True) and kv_heads != heads, "qk_bias with grouped-query attention")
    std, embed_scale = raven_init_values(hf, dim)
    mean = int(hf.get("mean_recurrence", 32))
    vocab = int(hf.get("padded_vocab_size") or hf["vocab_size"])
    bos, eos = _special_ids(hf, generation, vocab, tokenizer_ids)
    return ModelConfig(
        vocab_size=vocab, dim=dim, n_heads=heads,
        n_kv_heads=kv_heads, head_dim=head_dim,
        ffn_dim=int(hf["intermediate_size"]),
        max_seq_len=int(hf.get("max_position_embeddings") or hf.get("block_size", 4096)),
        n_prelude=int(hf["n_layers_in_prelude"]), n_core=int(hf["n_layers_in_recurrent_block"]),
        n_coda=int(hf["n_layers_in_coda"]),
        default_loops=min(mean, MAX_LOOPS_LIMIT), min_loops=1, max_loops=MAX_LOOPS_LIMIT,
        norm="rmsnorm", norm_eps=float(hf.get("norm_eps", 1e-6)), mlp="swiglu", positions="rope",
        rope_theta=float(hf["rope_theta"]), **rope_scaling_options(hf),
        tied_head=bool(hf.get("tie_embeddings", True)),
        input_injection="concat", post_norm="none", loop_norm="none", initial_state="random",
        state_std=std * embed_scale, qk_bias=bool(hf.get("qk_bias", True)), embed_scale=embed_scale,
        bos_token_id=int(bos) if add_bos and bos is not None else None, eos_token_ids=eos, name=name)
