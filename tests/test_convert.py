"""GGUF conversion: lossless tensors, exact tokenizer rebuild, config, clear refusals."""
import numpy as np
import orjson
import pytest
from gguf_writer import random_raw, write_gguf

from tinyloop.convert.from_gguf import convert_gguf
from tinyloop.convert.gguf import GGUFError
from tinyloop.convert.quant_blocks import reference_dequantize
from tinyloop.model.loader import load_model
from tinyloop.model.modelfile import ModelFile
from tinyloop.model.quant import QuantizedTensor, dequantize
from tinyloop.model.testmodels import train_tokenizer
from tinyloop.text.tokenizer import Tokenizer

DIM, HEADS, KV, FFN, BLOCKS = 64, 4, 2, 128, 2
TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\nYou are a tiny test model<|im_end|>\n' }}{% endif %}"
            "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}")


def tokenizer_metadata():
    tokenizer = train_tokenizer()
    spec = orjson.loads(tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    tokens = [None] * len(vocab)
    for token, index in vocab.items():
        tokens[index] = token
    special = {t["id"] for t in spec["added_tokens"]}
    merges = [" ".join(m) if isinstance(m, list) else m for m in spec["model"]["merges"]]
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": [3 if i in special else 1 for i in range(len(tokens))],
            "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.add_bos_token": False,
            "tokenizer.chat_template": TEMPLATE}
    return tokenizer, meta, len(tokens)


def llama_gguf(path, types, arch="llama", seed=0):
    """A 2-block llama GGUF whose linear weights use `types` in turn."""
    rng = np.random.default_rng(seed)
    tokenizer, meta, vocab = tokenizer_metadata()
    meta = {"general.architecture": arch, "general.name": "test-llama", "llama.block_count": BLOCKS,
            "llama.context_length": 256, "llama.embedding_length": DIM, "llama.feed_forward_length": FFN,
            "llama.attention.head_count": HEADS, "llama.attention.head_count_kv": KV,
            "llama.rope.freq_base": 10000.0, "llama.attention.layer_norm_rms_epsilon": 1e-5, **meta}
    shapes = {"token_embd.weight": (vocab, DIM), "output_norm.weight": (DIM,)}
    for b in range(BLOCKS):
        shapes.update({f"blk.{b}.attn_norm.weight": (DIM,), f"blk.{b}.ffn_norm.weight": (DIM,),
                       f"blk.{b}.attn_q.weight": (DIM, DIM), f"blk.{b}.attn_k.weight": (KV * 16, DIM),
                       f"blk.{b}.attn_v.weight": (KV * 16, DIM), f"blk.{b}.attn_output.weight": (DIM, DIM),
                       f"blk.{b}.ffn_gate.weight": (FFN, DIM), f"blk.{b}.ffn_up.weight": (FFN, DIM),
                       f"blk.{b}.ffn_down.weight": (DIM, FFN)})
    tensors, cycle = {}, 0
    for name, shape in shapes.items():
        if len(shape) == 1:
            kind = "F32"
        else:
            kind = types[cycle % len(types)]
            cycle += 1
        tensors[name] = (kind, shape, random_raw(kind, shape, rng))
    write_gguf(path, meta, tensors)
    return tokenizer, tensors


def expected_values(kind, shape, raw):
    data = np.frombuffer(raw, np.uint8)
    if kind == "F32":
        return data.view(np.float32).reshape(shape)
    if kind == "F16":
        return data.view(np.float16).astype(np.float32).reshape(shape)
    if kind == "BF16":
        return (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    return reference_dequantize(kind, data, shape)


def test_every_supported_type_converts_exactly(tmp_path):
    types = ["Q4_1", "Q4_0", "Q8_0", "F16", "BF16", "F32"]
    _, tensors = llama_gguf(tmp_path / "m.gguf", types)
    convert_gguf(tmp_path / "m.gguf", tmp_path / "m.tinyloop", progress=False)
    mf = ModelFile(tmp_path / "m.tinyloop")
    from tinyloop.convert.from_gguf import tinyloop_name
    seen = set()
    for name, (kind, shape, raw) in tensors.items():
        stored = mf.get(tinyloop_name(name))
        values = dequantize(stored) if isinstance(stored, QuantizedTensor) else np.asarray(stored, np.float32)
        assert np.array_equal(values, expected_values(kind, shape, raw)), (name, kind)
        seen.add(kind)
        if kind in ("Q4_1", "Q4_0"):
            assert stored.bits == 4 and stored.group_size == 32
        if kind == "Q8_0":
            assert stored.bits == 8 and stored.group_size == 32
    assert seen == set(types)
    assert "int4" in mf.quant_summary() and "int8" in mf.quant_summary()


def test_config_tokenizer_and_template(tmp_path):
    tokenizer, _ = llama_gguf(tmp_path / "m.gguf", ["Q4_1"])
    convert_gguf(tmp_path / "m.gguf", tmp_path / "m.tinyloop", progress=False)
    loaded = load_model(tmp_path / "m.tinyloop")
    c = loaded.config
    assert (c.n_core, c.n_prelude, c.n_coda, c.max_loops, c.dim, c.n_heads, c.n_kv_heads) == (2, 0, 0, 1, 64, 4, 2)
    assert c.tied_head and c.norm == "rmsnorm" and c.mlp == "swiglu" and c.max_seq_len == 256
    assert c.bos_token_id is None                   # add_bos_token false
    assert 2 in c.eos_token_ids and 0 in c.eos_token_ids
    rebuilt = Tokenizer(ModelFile(tmp_path / "m.tinyloop").tokenizer_json)
    tokenizer.encode_special_tokens = True           # both sides: special spellings are plain text
    for text in ["Hello there!", "numbers 12345 and 3.14", "café 東京 🚀", "  spaces\n\ttab", "<|im_end|>"]:
        # digits are split one by one by the smollm pre-tokenizer; compare on digit-free text
        if not any(ch.isdigit() for ch in text):
            assert rebuilt.encode(text) == tokenizer.encode(text, add_special_tokens=False).ids, text
        assert rebuilt.decode(rebuilt.encode(text)) == text
    assert all(len(rebuilt.id_to_token(i)) == 1 for i in rebuilt.encode("2026"))
    from tinyloop.text.chat import ChatTemplate
    template = ChatTemplate.from_metadata(loaded.file.chat_template)
    assert template.name == "chatml" and template.default_system == "You are a tiny test model"
    assert loaded.file.metadata["source_format"] == "gguf-v3"
    # the converted model runs
    from tinyloop.engine.generate import GenerationRequest, generate
    assert len(generate(loaded.model, GenerationRequest([5, 6, 7], 4, ignore_eos=True)).tokens) == 4


def test_unsupported_type_and_architecture_are_refused(tmp_path):
    llama_gguf(tmp_path / "k.gguf", ["Q4_1", "Q5_K"])
    with pytest.raises(GGUFError, match="tensor types Q5_K are not supported; supported: F32, F16, BF16, "
                                        "Q8_0, Q4_0, Q4_1"):
        convert_gguf(tmp_path / "k.gguf", tmp_path / "k.tinyloop", progress=False)
    llama_gguf(tmp_path / "g.gguf", ["F16"], arch="gemma")
    with pytest.raises(GGUFError, match="architecture 'gemma' is not supported"):
        convert_gguf(tmp_path / "g.gguf", tmp_path / "g.tinyloop", progress=False)
    assert not (tmp_path / "k.tinyloop").exists() and not (tmp_path / "g.tinyloop").exists()


def test_not_gguf_and_truncated(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(GGUFError, match="not a GGUF file"):
        convert_gguf(tmp_path / "x.gguf", tmp_path / "x.tinyloop", progress=False)
    llama_gguf(tmp_path / "t.gguf", ["F16"])
    data = (tmp_path / "t.gguf").read_bytes()
    (tmp_path / "t.gguf").write_bytes(data[:len(data) // 2])
    with pytest.raises(GGUFError, match="truncated"):
        convert_gguf(tmp_path / "t.gguf", tmp_path / "t.tinyloop", progress=False)
    (tmp_path / "h.gguf").write_bytes(data[:300])
    with pytest.raises(GGUFError, match="truncated"):
        convert_gguf(tmp_path / "h.gguf", tmp_path / "h.tinyloop", progress=False)
