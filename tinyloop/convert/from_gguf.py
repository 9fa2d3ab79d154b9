"""`tinyloop convert IN.gguf OUT.tinyloop` for llama-architecture GGUF files.

A llama model is a looped model with one loop: its blocks become the core layers
(n_prelude = n_coda = 0, loops fixed at 1). Tensors convert without loss (see
quant_blocks.py); the tokenizer is rebuilt from the GGUF vocabulary; a ChatML chat
template is recognised and recorded with its default system message.
"""
from __future__ import annotations

import re

from tinyloop.convert.gguf import GGUFError, GGUFFile
from tinyloop.convert.gguf_tokenizer import tokenizer_json_from_gguf
from tinyloop.convert.quant_blocks import SUPPORTED, decode, tensor_nbytes
from tinyloop.model.config import ModelConfig
from tinyloop.model.modelfile import write_model_file
from tinyloop.progress import Progress
from tinyloop.text.chat import ChatTemplate

# llama GGUF tensor name -> TinyLoop name ({i}: block index)
LAYER_NAMES = {
    "attn_norm.weight": "attn_norm.weight", "ffn_norm.weight": "mlp_norm.weight",
    "attn_q.weight": "attn.q.weight", "attn_k.weight": "attn.k.weight", "attn_v.weight": "attn.v.weight",
    "attn_output.weight": "attn.o.weight", "ffn_gate.weight": "mlp.gate.weight",
    "ffn_up.weight": "mlp.up.weight", "ffn_down.weight": "mlp.down.weight",
}
GLOBAL_NAMES = {"token_embd.weight": "embed.weight", "output_norm.weight": "final_norm.weight",
                "output.weight": "head.weight"}
_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", re.S)


def config_from_gguf(gguf: GGUFFile) -> ModelConfig:
    meta = gguf.metadata
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise GGUFError(gguf.path, f"architecture {arch!r} is not supported (only 'llama')")

    def need(key):
        if f"llama.{key}" not in meta:
            raise GGUFError(gguf.path, f"metadata key llama.{key} is missing")
        return meta[f"llama.{key}"]

    dim, heads = int(need("embedding_length")), int(need("attention.head_count"))
    kv_heads = int(meta.get("llama.attention.head_count_kv", heads))
    head_dim = int(meta.get("llama.rope.dimension_count", dim // heads))
    vocab = int(meta.get("llama.vocab_size", len(meta.get("tokenizer.ggml.tokens", []))))
    tokens = meta.get("tokenizer.ggml.tokens", [])
    eos = [int(meta["tokenizer.ggml.eos_token_id"])] if "tokenizer.ggml.eos_token_id" in meta else []
    if "<|endoftext|>" in tokens and tokens.index("<|endoftext|>") not in eos:
        eos.append(tokens.index("<|endoftext|>"))
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    return ModelConfig(
        vocab_size=vocab, dim=dim, n_heads=heads, n_kv_heads=kv_heads, head_dim=head_dim,
        ffn_dim=int(need("feed_forward_length")), max_seq_len=int(need("context_length")),
        n_prelude=0, n_core=int(need("block_count")), n_coda=0, default_loops=1, min_loops=1, max_loops=1,
        norm="rmsnorm", norm_eps=float(meta.get("llama.attention.layer_norm_rms_epsilon", 1e-5)),
        mlp="swiglu", positions="rope", rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
        bias=False, tied_head="output.weight" not in gguf.tensors,
        bos_token_id=int(meta["tokenizer.ggml.bos_token_id"]) if add_bos else None,
        eos_token_ids=tuple(eos), name=str(meta.get("general.name", "gguf-model")))


def chat_template_from_gguf(meta: dict) -> ChatTemplate:
    template = meta.get("tokenizer.chat_template", "")
    if "<|im_start|>" in template:
        match = _DEFAULT_SYSTEM.search(template)
        return ChatTemplate("chatml", match.group(1) if match else None)
    return ChatTemplate("plain")


def tinyloop_name(gguf_name: str) -> str | None:
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    match = re.fullmatch(r"blk\.(\d+)\.(.+)", gguf_name)
    if match and match.group(2) in LAYER_NAMES:
        return f"core.{match.group(1)}.{LAYER_NAMES[match.group(2)]}"
    return None


def convert_gguf(source, target, progress=True) -> ModelConfig:
    gguf = GGUFFile(source)
    config = config_from_gguf(gguf)
    unsupported = sorted({t.type_name for t in gguf.tensors.values() if t.type_name not in SUPPORTED})
    if unsupported:
        raise GGUFError(gguf.path, f"tensor types {', '.join(unsupported)} are not supported; "
                                   f"supported: {', '.join(SUPPORTED)}")
    tokenizer_json = tokenizer_json_from_gguf(gguf.path, gguf.metadata)
    template = chat_template_from_gguf(gguf.metadata)
    tensors = {}
    items = list(gguf.tensors.values())
    progress = Progress("converting tensors", len(items), enabled=progress)
    for index, tensor in enumerate(items, 1):
        name = tinyloop_name(tensor.name)
        if name is None:
            if tensor.name.startswith("rope_freqs"):
                raise GGUFError(gguf.path, "rope_freqs (RoPE scaling) tensors are not supported")
            continue                                  # e.g. unused metadata tensors
        raw = gguf.tensor_bytes(tensor, tensor_nbytes(tensor.type_name, tensor.shape))
        tensors[name] = decode(tensor.type_name, raw, tensor.shape)
        progress.update(index, tensor.name)
    write_model_file(target, config, tensors, tokenizer_json, template.to_metadata(),
                     extra_metadata={"source": str(gguf.path.name), "source_format": f"gguf-v{gguf.version}"})
    gguf.close()
    progress.finish(f"converted {len(tensors)} tensors to {target}")
    return config
