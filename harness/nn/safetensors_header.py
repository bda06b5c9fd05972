"""A safetensors file's header, read and checked against the file without reading any tensor.

The format (huggingface/safetensors, docs "Format"): an 8-byte little-endian header length, the JSON header
(name -> dtype, shape, data_offsets into the data that follow), then the data. The checks are the ones the
library makes when it opens a file, so that a damaged file is refused by name before a run's log opens rather
than in a SafetensorError at its first read.
"""
from __future__ import annotations

import json
import math
import os
import struct
from typing import Any

# Bytes per element of each safetensors dtype (the format's own list: huggingface/safetensors, safetensors/src/
# tensor.rs `Dtype`); sub-byte dtypes (F4, F6) are left out: their sizes are not whole bytes per element.
ITEM_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
              "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8, "C64": 8}


def read_header(file: str) -> dict[str, Any]:
    """A safetensors file's JSON header (8-byte little-endian length, then the JSON), checked against the file
    as the library checks it when it opens one (huggingface/safetensors `Metadata::validate`): each tensor's
    data_offsets span exactly its shape x dtype bytes, the tensors tile the data without gap or overlap, and
    the data end where the file ends. A file cut short, offsets past the end or a dtype that lies is a
    ValueError here, before a log opens, not a SafetensorError at the first read."""
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("shorter than a header")
        (n,) = struct.unpack("<Q", head)
        if n > 100 * 2 ** 20:
            raise ValueError(f"header of {n} bytes")
        header = json.loads(f.read(n))
        size = os.fstat(f.fileno()).st_size
    if not isinstance(header, dict):
        raise ValueError(f"its header is a JSON {type(header).__name__}, not an object")
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not (isinstance(info, dict) and isinstance(info.get("dtype"), str) and isinstance(info.get("shape"), list)
                and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in info["shape"])):
            raise ValueError(f"its header entry {name!r} is not {{dtype, shape, data_offsets}}")
        offsets = info.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
                and offsets[0] <= offsets[1]):
            raise ValueError(f"tensor {name!r} has data_offsets {offsets!r}, not [begin, end]")
        item = ITEM_BYTES.get(info["dtype"])
        if item is not None and offsets[1] - offsets[0] != math.prod(info["shape"]) * item:
            raise ValueError(f"tensor {name!r} ({info['dtype']} {info['shape']}) needs "
                             f"{math.prod(info['shape']) * item} bytes, its data_offsets span "
                             f"{offsets[1] - offsets[0]}")
        spans.append((offsets[0], offsets[1], name))
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            raise ValueError(f"tensor {name!r} starts at data byte {begin}, not {end} (a gap or an overlap)")
        end = stop
    if 8 + n + end != size:
        raise ValueError(f"the header says {8 + n + end} bytes, the file has {size} "
                         f"({'cut short' if size < 8 + n + end else 'trailing bytes'})")
    return header
