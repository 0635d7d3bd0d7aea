"""A minimal safetensors reader and writer, independent of kiln, for comparing kiln's Python
results with the files `kiln eval` writes (the format: an 8-byte little-endian header length,
a JSON header of {name: {dtype, shape, data_offsets}}, then the bytes)."""

import json
import struct

import numpy as np

DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I32": "<i4", "I64": "<i8"}


def read(path):
    """{name: numpy array} of a safetensors file."""
    with open(path, "rb") as file:
        blob = file.read()
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + length])
    data = blob[8 + length :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        array = np.frombuffer(data[begin:end], dtype=DTYPES[info["dtype"]])
        tensors[name] = array.reshape(info["shape"])
    return tensors


def write(path, tensors):
    """Writes {name: numpy array} as a safetensors file."""
    names = {np.dtype(v): k for k, v in DTYPES.items()}
    header, chunks, offset = {}, [], 0
    for name, array in tensors.items():
        array = np.ascontiguousarray(array)
        raw = array.astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {
            "dtype": names[array.dtype.newbyteorder("<")],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        chunks.append(raw)
        offset += len(raw)
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as file:
        file.write(struct.pack("<Q", len(encoded)) + encoded + b"".join(chunks))
