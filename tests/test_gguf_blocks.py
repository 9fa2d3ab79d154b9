"""ggml block layouts written out by hand from the format's definition (ggml-common.h),
byte by byte, independent of quant_blocks.py and of tests/gguf_writer.py:

    block_q4_0 { f16 d;          uint8 qs[16]; }   x[j] = ((qs[j] & 15) - 8) * d,  x[j+16] = ((qs[j] >> 4) - 8) * d
    block_q4_1 { f16 d; f16 m;   uint8 qs[16]; }   x[j] = (qs[j] & 15) * d + m,    x[j+16] = (qs[j] >> 4) * d + m
    block_q8_0 { f16 d;          int8  qs[32]; }   x[j] = qs[j] * d

(all little-endian). The low nibble of byte j is value j, the high nibble value j + 16."""
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tinyloop.convert.from_gguf import chat_template_from_gguf, config_from_gguf, convert_gguf, tinyloop_name
from tinyloop.convert.gguf import GGUFError
from tinyloop.convert.quant_blocks import decode, reference_dequantize, tensor_nbytes
from tinyloop.model.quant import QuantizedTensor, dequantize
from tinyloop.text.chat import ChatTemplate


def half(x: float) -> bytes:
    return struct.pack("<e", x)


def q4_block(low: list[int], high: list[int], d: float, m: float | None) -> tuple[bytes, list[float]]:
    """16 low nibbles (values 0..15) and 16 high nibbles (values 16..31) -> the block's bytes
    and its 32 values, by the formulas above."""
    qs = bytes(lo | (hi << 4) for lo, hi in zip(low, high))
    codes = low + high
    if m is None:
        return half(d) + qs, [(c - 8) * d for c in codes]
    return half(d) + half(m) + qs, [c * d + m for c in codes]


def q8_block(values: list[int], d: float) -> tuple[bytes, list[float]]:
    return half(d) + struct.pack("<32b", *values), [v * d for v in values]


def as_values(stored) -> np.ndarray:
    return dequantize(stored) if isinstance(stored, QuantizedTensor) else np.asarray(stored, np.float32)


LOW_A = list(range(16))                     # value j = j
HIGH_A = [15 - j for j in range(16)]        # value j + 16 = 15 - j: differs from LOW_A everywhere
LOW_B = [(3 * j + 1) % 16 for j in range(16)]
HIGH_B = [(5 * j + 2) % 16 for j in range(16)]


@pytest.mark.parametrize("type_name", ["Q4_0", "Q4_1"])
def test_q4_blocks_decode_to_the_hand_written_values(type_name):
    m = (None, None) if type_name == "Q4_0" else (-1.5, 0.25)
    block_a, values_a = q4_block(LOW_A, HIGH_A, 0.5, m[0])
    block_b, values_b = q4_block(LOW_B, HIGH_B, 0.125, m[1])
    block_c, values_c = q4_block(HIGH_B, LOW_A, 2.0, m[0])
    block_d, values_d = q4_block(HIGH_A, LOW_B, 0.0625, m[1])
    raw = np.frombuffer(block_a + block_b + block_c + block_d, np.uint8)   # 2 rows of 64
    expected = np.array([values_a + values_b, values_c + values_d], np.float32)
    stored = decode(type_name, raw, (2, 64))
    assert isinstance(stored, QuantizedTensor) and stored.bits == 4 and stored.group_size == 32
    assert np.array_equal(as_values(stored), expected)
    assert np.array_equal(reference_dequantize(type_name, raw, (2, 64)), expected)   # the other tests' oracle
    assert tensor_nbytes(type_name, (2, 64)) == len(raw) == 4 * (18 if type_name == "Q4_0" else 20)


def test_q8_0_blocks_decode_to_the_hand_written_values():
    ints_a = [(-128 + 9 * j) for j in range(28)] + [127, -1, 0, 1]
    ints_b = [(37 * j) % 256 - 128 for j in range(32)]
    block_a, values_a = q8_block(ints_a, 0.25)
    block_b, values_b = q8_block(ints_b, 0.0078125)
    raw = np.frombuffer(block_a + block_b, np.uint8)
    stored = decode("Q8_0", raw, (1, 64))
    assert stored.bits == 8 and stored.group_size == 32
    expected = np.array([values_a + values_b], np.float32)
    assert np.array_equal(as_values(stored), expected)
    assert np.array_equal(reference_dequantize("Q8_0", raw, (1, 64)), expected)
    assert tensor_nbytes("Q8_0", (1, 64)) == len(raw) == 68


def test_plain_types_decode_by_their_definitions():
    values = [1.0, -2.5, 0.1, 65504.0, -0.0, 3.140625]
    f32 = np.frombuffer(struct.pack("<6f", *values), np.uint8)
    assert np.array_equal(as_values(decode("F32", f32, (2, 3))), np.array(values, np.float32).reshape(2, 3))
    f16 = np.frombuffer(b"".join(half(v) for v in values), np.uint8)
    assert np.array_equal(as_values(decode("F16", f16, (3, 2))), np.array(values, np.float16).reshape(3, 2))
    # bfloat16 is the top half of a float32's bits
    bf16 = np.frombuffer(b"".join(struct.pack("<f", v)[2:] for v in values), np.uint8)
    expected = [struct.unpack("<f", b"\0\0" + struct.pack("<f", v)[2:])[0] for v in values]
    assert np.array_equal(as_values(decode("BF16", bf16, (6,))), np.array(expected, np.float32))
    assert [tensor_nbytes(t, (4, 32)) for t in ("F32", "F16", "BF16")] == [512, 256, 256]


def test_rows_not_a_multiple_of_the_block_are_refused():
    with pytest.raises(ValueError, match="multiple of 32"):
        decode("Q4_0", np.zeros(18 * 2, np.uint8), (3, 16))


def test_gguf_tensor_names_map_to_tinyloop_names():
    expected = {"token_embd.weight": "embed.weight", "output_norm.weight": "final_norm.weight",
                "output.weight": "head.weight", "blk.0.attn_norm.weight": "core.0.attn_norm.weight",
                "blk.3.ffn_norm.weight": "core.3.mlp_norm.weight", "blk.1.attn_q.weight": "core.1.attn.q.weight",
                "blk.1.attn_k.weight": "core.1.attn.k.weight", "blk.1.attn_v.weight": "core.1.attn.v.weight",
                "blk.12.attn_output.weight": "core.12.attn.o.weight",
                "blk.2.ffn_gate.weight": "core.2.mlp.gate.weight", "blk.2.ffn_up.weight": "core.2.mlp.up.weight",
                "blk.2.ffn_down.weight": "core.2.mlp.down.weight", "rope_freqs.weight": None,
                "blk.0.attn_q.bias": None, "blk.x.attn_q.weight": None}
    assert {name: tinyloop_name(name) for name in expected} == expected


# ------------------------------------------------------------------ the converter around the blocks
def gguf_with(metadata: dict, tensor_names=("token_embd.weight",)):
    """What config_from_gguf reads of a GGUF file: its metadata, tensors and path."""
    return SimpleNamespace(metadata=metadata, tensors=dict.fromkeys(tensor_names), path=Path("x.gguf"))


LLAMA = {"general.architecture": "llama", "llama.block_count": 3, "llama.context_length": 128,
         "llama.embedding_length": 64, "llama.feed_forward_length": 96, "llama.attention.head_count": 4,
         "llama.vocab_size": 10}


def test_llama_metadata_becomes_a_one_loop_config_with_defaults():
    c = config_from_gguf(gguf_with(LLAMA))
    assert (c.n_prelude, c.n_core, c.n_coda, c.default_loops, c.max_loops) == (0, 3, 0, 1, 1)
    assert (c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.max_seq_len) == (64, 4, 4, 16, 96, 128)
    assert c.norm_eps == 1e-5 and c.rope_theta == 10000.0 and c.tied_head
    assert c.bos_token_id is None and c.eos_token_ids == () and c.name == "gguf-model"
    untied = config_from_gguf(gguf_with({**LLAMA, "llama.attention.head_count_kv": 2,
                                         "llama.attention.layer_norm_rms_epsilon": 1e-6},
                                        ("token_embd.weight", "output.weight")))
    assert not untied.tied_head and untied.n_kv_heads == 2 and untied.norm_eps == 1e-6


@pytest.mark.parametrize("tokens, eos_id, expected", [
    (["a", "<|endoftext|>", "b"], 2, (2, 1)),          # <|endoftext|> also ends generation
    (["a", "<|endoftext|>", "b"], 1, (1,)),            # already the eos: not twice
    (["a", "b"], 1, (1,)),                             # no <|endoftext|> in the vocabulary
])
def test_eos_ids(tokens, eos_id, expected):
    meta = {**LLAMA, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.eos_token_id": eos_id,
            "tokenizer.ggml.bos_token_id": 0}
    c = config_from_gguf(gguf_with(meta))
    assert c.eos_token_ids == expected and c.bos_token_id is None
    assert config_from_gguf(gguf_with({**meta, "tokenizer.ggml.add_bos_token": True})).bos_token_id == 0


def test_chat_templates():
    chatml = "{{'<|im_start|>system\nBe kind<|im_end|>'}}{{'<|im_start|>' + m['role']}}"
    assert chat_template_from_gguf({"tokenizer.chat_template": chatml}).to_metadata() == \
        ChatTemplate("chatml", "Be kind").to_metadata()
    assert chat_template_from_gguf({"tokenizer.chat_template": "{{'<|im_start|>' + m['role']}}"}).to_metadata() \
        == ChatTemplate("chatml", None).to_metadata()
    assert chat_template_from_gguf({}).to_metadata() == ChatTemplate("plain").to_metadata()


def test_rope_scaling_tensors_are_refused_and_progress_is_reported(tmp_path, monkeypatch, capsys):
    import test_convert
    from gguf_writer import random_raw, write_gguf

    def with_rope_freqs(path, meta, tensors):
        rope = ("F32", (8,), random_raw("F32", (8,), np.random.default_rng(0)))
        write_gguf(path, meta, {**tensors, "rope_freqs.weight": rope})
    test_convert.llama_gguf(tmp_path / "plain.gguf", ["F16"])
    convert_gguf(tmp_path / "plain.gguf", tmp_path / "plain.tinyloop", progress=True)
    err = capsys.readouterr().err
    assert "converting tensors: 1/20 (5%)" in err and "converting tensors: 20/20 (100%)" in err
    assert "converted 20 tensors to " in err
    monkeypatch.setattr(test_convert, "write_gguf", with_rope_freqs)
    test_convert.llama_gguf(tmp_path / "rope.gguf", ["F16"])
    with pytest.raises(GGUFError, match=r"rope_freqs \(RoPE scaling\) tensors are not supported"):
        convert_gguf(tmp_path / "rope.gguf", tmp_path / "rope.tinyloop", progress=False)
    assert not (tmp_path / "rope.tinyloop").exists()
