"""Tensor names and shapes of a model, and loading them into backend arrays.

File convention: linear weights are (out, in), like PyTorch and GGUF. Each layer's
linears are fused where one product serves several projections (q|k|v, gate|up) and
handed to the backend, which decides how to hold them (backends/base.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinyloop.errors import ModelFileError
from tinyloop.model.config import ModelConfig
from tinyloop.model.modelfile import ModelFile
from tinyloop.model.quant import QuantizedTensor, dequantize


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
            if c.qk_bias and not c.bias:
                shapes[f"{p}.attn.q.bias"] = (c.q_dim,)
                shapes[f"{p}.attn.k.bias"] = (c.kv_dim,)
            shapes.update(linear_tensors(c, f"{p}.attn.v", c.kv_dim, c.dim))
            shapes.update(linear_tensors(c, f"{p}.attn.o", c.dim, c.q_dim))
            shapes.update(norm_tensors(c, f"{p}.mlp_norm"))
            if c.post_norm != "none":
                shapes.update(norm_tensors(c, f"{p}.attn_post_norm"))
                shapes.update(norm_tensors(c, f"{p}.mlp_post_norm"))
            shapes.update(linear_tensors(c, f"{p}.mlp.up", c.ffn_dim, c.dim))
            if c.mlp == "swiglu":
                shapes.update(linear_tensors(c, f"{p}.mlp.gate", c.ffn_dim, c.dim))
            shapes.update(linear_tensors(c, f"{p}.mlp.down", c.dim, c.ffn_dim))
    shapes.update(norm_tensors(c, "final_norm"))
    if not c.tied_head:
        shapes["head.weight"] = (c.vocab_size, c.dim)
    if c.input_injection == "concat":
        shapes.update(linear_tensors(c, "adapter", c.dim, 2 * c.dim))
    if c.exit_gate:
        shapes["exit_gate.weight"] = (1, c.dim)
        shapes["exit_gate.bias"] = (1,)
    return shapes


@dataclass
class LayerWeights:
    """One transformer layer on the backend: norm vectors and linear handles."""
    attn_norm: tuple            # (weight (D,), bias (D,) | None)
    qkv: object                 # D -> q_dim + 2 kv_dim, bias included
    out: object                 # q_dim -> D
    mlp_norm: tuple
    up: object                  # D -> ffn for GELU; D -> 2 ffn = [gate | up] for SwiGLU
    down: object                # ffn -> D
    attn_post_norm: tuple | None = None     # sandwich norms (config.post_norm)
    mlp_post_norm: tuple | None = None


@dataclass
class ModelWeights:
    embed: object               # (vocab, D) embedding handle
    pos_embed: object | None    # (max_seq_len, D)
    layers: dict                # stage -> list[LayerWeights]
    final_norm: tuple
    head: object                # D -> vocab linear handle
    # concat injection: adapter([h | e]) = adapter_state(h) + adapter_input(e), the (D, 2D)
    # adapter split by columns so no backend needs a concatenation (bias on the state half)
    adapter_state: object = None
    adapter_input: object = None
    exit_gate: object = None    # D -> 1 linear handle (bias included)


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


def linear_parts(config: ModelConfig, sublayer: str) -> list[str]:
    """File weights (in fused row order) behind one fused linear of a layer."""
    return {"qkv": ["attn.q", "attn.k", "attn.v"], "out": ["attn.o"],
            "up": ["mlp.gate", "mlp.up"] if config.mlp == "swiglu" else ["mlp.up"],
            "down": ["mlp.down"]}[sublayer]


SUBLAYERS = ("qkv", "out", "up", "down")


def load_layer_linear(model_file: ModelFile, backend, prefix: str, sublayer: str):
    """The fused linear `sublayer` of the layer at `prefix` ("core.0"), as a backend handle."""
    config = model_file.config
    names = [f"{prefix}.{part}" for part in linear_parts(config, sublayer)]
    bias = None
    if config.bias:
        bias = np.concatenate([np.asarray(_float(model_file.get(f"{n}.bias")), np.float32) for n in names])
    elif config.qk_bias and sublayer == "qkv":
        # q and k carry a bias, v none: the fused product takes a zero bias for v's rows
        bias = np.concatenate([np.asarray(_float(model_file.get(f"{prefix}.attn.{n}.bias")), np.float32)
                               for n in ("q", "k")] + [np.zeros(config.kv_dim, np.float32)])
    return backend.prepare_linear([model_file.get(f"{n}.weight") for n in names], bias)


def _float(value):
    return dequantize(value, np.float32) if isinstance(value, QuantizedTensor) else value


def load_weights(model_file: ModelFile, backend) -> ModelWeights:
    """Every weight, prepared once by the backend (which decides how to hold it)."""
    validate_tensors(model_file)
    c = model_file.config
    get = model_file.get

    def vector(name):
        return backend.prepare_vector(np.asarray(_float(get(name)), np.float32)) if name in model_file.entries \
            else None

    def norm(prefix):
        return (vector(f"{prefix}.weight"), vector(f"{prefix}.bias"))

    layers = {}
    for stage, count in stage_sizes(c).items():
        layers[stage] = [LayerWeights(
            attn_norm=norm(f"{stage}.{i}.attn_norm"),
            qkv=load_layer_linear(model_file, backend, f"{stage}.{i}", "qkv"),
            out=load_layer_linear(model_file, backend, f"{stage}.{i}", "out"),
            mlp_norm=norm(f"{stage}.{i}.mlp_norm"),
            up=load_layer_linear(model_file, backend, f"{stage}.{i}", "up"),
            down=load_layer_linear(model_file, backend, f"{stage}.{i}", "down"),
            attn_post_norm=norm(f"{stage}.{i}.attn_post_norm") if c.post_norm != "none" else None,
            mlp_post_norm=norm(f"{stage}.{i}.mlp_post_norm") if c.post_norm != "none" else None,
        ) for i in range(count)]
    head_name = "embed.weight" if c.tied_head else "head.weight"
    weights = ModelWeights(
        embed=backend.prepare_embedding(get("embed.weight")),
        pos_embed=backend.prepare_embedding(get("pos_embed.weight")) if c.positions == "learned" else None,
        layers=layers,
        final_norm=norm("final_norm"),
        head=backend.prepare_linear([get(head_name)]),
    )
    if c.input_injection == "concat":
        adapter = np.asarray(_float(get("adapter.weight")), np.float32)               # (D, 2D): [state | input]
        bias = np.asarray(_float(get("adapter.bias")), np.float32) if c.bias else None
        weights.adapter_state = backend.prepare_linear([np.ascontiguousarray(adapter[:, :c.dim])], bias)
        weights.adapter_input = backend.prepare_linear([np.ascontiguousarray(adapter[:, c.dim:])])
    if c.exit_gate:
        weights.exit_gate = backend.prepare_linear([get("exit_gate.weight")],
                                                   np.asarray(_float(get("exit_gate.bias")), np.float32))
    return weights
