"""A reader of the reference's preprocessed Yambda-5B flat cache: the anchors of a day window in the
reference's order, each built into one sample of static-shape features for `HSTURanker`.

Layout and rules (mlcommons/training@a67b8459 recommendation_v4/generative_recommenders/dlrm_v4/datasets/
yambda.py `_FlatEventStore`, `window_indices`, `_gather_interleaved_history`, `_build_sample`, and
datasets/utils.py `xxhash_cross`):
- `<cache>/flat_*.npy`: one row per event in (uid, session, time) order; `user_start`/`user_end` by uid;
  `positions_L<history>.npy`: the flat position of every anchor (a LISTEN with a full history), ascending;
  `anchor_ts_L<history>.npy`: their timestamps. Item -> artist / album: `artist_item_mapping.parquet` and
  `album_item_mapping.parquet` (columns item_id, artist_id / album_id) in the metadata folder.
- Window w holds the anchors with timestamp in [t_min + 86400 w, t_min + 86400 (w + 1)), t_min the first
  anchor's, in ascending index order (user-major); training walks windows 0..298 once, eval is window 299.
- History: of the events [max(user_start, p - 20000), p) the last history // 3 of each pool (listen-plus,
  like, skip), merged chronologically, each with its pool bit (1, 2, 4); the candidate's query time is the
  last history event's timestamp, its label the anchor's listen-plus bit.
- Contextual ids: uid, then xxhash64(seed 0) of the anchor's keys packed as little-endian int64, mod the
  table's rows (hour of day = (ts // 3600) % 24, from the anchor).
"""
from __future__ import annotations

import os
import struct
from typing import Iterator

import numpy as np

from harness.errors import HarnessError

from benchmarks.dlrmv4.config import CONTEXT_TABLES

WINDOW_SECONDS = 86400
SCAN_WINDOW = 20000
LP_BIT, LIKE_BIT, SKIP_BIT = 1, 2, 4
LISTEN_TYPE, LISTEN_PLUS_THRESHOLD = 0, 50
COLUMNS = ("flat_uid", "flat_item_ids", "flat_timestamps", "flat_event_types", "flat_played_ratio",
           "flat_is_listen_plus", "flat_is_like", "flat_is_skip", "flat_is_organic", "user_start", "user_end")
# Each cross table's anchor keys (configs.py YAMBDA_5B_CROSS_SPECS, salt 0).
CROSS_KEYS = {"user_x_artist": ("uid", "artist_id"), "user_x_album": ("uid", "album_id"),
              "user_x_hour": ("uid", "hour_of_day"), "item_x_hour": ("item_id", "hour_of_day"),
              "artist_x_hour": ("artist_id", "hour_of_day"), "user_x_is_organic": ("uid", "is_organic"),
              "user_x_artist_x_hour": ("uid", "artist_id", "hour_of_day")}

_M = (1 << 64) - 1
_P1, _P2, _P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
_P4, _P5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M


def _round(acc: int, lane: int) -> int:
    return (_rotl((acc + lane * _P2) & _M, 31) * _P1) & _M


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 (github.com/Cyan4973/xxHash, xxhash.h XXH64), in Python: the crosses hash 16 or 24 bytes each."""
    n, i = len(data), 0
    if n >= 32:
        v = [(seed + _P1 + _P2) & _M, (seed + _P2) & _M, seed & _M, (seed - _P1) & _M]
        while i + 32 <= n:
            v = [_round(v[k], int.from_bytes(data[i + 8 * k:i + 8 * k + 8], "little")) for k in range(4)]
            i += 32
        h = (_rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)) & _M
        for k in range(4):
            h = ((h ^ _round(0, v[k])) * _P1 + _P4) & _M
    else:
        h = (seed + _P5) & _M
    h = (h + n) & _M
    while i + 8 <= n:
        h ^= _round(0, int.from_bytes(data[i:i + 8], "little"))
        h = (_rotl(h, 27) * _P1 + _P4) & _M
        i += 8
    if i + 4 <= n:
        h ^= (int.from_bytes(data[i:i + 4], "little") * _P1) & _M
        h = (_rotl(h, 23) * _P2 + _P3) & _M
        i += 4
    while i < n:
        h ^= (data[i] * _P5) & _M
        h = (_rotl(h, 11) * _P1) & _M
        i += 1
    h ^= h >> 33
    h = (h * _P2) & _M
    h ^= h >> 29
    h = (h * _P3) & _M
    return h ^ (h >> 32)


def cross_id(values: tuple[int, ...], rows: int) -> int:
    """xxhash64(seed 0) of the values packed as little-endian int64s, mod `rows` (utils.py xxhash_cross)."""
    return xxh64(struct.pack(f"<{len(values)}q", *values)) % rows


class FlatStore:
    """The flat cache of one history length, memory-mapped read-only, with the item maps."""

    def __init__(self, cache_dir: str, metadata_dir: str, history_length: int) -> None:
        missing = [f"{c}.npy" for c in COLUMNS if not os.path.exists(os.path.join(cache_dir, f"{c}.npy"))]
        self.positions_file = os.path.join(cache_dir, f"positions_L{history_length}.npy")
        if not os.path.exists(self.positions_file):
            missing.append(os.path.basename(self.positions_file))
        if missing:
            raise HarnessError(f"data.data_dir {cache_dir} is not the reference's flat cache for history "
                               f"{history_length}: missing {', '.join(missing[:4])}")
        for c in COLUMNS:
            setattr(self, c, np.load(os.path.join(cache_dir, f"{c}.npy"), mmap_mode="r"))
        self.positions = np.load(self.positions_file, mmap_mode="r")
        ts_file = os.path.join(cache_dir, f"anchor_ts_L{history_length}.npy")
        self.anchor_ts = (np.load(ts_file, mmap_mode="r") if os.path.exists(ts_file)
                          else np.asarray(self.flat_timestamps[self.positions]))
        self.t_min = int(self.anchor_ts.min())
        self.per_pool = max(1, history_length // 3)
        self.item_to_artist, self.item_to_album = read_item_maps(metadata_dir)

    def window(self, w: int) -> np.ndarray:
        """Anchor indices (into `positions`) of day window w, ascending (user-major)."""
        lo = self.t_min + w * WINDOW_SECONDS
        return np.flatnonzero((self.anchor_ts >= lo) & (self.anchor_ts < lo + WINDOW_SECONDS))

    def sample(self, anchor: int, history_length: int) -> dict[str, np.ndarray]:
        """The features of anchor index `anchor`, histories zero-padded to `history_length`."""
        p = int(self.positions[anchor])
        uid = int(self.flat_uid[p])
        start = max(int(self.user_start[uid]), p - SCAN_WINDOW)
        local = np.arange(p - start)
        pools = [local[np.asarray(self.flat_is_listen_plus[start:p])][-self.per_pool:],
                 local[np.asarray(self.flat_is_like[start:p])][-self.per_pool:],
                 local[np.asarray(self.flat_is_skip[start:p])][-self.per_pool:]]
        keep = np.sort(np.concatenate(pools), kind="stable")[-history_length:] + start
        items = np.asarray(self.flat_item_ids[keep], np.int64)
        weight = (np.where(self.flat_is_listen_plus[keep], LP_BIT, 0) | np.where(self.flat_is_like[keep], LIKE_BIT, 0)
                  | np.where(self.flat_is_skip[keep], SKIP_BIT, 0))
        n = keep.size
        target, ts = int(self.flat_item_ids[p]), int(self.flat_timestamps[p])
        anchor_keys = {"uid": uid, "item_id": target, "artist_id": self.artist(target), "album_id": self.album(target),
                       "hour_of_day": (ts // 3600) % 24, "is_organic": int(self.flat_is_organic[p])}
        label = (int(self.flat_event_types[p]) == LISTEN_TYPE
                 and float(self.flat_played_ratio[p]) >= LISTEN_PLUS_THRESHOLD)

        def pad(x: np.ndarray) -> np.ndarray:
            return np.pad(np.asarray(x, np.int64), (0, history_length - n))

        return {"uih_length": np.int64(n), "uih_item_id": pad(items),
                "uih_artist_id": pad([self.artist(i) for i in items]),
                "uih_album_id": pad([self.album(i) for i in items]),
                "uih_timestamp": pad(self.flat_timestamps[keep]), "uih_action": pad(weight),
                "cand_item_id": np.int64(target), "cand_artist_id": np.int64(anchor_keys["artist_id"]),
                "cand_album_id": np.int64(anchor_keys["album_id"]), "label": np.int64(label),
                "anchor_keys": anchor_keys}

    def artist(self, item: int) -> int:
        return int(self.item_to_artist[item]) if item < self.item_to_artist.shape[0] else 0

    def album(self, item: int) -> int:
        return int(self.item_to_album[item]) if item < self.item_to_album.shape[0] else 0


def context_ids(anchor_keys: dict[str, int], tables: dict[str, int]) -> np.ndarray:
    """The 8 contextual ids in CONTEXT_TABLES order: the uid, then each cross's hash mod its rows."""
    out = [anchor_keys["uid"]]
    for name in CONTEXT_TABLES[1:]:
        out.append(cross_id(tuple(anchor_keys[k] for k in CROSS_KEYS[name]), tables[name]))
    return np.asarray(out, np.int64)


def read_item_maps(metadata_dir: str) -> tuple[np.ndarray, np.ndarray]:
    """item -> artist and item -> album arrays (0 where unmapped), sized as the reference sizes them."""
    import pyarrow.parquet as pq

    maps = []
    for kind in ("artist", "album"):
        path = os.path.join(metadata_dir, f"{kind}_item_mapping.parquet")
        if not os.path.exists(path):
            raise HarnessError(f"data.metadata_dir {metadata_dir} has no {kind}_item_mapping.parquet")
        table = pq.read_table(path, columns=["item_id", f"{kind}_id"])
        maps.append((table.column("item_id").to_numpy(), table.column(f"{kind}_id").to_numpy()))
    n_items = int(max(int(items.max()) + 1 for items, _ in maps))
    out = []
    for items, values in maps:
        arr = np.zeros(n_items, np.int64)
        arr[items] = values
        out.append(arr)
    return out[0], out[1]


def replica_order(indices: np.ndarray, replicas: int, per_replica: int) -> Iterator[np.ndarray]:
    """The reference's dealing (train/utils.py StreamingWindowSampler): truncate the window to a multiple of the
    replicas, replica r takes indices[r::W], each takes whole batches (drop_last). Yields each global step's
    anchors replica by replica, so consecutive equal slices of a global batch are the replicas' batches."""
    usable = len(indices) - len(indices) % replicas
    dealt = [indices[r:usable:replicas] for r in range(replicas)]
    steps = len(dealt[0]) // per_replica
    for s in range(steps):
        yield np.concatenate([d[s * per_replica:(s + 1) * per_replica] for d in dealt])

