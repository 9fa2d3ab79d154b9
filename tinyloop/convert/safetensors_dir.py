"""Read the tensors of a Hugging Face checkpoint directory: `model.safetensors`, or shards
listed by `model.safetensors.index.json` (its weight_map: tensor name -> shard file).

A safetensors file is an 8-byte little-endian header length, a JSON header
({name: {dtype, shape, data_offsets}}, optional "__metadata__"), then the raw bytes.
Tensors are read-only memory-mapped views, so converting holds one tensor at a time.
BF16 tensors come back as their raw uint16 bits.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinyloop.errors import TinyLoopError

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64,
          "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
FLOAT_DTYPES = ("F32", "F16", "BF16")
MAX_HEADER = 100 * 1024 * 1024


class CheckpointError(TinyLoopError):
    """A checkpoint directory is incomplete, corrupt or of an unsupported kind."""


@dataclass(frozen=True)
class TensorInfo:
    file: Path
    dtype: str
    shape: tuple
    begin: int                  # absolute byte offset in the file
    end: int


class SafetensorsDir:
    """Every tensor of a checkpoint directory, by name, read lazily."""

    def __init__(self, directory):
        self.directory = Path(directory)
        index = self.directory / "model.safetensors.index.json"
        single = self.directory / "model.safetensors"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError) as exc:
                raise CheckpointError(f"{index}: not a safetensors index ({exc})") from None
            files = sorted(set(weight_map.values()))
        elif single.is_file():
            weight_map, files = None, ["model.safetensors"]
        else:
            raise CheckpointError(f"{self.directory}: no model.safetensors or model.safetensors.index.json "
                                  "(only safetensors checkpoints convert; .bin/.pt pickles are refused)")
        self.tensors: dict[str, TensorInfo] = {}
        for name in files:
            path = self.directory / name
            if not path.is_file():
                raise CheckpointError(f"{path}: shard listed in the index is missing")
            for tensor, info in _read_header(path).items():
                if weight_map is not None and weight_map.get(tensor) != name:
                    continue            # the index says another shard holds it
                self.tensors[tensor] = info
        if weight_map is not None:
            missing = sorted(set(weight_map) - set(self.tensors))
            if missing:
                raise CheckpointError(f"{self.directory}: tensors in the index but not in their shard: "
                                      f"{', '.join(missing[:5])}")
        self._maps: dict[Path, np.memmap] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def info(self, name: str) -> TensorInfo:
        if name not in self.tensors:
            raise CheckpointError(f"{self.directory}: tensor {name!r} is missing")
        return self.tensors[name]

    def get(self, name: str) -> np.ndarray:
        """A read-only view of the tensor's stored values (BF16 as uint16 bits)."""
        info = self.info(name)
        if info.file not in self._maps:
            self._maps[info.file] = np.memmap(info.file, np.uint8, mode="r")
        raw = self._maps[info.file][info.begin:info.end]
        return raw.view(DTYPES[info.dtype]).reshape(info.shape)


def _read_header(path: Path) -> dict:
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: too short to be a safetensors file")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER, size - 8):
            raise CheckpointError(f"{path}: header length {length} is impossible; not a safetensors file")
        try:
            header = json.loads(f.read(length))
        except ValueError:
            raise CheckpointError(f"{path}: the header is not JSON; not a safetensors file") from None
    header.pop("__metadata__", None)
    start = 8 + length
    tensors = {}
    for name, entry in header.items():
        dtype, shape, (begin, end) = entry["dtype"], tuple(entry["shape"]), entry["data_offsets"]
        if dtype not in DTYPES:
            raise CheckpointError(f"{path}: tensor {name!r} has dtype {dtype}, which is not supported")
        expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(DTYPES[dtype]).itemsize
        if end - begin != expected or start + end > size:
            raise CheckpointError(f"{path}: tensor {name!r} has inconsistent offsets (truncated file?)")
        tensors[name] = TensorInfo(path, dtype, shape, start + begin, start + end)
    return tensors
