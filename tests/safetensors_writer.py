"""A minimal safetensors writer for tests (the format: u64 header length, JSON header,
raw bytes), so tests can build checkpoint variants without the safetensors package.
uint16 arrays are written as BF16 bits (what SafetensorsDir reads them back as)."""
import json
import struct

import numpy as np

NAMES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.uint16): "BF16"}


def save_file(tensors: dict, path) -> None:
    header, offset, blobs = {}, 0, []
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        header[name] = {"dtype": NAMES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
        blobs.append(array.tobytes())
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
