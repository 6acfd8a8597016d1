"""Whether a model directory's weights files are whole, from their headers (milliseconds for any model size): a copy
cut short, a shard missing, a header that does not parse; then whether a safetensors file's floats are all finite
(its bytes read once through a memory map: a NaN or an infinity is a broken model, which would "train" with every
update skipped). A safetensors file is an 8-byte header length, a JSON header giving each tensor's dtype, shape
and byte range, then the tensors' bytes, which the ranges must tile exactly; a torch zip (pytorch_model.bin) keeps
its directory at the end, so a cut one has none."""
from __future__ import annotations

import json
import math
import os
import struct
import zipfile
from typing import Optional

import numpy as np

SAFETENSORS, SAFETENSORS_INDEX = "model.safetensors", "model.safetensors.index.json"
TORCH, TORCH_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"
# Bytes per element; dtypes not listed (sub-byte ones) have their ranges checked but not their sizes.
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
               "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
MAX_HEADER_BYTES = 100 << 20   # the safetensors format's own limit
# Per float dtype: the unsigned integer of its width and its exponent bits, all set in a NaN or an infinity.
EXPONENT_BITS = {"F16": (np.uint16, 0x7C00), "BF16": (np.uint16, 0x7F80), "F32": (np.uint32, 0x7F800000),
                 "F64": (np.uint64, 0x7FF0000000000000)}
CHUNK_ELEMENTS = 1 << 24


def safetensors_damage(path: str) -> tuple[Optional[str], set[str]]:
    """(what is wrong with the file, None when whole; the tensor names its header lists)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return f"{size} bytes, less than a safetensors header", set()
        header_bytes = struct.unpack("<Q", head)[0]
        if header_bytes > min(MAX_HEADER_BYTES, size - 8):
            return f"its header says it is {header_bytes} bytes long and the file has {size}", set()
        try:
            header = json.loads(f.read(header_bytes))
        except ValueError:
            return "its header is not JSON", set()
    if not isinstance(header, dict):
        return "its header is not a JSON object", set()
    tensors = {name: entry for name, entry in header.items() if name != "__metadata__"}
    data_bytes, ranges = size - 8 - header_bytes, []
    for name, entry in tensors.items():
        try:
            begin, end = (int(v) for v in entry["data_offsets"])
            shape = [int(v) for v in entry["shape"]]
        except (KeyError, TypeError, ValueError):
            return f"tensor {name} has no valid data_offsets and shape in the header", set()
        if not 0 <= begin <= end:
            return f"tensor {name} has the byte range {begin}-{end}", set()
        if end > data_bytes:
            return (f"tensor {name} ends at byte {8 + header_bytes + end} and the file has {size}: it is cut short",
                    set())
        width = DTYPE_BYTES.get(entry.get("dtype"))
        if width is not None and end - begin != width * math.prod(shape):
            return f"tensor {name} takes {end - begin} bytes, not the {width * math.prod(shape)} of its shape", set()
        ranges.append((begin, end))
    covered = 0
    for begin, end in sorted(ranges):
        if begin != covered:
            return f"its tensors leave bytes {covered}-{begin} of the data unaccounted for", set()
        covered = end
    if covered != data_bytes:
        return f"{data_bytes - covered} bytes follow its last tensor", set()
    return None, set(tensors)


def non_finite_tensor(path: str) -> Optional[str]:
    """The first tensor of the (whole) safetensors file at `path` that holds a NaN or an infinity, or None."""
    with open(path, "rb") as f:
        header_bytes = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(header_bytes))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_bytes)
    for name, entry in header.items():
        if name == "__metadata__" or entry["dtype"] not in EXPONENT_BITS:
            continue
        unsigned, bits = EXPONENT_BITS[entry["dtype"]]
        begin, end = entry["data_offsets"]
        values = data[begin:end].view(unsigned)
        for start in range(0, len(values), CHUNK_ELEMENTS):
            if np.any(values[start:start + CHUNK_ELEMENTS] & unsigned(bits) == bits):
                return name
    return None


def safetensors_problem(path: str) -> tuple[Optional[str], set[str]]:
    """safetensors_damage, then the floats' finiteness."""
    problem, names = safetensors_damage(path)
    if problem is None and (name := non_finite_tensor(path)) is not None:
        problem = f"tensor {name} holds NaN or infinite values (a diverged training run?); take an earlier checkpoint"
    return problem, names


def torch_zip_damage(path: str) -> Optional[str]:
    """A zip file's directory sits at its end: a cut one has none. (A legacy, non-zip pickle is not checked.)"""
    if not zipfile.is_zipfile(path):
        with open(path, "rb") as f:
            return "it is cut short or not a torch checkpoint" if f.read(2) == b"PK" else None
    size = os.path.getsize(path)
    try:
        with zipfile.ZipFile(path) as archive:
            past = [info.filename for info in archive.infolist()  # 30: a member's own header, before its name
                    if info.header_offset + 30 + len(info.filename.encode()) + info.compress_size > size]
    except (zipfile.BadZipFile, OSError) as exc:
        return f"its zip directory does not read ({exc})"
    return f"{past[0]} lies past its end: it is cut short" if past else None


def weights_damage(model_dir: str) -> Optional[str]:
    """What keeps the weights of the HF directory `model_dir` from loading, or None when they look whole."""
    for index_name, check in ((SAFETENSORS_INDEX, "safetensors"), (TORCH_INDEX, "torch")):
        index_path = os.path.join(model_dir, index_name)
        if not os.path.isfile(index_path):
            continue
        try:
            with open(index_path) as f:
                weight_map = json.load(f)["weight_map"]
            shards = sorted(set(weight_map.values()))
        except (ValueError, KeyError, TypeError, AttributeError):
            return f"{index_name} does not read as an index of shards"
        for shard in shards:
            path = os.path.join(model_dir, shard)
            if not os.path.isfile(path):
                return f"{shard}, a shard {index_name} names, is missing"
            if check == "torch":
                problem = torch_zip_damage(path)
            else:
                problem, names = safetensors_problem(path)
                absent = sorted(n for n, s in weight_map.items() if s == shard and n not in names)
                problem = problem or (f"{absent[0]} is not in it, though {index_name} says so" if absent else None)
            if problem:
                return f"the weights file {shard}: {problem}"
        return None
    if os.path.isfile(os.path.join(model_dir, SAFETENSORS)):
        problem = safetensors_problem(os.path.join(model_dir, SAFETENSORS))[0]
        return f"the weights file {SAFETENSORS}: {problem}" if problem else None
    if os.path.isfile(os.path.join(model_dir, TORCH)):
        problem = torch_zip_damage(os.path.join(model_dir, TORCH))
        return f"the weights file {TORCH}: {problem}" if problem else None
    return f"it holds no weights ({SAFETENSORS}, {TORCH} or an index of their shards)"
