"""Megatron's pre-tokenized dataset files (`MMIDIDX` version 1): what the reference's C4 download holds.

`<prefix>.idx`: magic b"MMIDIDX\\x00\\x00", u64 version (1), u8 dtype code, u64 number of sequences,
u64 number of documents, int32 sequence lengths, int64 byte offsets of each sequence in the .bin,
int64 document boundaries (sequence indices, 0 first). `<prefix>.bin`: the tokens, back to back.
The index is checked with numpy memory maps, so an 80 GB file costs no memory (benchmarks/lm/data.py reads
the rows with TensorFlow ops); `write` makes small files for tests.
"""
from __future__ import annotations

import dataclasses
import os
import struct

import numpy as np

from harness.errors import HarnessError

MAGIC = b"MMIDIDX\x00\x00"
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
          8: np.uint16}
CODES = {np.dtype(v): k for k, v in DTYPES.items()}
_HEADER = len(MAGIC) + 8 + 1 + 8 + 8
CHECKED_TOKENS = 1 << 24


@dataclasses.dataclass(frozen=True)
class IndexInfo:
    dtype: np.dtype
    sizes: np.ndarray
    pointers: np.ndarray
    tokens: int
    max_token: int


def write(prefix: str, documents: list[np.ndarray] | list[list[int]], dtype=np.uint16) -> None:
    """Writes documents (each one sequence; end each with EOD as Megatron's --append-eod does)."""
    dtype = np.dtype(dtype)
    arrays = [np.asarray(d, dtype) for d in documents]
    sizes = np.array([len(a) for a in arrays], np.int32)
    pointers = np.concatenate([[0], np.cumsum(sizes[:-1], dtype=np.int64) * dtype.itemsize]).astype(np.int64)
    with open(prefix + ".bin", "wb") as f:
        for a in arrays:
            f.write(a.tobytes())
    with open(prefix + ".idx", "wb") as f:
        f.write(MAGIC)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", CODES[dtype]))
        f.write(struct.pack("<Q", len(arrays)))
        f.write(struct.pack("<Q", len(arrays) + 1))
        f.write(sizes.tobytes())
        f.write(pointers.tobytes())
        f.write(np.arange(len(arrays) + 1, dtype=np.int64).tobytes())


def open_index(prefix: str) -> IndexInfo:
    """Reads and checks `<prefix>.idx` against `<prefix>.bin`; any defect is one HarnessError."""
    idx, bin_ = prefix + ".idx", prefix + ".bin"
    for path in (idx, bin_):
        if not os.path.isfile(path):
            raise HarnessError(f"indexed data: {path} does not exist")
    size = os.path.getsize(idx)
    with open(idx, "rb") as f:
        head = f.read(_HEADER)
    if len(head) < _HEADER or head[:len(MAGIC)] != MAGIC:
        raise HarnessError(f"indexed data: {idx} is not a Megatron MMIDIDX index (bad magic)")
    version, = struct.unpack("<Q", head[9:17])
    code = head[17]
    count, docs = struct.unpack("<QQ", head[18:34])
    if version != 1 or code not in DTYPES:
        raise HarnessError(f"indexed data: {idx} has version {version} and dtype code {code}; "
                           f"only version 1 with codes {sorted(DTYPES)} is known")
    if size != _HEADER + count * 4 + count * 8 + docs * 8:
        raise HarnessError(f"indexed data: {idx} is {size} bytes but its header announces {count} sequences "
                           f"and {docs} document boundaries (truncated or corrupt)")
    dtype = np.dtype(DTYPES[code])
    sizes = np.memmap(idx, np.int32, "r", _HEADER, (count,))
    pointers = np.memmap(idx, np.int64, "r", _HEADER + count * 4, (count,))
    tokens = int(np.sum(sizes, dtype=np.int64))
    if count and (np.any(sizes < 0) or pointers[0] != 0
                  or np.any(np.diff(pointers) != sizes[:-1].astype(np.int64) * dtype.itemsize)):
        raise HarnessError(f"indexed data: {idx} has sequence offsets that do not follow its lengths")
    if os.path.getsize(bin_) != tokens * dtype.itemsize:
        raise HarnessError(f"indexed data: {bin_} is {os.path.getsize(bin_)} bytes but {idx} describes "
                           f"{tokens} tokens of {dtype.name} ({tokens * dtype.itemsize} bytes)")
    # Token ids are checked on a prefix: scanning the reference's 80 GB would take minutes.
    data = (np.memmap(bin_, dtype, "r") if tokens else np.zeros([0], dtype))[:CHECKED_TOKENS]
    max_token = int(data.max()) if tokens else 0
    if tokens and (not np.issubdtype(dtype, np.integer) or int(data.min()) < 0):
        raise HarnessError(f"indexed data: {bin_} holds {dtype.name} values that are not token ids")
    return IndexInfo(dtype, np.asarray(sizes), np.asarray(pointers), tokens, max_token)
