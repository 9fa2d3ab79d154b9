import mmap
import struct

import numpy as np
import orjson
import pytest

from tinyloop.errors import ModelFileError
from tinyloop.model.loader import load_model
from tinyloop.model.modelfile import ModelFile, write_model_file
from tinyloop.model.quant import quantize_rtn
from tinyloop.model.testmodels import (
    make_test_model,
    preset_config,
    random_weights,
    train_tokenizer,
)


@pytest.fixture(scope="module")
def parts():
    tokenizer = train_tokenizer()
    config = preset_config("tiny-looped", tokenizer)
    return config, random_weights(config, seed=3), tokenizer.to_str()


def test_round_trip_keeps_every_tensor_and_the_metadata(tmp_path, parts):
    config, tensors, tokenizer_json = parts
    tensors = dict(tensors)
    tensors["core.0.mlp.up.weight"] = quantize_rtn(tensors["core.0.mlp.up.weight"], 4, 32)
    tensors["embed.weight"] = tensors["embed.weight"].astype(np.float16)
    path = write_model_file(tmp_path / "m.tinyloop", config, tensors, tokenizer_json, "chatml")
    with ModelFile(path) as mf:
        assert mf.config == config
        assert mf.tokenizer_json == tokenizer_json
        assert mf.chat_template == "chatml"
        assert mf.data_start % 64 == 0
        assert set(mf.weight_names()) == set(tensors)
        for name, value in tensors.items():
            got = mf.get(name)
            if name == "core.0.mlp.up.weight":
                assert mf.quantization[name] == value.spec()
                assert np.array_equal(got.codes, value.codes)
                assert np.array_equal(got.scale, value.scale) and np.array_equal(got.min, value.min)
            else:
                assert got.dtype == value.dtype and np.array_equal(got, value)
        assert mf.quant_summary() == "int4"


def test_reader_maps_the_file_without_copying(tmp_path, parts):
    config, tensors, tokenizer_json = parts
    path = write_model_file(tmp_path / "m.tinyloop", config, tensors, tokenizer_json)
    with ModelFile(path) as mf:
        array = mf.get("core.1.attn.q.weight")
        assert not array.flags.owndata and not array.flags.writeable
        assert array.flags.aligned
        base = array
        while isinstance(base, np.ndarray):
            base = base.base
        if isinstance(base, memoryview):
            base = base.obj
        assert isinstance(base, mmap.mmap)


def test_any_safetensors_reader_layout(tmp_path, parts):
    """Header length, JSON header, contiguous data: what every safetensors reader expects."""
    config, tensors, tokenizer_json = parts
    path = write_model_file(tmp_path / "m.tinyloop", config, tensors, tokenizer_json)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = orjson.loads(raw[8:8 + n])
    spans = sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")
    assert spans[0][0] == 0 and spans[-1][1] == len(raw) - 8 - n
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert all(isinstance(v, str) for v in header["__metadata__"].values())


def _write_raw(path, header: dict, data: bytes = b""):
    body = orjson.dumps(header)
    path.write_bytes(struct.pack("<Q", len(body)) + body + data)
    return path


@pytest.fixture()
def good_file(tmp_path):
    path = tmp_path / "good.tinyloop"
    make_test_model(path, "tiny-looped", seed=0)
    return path


def _error(path) -> str:
    with pytest.raises(ModelFileError) as err:
        load_model(path)
    assert str(path) in str(err.value)
    return err.value.problem


def test_truncated_file(good_file, tmp_path):
    data = good_file.read_bytes()
    cut = tmp_path / "cut.tinyloop"
    cut.write_bytes(data[:-100])
    assert "truncated" in _error(cut)
    cut.write_bytes(data[:5])
    assert "too short" in _error(cut)
    cut.write_bytes(data[:200])
    assert "truncated" in _error(cut)


def test_wrong_magic_and_garbage(tmp_path):
    assert "not a TinyLoop model file" in _error(_write_raw(tmp_path / "empty-header", {}))
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"GGUF\x03\x00\x00\x00" + bytes(100))
    assert "header" in _error(garbage)
    plain = _write_raw(tmp_path / "plain.safetensors",
                       {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, bytes(4))
    assert "not a TinyLoop model file" in _error(plain)
    not_json = tmp_path / "notjson"
    not_json.write_bytes(struct.pack("<Q", 4) + b"{{{{")
    assert "not valid JSON" in _error(not_json)


def test_unknown_format_version(good_file, tmp_path):
    data = good_file.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = data[8:8 + n].replace(b'"format_version":"1"', b'"format_version":"9"')
    bad = tmp_path / "v9.tinyloop"
    bad.write_bytes(data[:8] + header + data[8 + n:])
    assert "format version '9' is not supported" in _error(bad)


def test_missing_and_misshaped_tensors(tmp_path, parts):
    config, tensors, tokenizer_json = parts
    missing = dict(tensors)
    del missing["core.1.mlp.down.weight"]
    path = write_model_file(tmp_path / "missing.tinyloop", config, missing, tokenizer_json)
    assert "missing tensor 'core.1.mlp.down.weight'" in _error(path)

    misshaped = dict(tensors)
    misshaped["prelude.0.attn.q.weight"] = tensors["prelude.0.attn.q.weight"][:, :-1]
    path = write_model_file(tmp_path / "shape.tinyloop", config, misshaped, tokenizer_json)
    assert "'prelude.0.attn.q.weight' has shape (64, 63), the model config needs (64, 64)" in _error(path)


def test_inconsistent_entry_and_bad_config(tmp_path):
    meta = {"format": "tinyloop", "format_version": "1", "config": "{}"}
    bad_size = _write_raw(tmp_path / "a", {"__metadata__": meta,
                                           "w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 4]}},
                          bytes(4))
    assert "needs 12 bytes" in _error(bad_size)
    bad_dtype = _write_raw(tmp_path / "b", {"__metadata__": meta,
                                            "w": {"dtype": "F8", "shape": [1], "data_offsets": [0, 1]}},
                           bytes(1))
    assert "unsupported dtype 'F8'" in _error(bad_dtype)
    bad_config = _write_raw(tmp_path / "c", {"__metadata__": meta})
    assert "invalid model config" in _error(bad_config)


def test_missing_file_is_a_clear_error(tmp_path):
    assert "cannot open" in _error(tmp_path / "nope.tinyloop")


def test_the_data_checksum_is_the_sha256_of_the_tensor_bytes_and_catches_a_flipped_bit(tmp_path):
    """data_sha256 (patched into the header after the tensors are streamed) equals hashlib's
    SHA-256 of every byte after the header; one flipped bit anywhere in them is refused."""
    import hashlib

    from tinyloop.model.testmodels import make_test_model
    path = tmp_path / "m.tinyloop"
    make_test_model(path, "tiny-looped", seed=4)
    data = path.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    with ModelFile(path) as f:
        assert f.metadata["data_sha256"] == hashlib.sha256(data[8 + header_len:]).hexdigest()
        assert f.verify_data() is True
    for where in (8 + header_len, len(data) // 2, len(data) - 1):
        flipped = tmp_path / f"flip{where}.tinyloop"
        flipped.write_bytes(data[:where] + bytes([data[where] ^ 1]) + data[where + 1:])
        with ModelFile(flipped) as f, pytest.raises(ModelFileError, match="checksum"):
            f.verify_data()
