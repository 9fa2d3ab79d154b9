"""A GGUF (v2/v3) reader: metadata, tensor table, and the raw bytes of each tensor.

Read by hand rather than with the `gguf` package: the format is a short header, a
key/value table and a tensor table, and the converter needs only those plus a few
block layouts (see quant_blocks.py), with clear errors naming the file.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinyloop.errors import TinyLoopError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF value types
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9

# ggml tensor types this reader knows by name (others are reported by number)
GGML_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
              10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
              17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS",
              24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16"}


class GGUFError(TinyLoopError):
    def __init__(self, path, problem):
        super().__init__(f"{path}: {problem}")


@dataclass
class GGUFTensor:
    name: str
    shape: tuple          # numpy order: (rows, ..., row length); GGUF stores ne[0] = row length first
    type_id: int
    offset: int           # from the start of the data section

    @property
    def type_name(self) -> str:
        return GGML_TYPES.get(self.type_id, f"type {self.type_id}")


class GGUFFile:
    def __init__(self, path):
        self.path = Path(path)
        try:
            self._file = open(self.path, "rb")
        except OSError as exc:
            raise GGUFError(path, f"cannot open: {exc.strerror}") from None
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self._pos = 0
        try:
            self._parse()
        except (struct.error, UnicodeDecodeError, IndexError, ValueError) as exc:
            raise GGUFError(self.path, f"corrupt or truncated GGUF header ({exc})") from None

    def _read(self, fmt):
        size = struct.calcsize(fmt)
        if self._pos + size > len(self._map):
            raise GGUFError(self.path, "the file ends inside its header: truncated")
        value = struct.unpack_from(fmt, self._map, self._pos)
        self._pos += size
        return value[0] if len(value) == 1 else value

    def _string(self) -> str:
        length = self._read("<Q")
        if length > len(self._map) - self._pos:
            raise GGUFError(self.path, "a string runs past the end of the file: truncated or corrupt")
        data = bytes(self._map[self._pos:self._pos + length])
        self._pos += length
        return data.decode("utf-8", errors="replace")

    def _value(self, type_id):
        if type_id in _SCALARS:
            return self._read(_SCALARS[type_id])
        if type_id == _STRING:
            return self._string()
        if type_id == _ARRAY:
            item_type, count = self._read("<I"), self._read("<Q")
            if item_type in _SCALARS:
                fmt = _SCALARS[item_type]
                size = struct.calcsize(fmt) * count
                if self._pos + size > len(self._map):
                    raise GGUFError(self.path, "an array runs past the end of the file: truncated")
                values = np.frombuffer(self._map, dtype=np.dtype(fmt), count=count, offset=self._pos).tolist()
                self._pos += size
                return values
            return [self._value(item_type) for _ in range(count)]
        raise GGUFError(self.path, f"unknown metadata value type {type_id}")

    def _parse(self):
        if len(self._map) < 24 or self._map[:4] != GGUF_MAGIC:
            raise GGUFError(self.path, "not a GGUF file (it does not start with 'GGUF')")
        self._pos = 4
        self.version = self._read("<I")
        if self.version not in (2, 3):
            raise GGUFError(self.path, f"GGUF version {self.version} is not supported (2 and 3 are)")
        n_tensors, n_kv = self._read("<Q"), self._read("<Q")
        self.metadata: dict = {}
        for _ in range(n_kv):
            key = self._string()
            self.metadata[key] = self._value(self._read("<I"))
        self.tensors: dict[str, GGUFTensor] = {}
        for _ in range(n_tensors):
            name = self._string()
            n_dims = self._read("<I")
            dims = [self._read("<Q") for _ in range(n_dims)]
            type_id, offset = self._read("<I"), self._read("<Q")
            self.tensors[name] = GGUFTensor(name, tuple(reversed(dims)), type_id, offset)
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        self.data_start = -(-self._pos // alignment) * alignment

    def tensor_bytes(self, tensor: GGUFTensor, nbytes: int) -> np.ndarray:
        """The tensor's raw bytes as a uint8 view of the map."""
        start = self.data_start + tensor.offset
        if start + nbytes > len(self._map):
            raise GGUFError(self.path, f"tensor {tensor.name!r} runs past the end of the file: truncated")
        return np.frombuffer(self._map, dtype=np.uint8, count=nbytes, offset=start)

    def close(self):
        self._file.close()
