"""A small GGUF v3 writer for tests: metadata, and tensors given as raw ggml bytes."""
from __future__ import annotations

import struct

import numpy as np

TYPE_IDS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "BF16": 30, "Q5_K": 13}


def _string(value: str) -> bytes:
    data = value.encode()
    return struct.pack("<Q", len(data)) + data


def _value(value) -> bytes:
    if isinstance(value, bool):
        return struct.pack("<I", 7) + struct.pack("<?", value)
    if isinstance(value, int):
        return struct.pack("<I", 4) + struct.pack("<I", value)
    if isinstance(value, float):
        return struct.pack("<I", 6) + struct.pack("<f", value)
    if isinstance(value, str):
        return struct.pack("<I", 8) + _string(value)
    if isinstance(value, list):
        if all(isinstance(v, str) for v in value):
            return struct.pack("<IIQ", 9, 8, len(value)) + b"".join(_string(v) for v in value)
        return struct.pack("<IIQ", 9, 5, len(value)) + np.asarray(value, np.int32).tobytes()
    raise TypeError(type(value))


def write_gguf(path, metadata: dict, tensors: dict, alignment: int = 32) -> None:
    """tensors: name -> (type name, numpy shape (rows, row length), raw bytes)."""
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for key, value in metadata.items():
        header += _string(key) + _value(value)
    offset, infos, blobs = 0, b"", []
    for name, (type_name, shape, raw) in tensors.items():
        dims = list(reversed(shape))
        infos += _string(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        infos += struct.pack("<IQ", TYPE_IDS[type_name], offset)
        padded = raw + b"\0" * (-len(raw) % alignment)
        blobs.append(padded)
        offset += len(padded)
    head = header + infos
    head += b"\0" * (-len(head) % alignment)
    with open(path, "wb") as f:
        f.write(head + b"".join(blobs))


def random_raw(type_name: str, shape, rng) -> bytes:
    """Random but valid ggml bytes of a tensor type."""
    count = int(np.prod(shape))
    if type_name == "F32":
        return rng.standard_normal(count).astype(np.float32).tobytes()
    if type_name == "F16":
        return rng.standard_normal(count).astype(np.float16).tobytes()
    if type_name == "BF16":
        return (rng.standard_normal(count).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()
    blocks = count // 32
    d = (rng.random(blocks) * 0.1 + 0.001).astype(np.float16).view(np.uint8).reshape(blocks, 2)
    if type_name == "Q4_1":
        m = (rng.standard_normal(blocks) * 0.1).astype(np.float16).view(np.uint8).reshape(blocks, 2)
        qs = rng.integers(0, 256, (blocks, 16), dtype=np.uint8)
        return np.concatenate([d, m, qs], axis=1).tobytes()
    if type_name in ("Q4_0", "Q5_K"):
        qs = rng.integers(0, 256, (blocks, 16), dtype=np.uint8)
        return np.concatenate([d, qs], axis=1).tobytes()
    if type_name == "Q8_0":
        qs = rng.integers(0, 256, (blocks, 32), dtype=np.uint8)
        return np.concatenate([d, qs], axis=1).tobytes()
    raise ValueError(type_name)
