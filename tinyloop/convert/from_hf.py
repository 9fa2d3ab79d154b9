"""`tinyloop convert DIR OUT.tinyloop` for a Hugging Face checkpoint directory.

Reads config.json (+ generation_config.json), the safetensors weights (one file or
shards with their index), tokenizer.json and the chat template of tokenizer_config.json;
writes the .tinyloop file one tensor at a time (memory: one tensor), to OUT.partial,
renamed into place only once complete. Weights keep their stored precision
(bf16, fp16 or fp32). Layouts: hf_layouts.py.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from tinyloop.convert.hf_chat import chat_template_from_hf
from tinyloop.convert.hf_layouts import layout
from tinyloop.convert.safetensors_dir import FLOAT_DTYPES, CheckpointError, SafetensorsDir
from tinyloop.model.config import ModelConfig
from tinyloop.model.modelfile import TensorSpec, file_metadata, write_streaming
from tinyloop.model.weights import expected_tensors
from tinyloop.progress import Progress

# stored tensors that carry nothing TinyLoop needs (precomputed RoPE tables)
IGNORED_SUFFIXES = ("rotary_emb.inv_freq", "freqs_cis")


def is_hf_checkpoint(path) -> bool:
    return Path(path).is_dir() and (Path(path) / "config.json").is_file()


def _json(path: Path, required: bool = True) -> dict:
    if not path.is_file():
        if required:
            raise CheckpointError(f"{path} is missing")
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None


def _tokenizer(tokenizer_json: str) -> dict:
    try:
        data = json.loads(tokenizer_json)
    except ValueError as exc:
        raise CheckpointError(f"tokenizer.json: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError("tokenizer.json: not a JSON object")
    return data


def special_token_ids(data: dict, tokenizer_config: dict) -> dict:
    """{"bos": id, "eos": id} of the tokens tokenizer_config.json names (a string or
    {"content": ...}), looked up in tokenizer.json (`data`, parsed); absent when not named or
    not found."""
    ids = {t.get("content"): t.get("id") for t in data.get("added_tokens") or []}
    vocab = (data.get("model") or {}).get("vocab")
    found = {}
    for key in ("bos", "eos"):
        token = _token_name(tokenizer_config.get(f"{key}_token"))
        token_id = ids.get(token, vocab.get(token) if isinstance(vocab, dict) else None)
        if isinstance(token_id, int):
            found[key] = token_id
    return found


def _token_name(token):
    return token.get("content") if isinstance(token, dict) else token


def adds_bos(data: dict, tokenizer_config: dict) -> bool:
    """Whether the checkpoint's tokenizer puts its bos token before a text: tokenizer_config.json's
    `add_bos_token` where it says, else whether tokenizer.json's post-processor starts every
    single text with that token (Llama 3's tokenizers add <|begin_of_text|> that way and carry
    no add_bos_token)."""
    if tokenizer_config.get("add_bos_token") is not None:
        return bool(tokenizer_config["add_bos_token"])
    bos = _token_name(tokenizer_config.get("bos_token"))
    processor = data.get("post_processor") or {}
    processors = (processor.get("processors") or []) if processor.get("type") == "Sequence" else [processor]
    for step in processors:
        if isinstance(step, dict) and step.get("type") == "TemplateProcessing":
            first = (step.get("single") or [{}])[0]
            return bos is not None and (first.get("SpecialToken") or {}).get("id") == bos
    return False


def convert_hf(source, output, progress: bool = True) -> ModelConfig:
    directory = Path(source)
    hf = _json(directory / "config.json")
    generation = _json(directory / "generation_config.json", required=False)
    tokenizer_config = _json(directory / "tokenizer_config.json", required=False)
    tokenizer_path = directory / "tokenizer.json"
    if not tokenizer_path.is_file():
        raise CheckpointError(f"{tokenizer_path} is missing (only fast tokenizers, tokenizer.json, are supported)")
    name = str(hf.get("_name_or_path") or directory.name)
    weights = SafetensorsDir(directory)
    tokenizer_json = tokenizer_path.read_text(encoding="utf-8")
    tokenizer = _tokenizer(tokenizer_json)                      # parsed once, for both questions
    config, pieces = layout(hf, generation, adds_bos(tokenizer, tokenizer_config), name,
                            weights.tensors, special_token_ids(tokenizer, tokenizer_config))

    shapes = expected_tensors(config)
    produced = {piece.target for piece in pieces}
    if produced != set(shapes):
        raise CheckpointError(f"internal: layout and model disagree on {sorted(produced ^ set(shapes))[:5]}")
    used = {piece.source for piece in pieces}
    if config.tied_head:
        used.add("lm_head.weight")              # a tied checkpoint may store the head too
    leftover = sorted(n for n in weights.tensors if n not in used and not n.endswith(IGNORED_SUFFIXES))
    if leftover:
        raise CheckpointError(f"{directory}: tensors this layout does not use: {', '.join(leftover[:5])}"
                              f"{' ...' if len(leftover) > 5 else ''} (an unsupported variant?)")
    by_target = {piece.target: piece for piece in pieces}
    specs = []
    for target, shape in shapes.items():
        info = weights.info(by_target[target].source)
        if info.dtype not in FLOAT_DTYPES:
            raise CheckpointError(f"tensor {by_target[target].source} is {info.dtype}; "
                                  f"only {', '.join(FLOAT_DTYPES)} weights convert")
        specs.append(TensorSpec(target, info.dtype, tuple(shape)))

    def produce(target: str) -> np.ndarray:
        piece = by_target[target]
        value = weights.get(piece.source)
        if piece.transform is not None:
            value = piece.transform(value)
        if tuple(value.shape) != tuple(shapes[target]):
            raise CheckpointError(f"tensor {piece.source} gives {target} the shape {tuple(value.shape)}; "
                                  f"config.json implies {tuple(shapes[target])}")
        return value

    shipped_template = tokenizer_config.get("chat_template")
    template = chat_template_from_hf(shipped_template)
    if shipped_template and template.name == "plain":
        # not an error (the model still converts and completes text), but chat requests would
        # not be in the turn format the model was tuned on: say so rather than leave it silent
        print(f"tinyloop convert: warning: {directory.name} ships a chat template TinyLoop does not render "
              "(it renders ChatML and Huginn's turns); chat requests will use the plain "
              "'System:/User:/Assistant:' template", file=sys.stderr)
    metadata = file_metadata(config, tokenizer_json, template.to_metadata(),
                             extra_metadata={"source": directory.name, "source_format": "huggingface",
                                             "source_architecture": ",".join(hf.get("architectures", []))})
    bar = Progress("converting tensors", len(specs), enabled=progress)
    write_streaming(output, metadata, specs, produce, on_tensor=bar.update)
    bar.finish(f"converted {len(specs)} tensors to {output}")
    return config
