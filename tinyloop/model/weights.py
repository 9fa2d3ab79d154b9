"""Tensor names and shapes of a model, and loading them into backend arrays.

File convention: linear weights are (out, in), like PyTorch and GGUF. The NumPy
backend keeps them as float32 (in, out), fused where one product can serve several
projections (q|k|v, gate|up), because a row-vector product against an (in, out)
matrix is what OpenBLAS does fastest.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinyloop.model.config import ModelConfig
from tinyloop.errors import ModelFileError
from tinyloop.model.modelfile import ModelFile
from tinyloop.model.quant import QuantizedTensor, dequantize

STAGES = ("prelude", "core", "coda")


def stage_sizes(config: ModelConfig) -> dict[str, int]:
    return {"prelude": config.n_prelude, "core": config.n_core, "coda": config.n_coda}


def norm_tensors(config: ModelConfig, prefix: str) -> dict[str, tuple]:
    shapes = {f"{prefix}.weight": (config.dim,)}
    if config.norm == "layernorm":
        shapes[f"{prefix}.bias"] = (config.dim,)
    return shapes


def linear_tensors(config: ModelConfig, prefix: str, n_out: int, n_in: int) -> dict[str, tuple]:
    shapes = {f"{prefix}.weight": (n_out, n_in)}
    if config.bias:
        shapes[f"{prefix}.bias"] = (n_out,)
    return shapes


def expected_tensors(config: ModelConfig) -> dict[str, tuple]:
    """Every weight the model needs, by logical name, with its (out, in) shape."""
    c = config
    shapes: dict[str, tuple] = {"embed.weight": (c.vocab_size, c.dim)}
    if c.positions == "learned":
        shapes["pos_embed.weight"] = (c.max_seq_len, c.dim)
    for stage, count in stage_sizes(c).items():
        for i in range(count):
            p = f"{stage}.{i}"
            shapes.update(norm_tensors(c, f"{p}.attn_norm"))
            shapes.update(linear_tensors(c, f"{p}.attn.q", c.q_dim, c.dim))
            shapes.update(linear_tensors(c, f"{p}.attn.k", c.kv_dim, c.dim))
            shapes.update(linear_tensors(c, f"{p}.attn.v", c.kv_dim, c.dim))
            shapes.update(linear_tensors(c, f"{p}.attn.o", c.dim, c.q_dim))
            shapes.update(norm_tensors(c, f"{p}.mlp_norm"))
            shapes.update(linear_tensors(c, f"{p}.mlp.up", c.ffn_dim, c.dim))
            if c.mlp == "swiglu":
                shapes.update(linear_tensors(c, f"{p}.mlp.gate", c.ffn_dim, c.dim))
            shapes.update(linear_tensors(c, f"{p}.mlp.down", c.dim, c.ffn_dim))
    shapes.update(norm_tensors(c, "final_norm"))
    if not c.tied_head:
        shapes["head.weight"] = (c.vocab_size, c.dim)
    return shapes


@dataclass
class LayerWeights:
    """One transformer layer on the backend. Linear weights are (in, out)."""
    attn_norm: tuple            # (weight (D,), bias (D,) | None)
    qkv: object                 # (D, q_dim + 2 kv_dim)
    qkv_bias: object | None
    out: object                 # (q_dim, D)
    out_bias: object | None
    mlp_norm: tuple
    up: object                  # (D, ffn) for GELU; (D, 2 ffn) = [gate | up] for SwiGLU
    up_bias: object | None
    down: object                # (ffn, D)
    down_bias: object | None


@dataclass
class ModelWeights:
    embed: object               # (vocab, D)
    pos_embed: object | None    # (max_seq_len, D)
    layers: dict                # stage -> list[LayerWeights]
    final_norm: tuple
    head: object                # (D, vocab)


def validate_tensors(model_file: ModelFile) -> None:
    """Raise ModelFileError naming the first missing or mis-shaped weight."""
    for name, shape in expected_tensors(model_file.config).items():
        if name not in model_file.quantization and name not in model_file.entries:
            raise ModelFileError(model_file.path, f"missing tensor {name!r}")
        stored = model_file.weight_shape(name)
        if tuple(stored) != tuple(shape):
            raise ModelFileError(model_file.path, f"tensor {name!r} has shape {tuple(stored)}, "
                                                  f"the model config needs {tuple(shape)}")
        if name in model_file.quantization:
            for part in ("qcodes", "qscale", "qmin"):
                if f"{name}.{part}" not in model_file.entries:
                    raise ModelFileError(model_file.path, f"quantized tensor {name!r} lacks its {part} part")


def _as_float32(value) -> np.ndarray:
    if isinstance(value, QuantizedTensor):
        return dequantize(value, np.float32)
    return np.asarray(value, dtype=np.float32)


def load_weights(model_file: ModelFile, xp=np) -> ModelWeights:
    """Dequantize/convert every weight once into float32 backend arrays."""
    validate_tensors(model_file)
    c = model_file.config
    get = model_file.get

    def plain(name):
        """A norm vector or embedding table, float32; None if the file has no such tensor."""
        return xp.asarray(_as_float32(get(name))) if name in model_file.entries else None

    def matrix_in_out(*names):
        # (out, in) stored -> one (in, sum(out)) contiguous float32 matrix
        parts = [_as_float32(get(n)) for n in names]
        return xp.asarray(np.ascontiguousarray(np.concatenate(parts, axis=0).T))

    def bias_of(*names):
        if not c.bias:
            return None
        return xp.asarray(np.concatenate([_as_float32(get(f"{n}.bias")) for n in names]))

    def norm(prefix):
        return (plain(f"{prefix}.weight"), plain(f"{prefix}.bias"))

    layers = {}
    for stage, count in stage_sizes(c).items():
        layers[stage] = []
        for i in range(count):
            p = f"{stage}.{i}"
            qkv_names = [f"{p}.attn.q", f"{p}.attn.k", f"{p}.attn.v"]
            up_names = [f"{p}.mlp.gate", f"{p}.mlp.up"] if c.mlp == "swiglu" else [f"{p}.mlp.up"]
            layers[stage].append(LayerWeights(
                attn_norm=norm(f"{p}.attn_norm"),
                qkv=matrix_in_out(*[f"{n}.weight" for n in qkv_names]),
                qkv_bias=bias_of(*qkv_names),
                out=matrix_in_out(f"{p}.attn.o.weight"),
                out_bias=bias_of(f"{p}.attn.o"),
                mlp_norm=norm(f"{p}.mlp_norm"),
                up=matrix_in_out(*[f"{n}.weight" for n in up_names]),
                up_bias=bias_of(*up_names),
                down=matrix_in_out(f"{p}.mlp.down.weight"),
                down_bias=bias_of(f"{p}.mlp.down"),
            ))
    embed = xp.asarray(np.ascontiguousarray(_as_float32(get("embed.weight"))))
    head_name = "embed.weight" if c.tied_head else "head.weight"
    return ModelWeights(
        embed=embed,
        pos_embed=plain("pos_embed.weight") if c.positions == "learned" else None,
        layers=layers,
        final_norm=norm("final_norm"),
        head=matrix_in_out(head_name),
    )
