"""safetensors files, read and written without the `safetensors` package: a tensor is a
memory-mapped view of its bytes (read), and a file is written a tensor at a time (write),
so neither holds two tensors in memory.

    entries = index("model.safetensors")          # name -> (file, dtype, shape, offset)
    w = read(entries["model.norm.weight"])         # np.memmap
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Callable

import ml_dtypes
import numpy as np

_DTYPES = {
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "F64": np.float64,
    "I64": np.int64,  # e.g. BERT's position_ids buffer
}


def index(path: str) -> dict[str, tuple]:
    """name -> (file, dtype, shape, byte offset) from the file's JSON header."""
    try:
        with open(path, "rb") as f:
            n = int(np.frombuffer(f.read(8), np.uint64)[0])
            header = json.loads(f.read(n))
    except (ValueError, IndexError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a valid safetensors file ({e})") from None
    size = os.path.getsize(path)
    out = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        if meta["dtype"] not in _DTYPES:
            raise ValueError(f"{path}: tensor {name} has unsupported dtype {meta['dtype']}")
        start, end = meta["data_offsets"]
        if 8 + n + end > size:
            raise ValueError(f"{path}: tensor {name} runs past the end of the file (truncated?)")
        out[name] = (path, _DTYPES[meta["dtype"]], tuple(meta["shape"]), 8 + n + start)
    return out


def read(entry: tuple) -> np.ndarray:
    """The tensor an `index` entry names, memory-mapped (read from disk as it is used)."""
    path, dtype, shape, offset = entry
    return np.memmap(path, dtype=dtype, mode="r", offset=offset, shape=shape)


def files(folder: str) -> list[str]:
    """The shards the index names (when there is one), else every *.safetensors file."""
    index_path = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
        files = [os.path.join(folder, n) for n in names]
        missing = [n for n, f in zip(names, files) if not os.path.exists(f)]
        if missing:
            raise ValueError(f"{index_path}: lists shards that are not in the folder: {missing}")
        return files
    files = sorted(glob.glob(os.path.join(folder, "*.safetensors")))
    if not files:
        raise ValueError(f"{folder}: no *.safetensors weights in the folder")
    return files


WRITE_DTYPES = {"float32": ("F32", np.float32), "bfloat16": ("BF16", ml_dtypes.bfloat16),
                 "float16": ("F16", np.float16)}  # fmt: skip


def write(path: str, tensors: list[tuple[str, tuple, Callable]], dtype: str = "float32") -> None:
    """A safetensors file of tensors (name, shape, read) in `dtype`, read and written one
    at a time: the header is known from the shapes, so no two tensors are in memory at once."""
    code, np_dtype = WRITE_DTYPES[dtype]
    header, offset = {}, 0
    for name, shape, _ in tensors:
        size = np.dtype(np_dtype).itemsize * int(np.prod(shape))
        header[name] = dict(dtype=code, shape=list(shape), data_offsets=[offset, offset + size])
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header to 8 bytes with spaces
    with open(path, "wb") as f:
        f.write(np.uint64(len(raw)).tobytes() + raw)
        for name, shape, read in tensors:
            w = np.ascontiguousarray(read(), np_dtype)
            if w.shape != shape:
                raise ValueError(f"{path}: tensor {name} has shape {w.shape}, expected {shape}")
            f.write(w.tobytes())
