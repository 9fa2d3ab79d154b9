"""The `.tinyloop` model file: safetensors layout, TinyLoop metadata, memory-mapped reads.

Layout (any safetensors reader can list the tensors):

    u64 little-endian  header length N
    N bytes            JSON header: {"__metadata__": {str: str}, name: {dtype, shape, data_offsets}}
                       padded with spaces so the tensor bytes start 64-byte aligned
    tensor bytes       each tensor at its data_offsets, relative to the end of the header

`__metadata__` holds: format ("tinyloop"), format_version, config (JSON), tokenizer
(tokenizer.json text), chat_template, quantization (JSON: weight name -> spec),
data_sha256 (hex SHA-256 of every byte after the header; checked at load).
A quantized weight `W` is stored as `W.qcodes` (uint8), `W.qscale`, `W.qmin` and,
with act-order, `W.qperm` (see quant.py).
"""
from __future__ import annotations

import hashlib
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from tinyloop.errors import ConfigError, ModelFileError
from tinyloop.model.config import ModelConfig
from tinyloop.model.quant import QuantizedTensor

FORMAT_NAME = "tinyloop"
FORMAT_VERSION = 1
SUPPORTED_VERSIONS = (1,)
DATA_ALIGNMENT = 64
MAX_HEADER_BYTES = 256 * 1024 * 1024

# safetensors dtype name -> numpy dtype. BF16 is kept as raw uint16 bits.
DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I32": np.int32,
          "I64": np.int64, "U8": np.uint8, "I8": np.int8}
DTYPE_NAMES = {np.dtype(v): k for k, v in DTYPES.items() if k != "BF16"}
QUANT_PARTS = ("qcodes", "qscale", "qmin", "qperm")
# SHA-256 of every byte after the header, in `__metadata__`: a bit flipped in the tensor data
# is refused at load (a damaged header or a truncated file already fails the parse). The
# streaming writer serialises a placeholder of the same width first and patches the digest in
# once the tensors are written. Files written before it have no checksum and load unchecked.
DATA_HASH_KEY = "data_sha256"
HASH_PLACEHOLDER = "0" * 64
HASH_CHUNK = 16 << 20


# ----------------------------------------------------------------------------- writing
def write_model_file(path, config: ModelConfig, tensors: dict, tokenizer_json: str,
                     chat_template: str = "", extra_metadata: dict | None = None) -> Path:
    """Write tensors (numpy arrays or QuantizedTensor) and metadata to `path` atomically."""
    path = Path(path)
    arrays: dict[str, np.ndarray] = {}
    quantization: dict[str, dict] = {}
    for name, value in tensors.items():
        if isinstance(value, QuantizedTensor):
            quantization[name] = value.spec()
            arrays[f"{name}.qcodes"] = value.codes
            arrays[f"{name}.qscale"] = value.scale
            arrays[f"{name}.qmin"] = value.min
            if value.perm is not None:
                arrays[f"{name}.qperm"] = np.asarray(value.perm, np.int32)
        else:
            arrays[name] = np.asarray(value)
    metadata = file_metadata(config, tokenizer_json, chat_template, quantization, extra_metadata)
    specs = [TensorSpec(name, DTYPE_NAMES.get(array.dtype, ""), tuple(array.shape)) for name, array in arrays.items()]
    for spec in specs:
        if not spec.dtype:
            raise ValueError(f"tensor {spec.name}: dtype {arrays[spec.name].dtype} cannot be stored")
    return write_streaming(path, metadata, specs, lambda name: arrays[name])


@dataclass(frozen=True)
class TensorSpec:
    """One tensor to be written: its name, safetensors dtype name and shape."""
    name: str
    dtype: str                     # "F32", "F16", "BF16" (raw uint16 bits), ...
    shape: tuple


def file_metadata(config: ModelConfig, tokenizer_json: str, chat_template: str = "",
                  quantization: dict | None = None, extra_metadata: dict | None = None) -> dict:
    metadata = {
        "format": FORMAT_NAME,
        "format_version": str(FORMAT_VERSION),
        "config": orjson.dumps(config.to_dict()).decode(),
        "tokenizer": tokenizer_json,
        "chat_template": chat_template or "",
        "quantization": orjson.dumps(quantization or {}).decode(),
    }
    for key, value in (extra_metadata or {}).items():
        metadata[key] = value if isinstance(value, str) else orjson.dumps(value).decode()
    return metadata


def write_streaming(path, metadata: dict, specs: list, produce, on_tensor=None) -> Path:
    """Write a model file whose tensors come one at a time: the header from `specs`
    first, then produce(name) -> ndarray for each (held only while it is written), so
    memory is one tensor. Written to PATH.partial and renamed at the end: an
    interrupted or failed write never leaves a half-written PATH. on_tensor(i, name)
    after each tensor (progress)."""
    path = Path(path)
    # Widest items first so every tensor sits at a multiple of its own item size.
    order = sorted(specs, key=lambda t: (-np.dtype(DTYPES[t.dtype]).itemsize, t.name))
    # the placeholder first, so it is the first run of its bytes in the header
    header: dict = {"__metadata__": {DATA_HASH_KEY: HASH_PLACEHOLDER,
                                     **{k: v for k, v in metadata.items() if k != DATA_HASH_KEY}}}
    offset = 0
    for spec in order:
        nbytes = int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(DTYPES[spec.dtype]).itemsize
        header[spec.name] = {"dtype": spec.dtype, "shape": list(spec.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header_bytes = orjson.dumps(header)
    header_bytes += b" " * (-(8 + len(header_bytes)) % DATA_ALIGNMENT)
    hash_at = 8 + header_bytes.index(HASH_PLACEHOLDER.encode())
    digest = hashlib.sha256()

    tmp = path.with_name(path.name + ".partial")
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(header_bytes)))
            f.write(header_bytes)
            for index, spec in enumerate(order, 1):
                array = np.ascontiguousarray(produce(spec.name))
                expected = np.dtype(DTYPES[spec.dtype])
                if array.dtype != expected or tuple(array.shape) != tuple(spec.shape):
                    raise ValueError(f"tensor {spec.name}: produced {array.dtype} {array.shape}, "
                                     f"declared {spec.dtype} {tuple(spec.shape)}")
                data = array.tobytes()
                digest.update(data)
                f.write(data)
                if on_tensor is not None:
                    on_tensor(index, spec.name)
            f.seek(hash_at)
            f.write(digest.hexdigest().encode())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        # a missing folder, a full disk, no permission: the user's to fix, said in one line
        raise ModelFileError(path, f"cannot write: {exc.strerror or exc}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


# ----------------------------------------------------------------------------- reading
class ModelFile:
    """A memory-mapped `.tinyloop` file. Tensors are read-only views of the map."""

    def __init__(self, path):
        self.path = Path(path)
        try:
            self._file = open(self.path, "rb")
        except OSError as exc:
            raise ModelFileError(path, f"cannot open: {exc.strerror}") from None
        try:
            self._parse()
        except BaseException:
            self.close()
            raise

    def verify_data(self) -> bool:
        """Check the tensor bytes against the file's checksum (ModelFileError if they differ).
        -> False for a file written without one (nothing to check), True when it matches."""
        expected = self.metadata.get(DATA_HASH_KEY)
        if expected is None:
            return False
        digest = hashlib.sha256()
        self._file.seek(self.data_start)
        while chunk := self._file.read(HASH_CHUNK):
            digest.update(chunk)
        if digest.hexdigest() != expected:
            self._fail("the tensor data does not match the file's checksum (data_sha256): the file is "
                       "corrupt; convert or download it again")
        return True

    def _fail(self, problem: str):
        raise ModelFileError(self.path, problem)

    def _parse(self):
        size = os.fstat(self._file.fileno()).st_size
        self.file_size = size
        if size < 8:
            self._fail(f"file is {size} bytes, too short to be a model file")
        (header_len,) = struct.unpack("<Q", self._file.read(8))
        if header_len > MAX_HEADER_BYTES:
            self._fail("does not start with a valid header length: not a .tinyloop/safetensors file")
        if 8 + header_len > size:
            self._fail(f"header says {header_len} bytes but only {size - 8} follow: "
                       "the file is truncated or is not a .tinyloop file")
        try:
            header = orjson.loads(self._file.read(header_len))
        except orjson.JSONDecodeError:
            self._fail("header is not valid JSON: not a .tinyloop/safetensors file, or corrupt")
        if not isinstance(header, dict):
            self._fail("header is not a JSON object")
        metadata = header.pop("__metadata__", None)
        if not isinstance(metadata, dict) or metadata.get("format") != FORMAT_NAME:
            self._fail("not a TinyLoop model file: the header has no '__metadata__.format = "
                       "tinyloop' marker (a plain safetensors file? convert it first)")
        version = metadata.get("format_version")
        if not (isinstance(version, str) and version.isdigit() and int(version) in SUPPORTED_VERSIONS):
            self._fail(f"format version {version!r} is not supported (this TinyLoop reads "
                       f"{', '.join(map(str, SUPPORTED_VERSIONS))}); upgrade TinyLoop to read it")
        self.metadata = metadata
        self.data_start = 8 + header_len
        data_size = size - self.data_start
        self.entries: dict[str, tuple[np.dtype, tuple, int, int]] = {}
        for name, entry in header.items():
            self.entries[name] = self._check_entry(name, entry, data_size)

        try:
            self.config = ModelConfig.from_dict(orjson.loads(metadata.get("config", "null")))
        except (orjson.JSONDecodeError, ConfigError, TypeError) as exc:
            self._fail(f"invalid model config in header: {exc}")
        self.tokenizer_json: str = metadata.get("tokenizer", "")
        self.chat_template: str = metadata.get("chat_template", "")
        try:
            self.quantization: dict = orjson.loads(metadata.get("quantization", "{}"))
        except orjson.JSONDecodeError:
            self._fail("quantization metadata is not valid JSON")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else None

    def _check_entry(self, name, entry, data_size):
        if not isinstance(entry, dict):
            self._fail(f"tensor {name!r}: header entry is not an object")
        dtype_name, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype_name not in DTYPES:
            self._fail(f"tensor {name!r}: unsupported dtype {dtype_name!r} "
                       f"(supported: {', '.join(DTYPES)})")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            self._fail(f"tensor {name!r}: shape must be a list of non-negative integers")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) for o in offsets) and 0 <= offsets[0] <= offsets[1]):
            self._fail(f"tensor {name!r}: data_offsets must be [begin, end] with begin <= end")
        dtype = np.dtype(DTYPES[dtype_name])
        expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if offsets[1] - offsets[0] != expected:
            self._fail(f"tensor {name!r}: shape {tuple(shape)} of {dtype_name} needs {expected} bytes, "
                       f"data_offsets give {offsets[1] - offsets[0]}")
        if offsets[1] > data_size:
            self._fail(f"tensor {name!r} ends at byte {self.data_start + offsets[1]} but the file has "
                       f"{self.file_size} bytes: the file is truncated")
        if dtype_name == "BF16":
            dtype = np.dtype(np.uint16)
        return dtype, tuple(shape), offsets[0], dtype_name

    # -- access -----------------------------------------------------------------------
    @property
    def tensor_names(self) -> list[str]:
        return list(self.entries)

    def weight_names(self) -> list[str]:
        """Logical weight names: quantized weights once, without their part suffixes."""
        names = []
        for name in self.entries:
            base, _, part = name.rpartition(".")
            if part in QUANT_PARTS and base in self.quantization:
                if part == "qcodes":
                    names.append(base)
            else:
                names.append(name)
        return names

    def raw(self, name: str) -> np.ndarray:
        """A read-only view of one stored tensor, without copying."""
        if name not in self.entries:
            self._fail(f"missing tensor {name!r}")
        dtype, shape, begin, _ = self.entries[name]
        count = int(np.prod(shape, dtype=np.int64))
        if count == 0:
            return np.zeros(shape, dtype)
        return np.frombuffer(self._map, dtype=dtype, count=count,
                             offset=self.data_start + begin).reshape(shape)

    def stored_dtype(self, name: str) -> str:
        return self.entries[name][3]

    def get(self, name: str):
        """A weight by logical name: an ndarray view, or a QuantizedTensor of views."""
        spec = self.quantization.get(name)
        if spec is None:
            if name not in self.entries:
                self._fail(f"missing tensor {name!r}")
            array = self.raw(name)
            if self.stored_dtype(name) == "BF16":
                array = (array.astype(np.uint32) << 16).view(np.float32)
            return array
        perm = self.raw(f"{name}.qperm") if spec.get("act_order") else None
        tensor = QuantizedTensor(self.raw(f"{name}.qcodes"), self.raw(f"{name}.qscale"),
                                 self.raw(f"{name}.qmin"), int(spec["bits"]),
                                 int(spec["group_size"]), spec.get("method", "rtn"), perm)
        if tensor.padded_in != spec["shape"][1]:
            tensor.in_features = int(spec["shape"][1])
        return tensor

    def weight_shape(self, name: str) -> tuple:
        spec = self.quantization.get(name)
        if spec is not None:
            return tuple(spec["shape"])
        if name not in self.entries:
            self._fail(f"missing tensor {name!r}")
        return self.entries[name][1]

    def quant_summary(self) -> str:
        """One word for model_info.quant: fp32/fp16/bf16, or e.g. int4 when linears are quantized."""
        if self.quantization:
            bits = sorted({spec["bits"] for spec in self.quantization.values()})
            return "+".join(f"int{b}" for b in bits)
        kinds = {self.stored_dtype(n) for n in self.entries if n.endswith("weight")}
        for name, label in (("F32", "fp32"), ("BF16", "bf16"), ("F16", "fp16")):
            if kinds == {name}:
                return label
        return "mixed" if kinds else "none"

    def quant_details(self) -> dict | None:
        """Bits, group sizes, methods and act-order of the quantized weights (None if none)."""
        if not self.quantization:
            return None
        specs = list(self.quantization.values())
        return {"bits": sorted({s["bits"] for s in specs}), "group_size": sorted({s["group_size"] for s in specs}),
                "method": sorted({s.get("method", "rtn") for s in specs}),
                "act_order": any(s.get("act_order") for s in specs), "tensors": len(specs)}

    def release_pages(self) -> None:
        """Drop this process's mapping of the file's pages (they stay in the page cache). After
        the backend has re-laid the weights, what is still read through the map (embedding
        rows) faults back in page by page, and the resident memory no longer counts the
        whole file beside the re-laid copy."""
        if self._map is not None and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def close(self):
        # Views into the map keep it alive; only close the file object itself.
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
