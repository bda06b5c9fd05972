"""benchmarks/dlrmv4/yambda.py on a flat cache in the reference's layout that the test writes: anchors, day
windows in user-major order, the per-pool history cap merged chronologically with pool bits, the candidate
and its label, item maps from parquet, the replicas' dealing, refusals in one line, and the pure-Python XXH64
of the cross features against values of the `xxhash` package (4.x, written down from the side venv)."""
from __future__ import annotations

import os
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness.errors import HarnessError

from benchmarks.dlrmv4.yambda import FlatStore, context_ids, cross_id, replica_order, xxh64

pytestmark = pytest.mark.quick

# xxhash.xxh64(struct.pack("<nq", *values), seed=0).intdigest() from the xxhash package.
XXHASH = [((3, 17), 3526385600308566673), ((0, 0), 12612883901365648434), ((51, 12345, 7), 5300130725154808282),
          ((999999, 1 << 40, 23), 1027729755285271957), ((-5, 8), 5414915764741409408)]
HISTORY = 6  # two events per pool
# User 1's events: (event type, played %); 0 listen, 1 like, 2 dislike.
USER1 = [(0, 80), (0, 20), (1, 0), (0, 90), (2, 0), (0, 10), (0, 70), (1, 0), (1, 0), (0, 30), (0, 60), (0, 40)]
USER2 = [(0, 55)] * 10


def write_cache(root: str) -> tuple[str, str]:
    cache, meta = os.path.join(root, "cache"), os.path.join(root, "meta")
    os.makedirs(cache)
    os.makedirs(meta)
    events = [(1, t, r) for t, r in USER1] + [(2, t, r) for t, r in USER2]
    uid = np.array([e[0] for e in events], np.int64)
    types = np.array([e[1] for e in events], np.int64)
    ratio = np.array([e[2] for e in events], np.float32)
    ts = np.concatenate([1_000_000 + np.arange(12) * 5 * 3600, 1_000_000 + np.arange(10) * 7 * 3600]).astype(np.int64)
    listen = types == 0
    cols = {"flat_uid": uid, "flat_item_ids": np.arange(22, dtype=np.int64) + 3, "flat_timestamps": ts,
            "flat_event_types": types, "flat_played_ratio": ratio, "flat_is_listen_plus": listen & (ratio >= 50),
            "flat_is_like": types == 1, "flat_is_skip": listen & (ratio < 50),
            "flat_is_organic": (np.arange(22) % 2).astype(np.int8),
            "user_start": np.array([-1, 0, 12], np.int64), "user_end": np.array([-1, 12, 22], np.int64)}
    for name, arr in cols.items():
        np.save(os.path.join(cache, f"{name}.npy"), arr)
    starts = cols["user_start"][uid]
    positions = np.flatnonzero(listen & (np.arange(22) - starts >= HISTORY))
    np.save(os.path.join(cache, f"positions_L{HISTORY}.npy"), positions)
    items = np.arange(25, dtype=np.int64)
    pq.write_table(pa.table({"item_id": items, "artist_id": items % 7 + 1}),
                   os.path.join(meta, "artist_item_mapping.parquet"))
    pq.write_table(pa.table({"item_id": np.arange(30, dtype=np.int64), "album_id": np.arange(30) + 100}),
                   os.path.join(meta, "album_item_mapping.parquet"))
    return cache, meta


def test_xxh64_equals_the_xxhash_package():
    for values, want in XXHASH:
        assert xxh64(struct.pack(f"<{len(values)}q", *values)) == want
        assert cross_id(values, 97) == want % 97
    assert xxh64(bytes(range(40))) == 17715543491017654761  # the 32-byte-stripe path
    assert xxh64(b"abcde") == 568411279426701291  # the 4-byte and 1-byte tails


def test_reader_builds_the_reference_samples(tmp_path):
    cache, meta = write_cache(str(tmp_path))
    store = FlatStore(cache, meta, HISTORY)
    assert list(store.positions) == [6, 9, 10, 11, 18, 19, 20, 21]
    anchor = 2  # flat position 10: user 1's listen at 60 %
    s = store.sample(anchor, HISTORY)
    # Scan [0, 10): listen-plus 0, 3, 6 -> 3, 6; like 2, 7, 8 -> 7, 8; skip 1, 5, 9 -> 5, 9; dislike 4 never.
    assert int(s["uih_length"]) == 6
    assert list(s["uih_item_id"]) == [p + 3 for p in (3, 5, 6, 7, 8, 9)]
    assert list(s["uih_action"]) == [1, 4, 1, 2, 2, 4]
    assert list(s["uih_artist_id"]) == [(p + 3) % 7 + 1 for p in (3, 5, 6, 7, 8, 9)]
    assert list(s["uih_album_id"]) == [p + 103 for p in (3, 5, 6, 7, 8, 9)]
    assert int(s["cand_item_id"]) == 13 and int(s["label"]) == 1
    assert int(s["cand_artist_id"]) == 13 % 7 + 1 and int(s["cand_album_id"]) == 113
    assert list(s["uih_timestamp"]) == [1_000_000 + p * 5 * 3600 for p in (3, 5, 6, 7, 8, 9)]
    later = store.sample(3, HISTORY)  # flat 11 at 40 %: a skip, label 0
    assert int(later["label"]) == 0
    short = store.sample(0, HISTORY)  # flat 6: the pools hold 0, 3 / 2 / 1, 5 -> five events, padded
    assert int(short["uih_length"]) == 5 and list(short["uih_item_id"]) == [3, 4, 5, 6, 8, 0]
    keys = s["anchor_keys"]
    assert keys["hour_of_day"] == ((1_000_000 + 10 * 5 * 3600) // 3600) % 24 and keys["is_organic"] == 0
    tables = {"user_x_artist": 97, "user_x_album": 89, "user_x_hour": 83, "item_x_hour": 79, "artist_x_hour": 73,
              "user_x_is_organic": 5, "user_x_artist_x_hour": 71}
    ctx = context_ids(keys, tables)
    assert ctx[0] == 1 and ctx[1] == cross_id((1, keys["artist_id"]), 97)
    assert ctx[7] == cross_id((1, keys["artist_id"], keys["hour_of_day"]), 71)


def test_windows_are_user_major_days_and_dealt_round_robin(tmp_path):
    store = FlatStore(*write_cache(str(tmp_path)), HISTORY)
    windows = [store.window(w) for w in range(4)]
    assert sorted(np.concatenate(windows).tolist()) == list(range(8))
    for w, idx in enumerate(windows):
        assert list(idx) == sorted(idx)  # ascending index: user 1's anchors of the day before user 2's
        ts = store.anchor_ts[idx]
        assert np.all((ts >= store.t_min + w * 86400) & (ts < store.t_min + (w + 1) * 86400))
    steps = list(replica_order(np.arange(11), replicas=2, per_replica=2))
    assert [s.tolist() for s in steps] == [[0, 2, 1, 3], [4, 6, 5, 7]]  # the remainder is dropped


def test_a_folder_without_the_cache_is_refused_in_one_line(tmp_path):
    cache, meta = write_cache(str(tmp_path))
    os.remove(os.path.join(cache, f"positions_L{HISTORY}.npy"))
    with pytest.raises(HarnessError, match=r"missing positions_L6\.npy"):
        FlatStore(cache, meta, HISTORY)
    other, _ = write_cache(str(tmp_path / "other"))
    with pytest.raises(HarnessError, match="no artist_item_mapping"):
        FlatStore(other, str(tmp_path), HISTORY)  # a metadata folder without the parquet maps


def reference_layout(root: str) -> tuple[str, str]:
    """write_cache's files named and completed as the reference's cache (min history 4086): its sixteen files."""
    cache, meta = write_cache(root)
    os.rename(os.path.join(cache, f"positions_L{HISTORY}.npy"), os.path.join(cache, "positions_L4086.npy"))
    np.save(os.path.join(cache, "anchor_ts_L4086.npy"), np.arange(3, dtype=np.int64))
    np.save(os.path.join(cache, "unique_uids.npy"), np.array([1, 2], np.int64))
    with open(os.path.join(cache, "store_meta.json"), "w") as f:
        f.write('{"num_events": 22}\n')
    open(os.path.join(cache, "_READY"), "w").close()
    return cache, meta


def test_data_verify_against_the_reference_cache_manifest(tmp_path):
    """benchmarks/dlrmv4/data_manifest.yaml on a cache the test writes: the reference's sixteen names pass and its
    published total size (227,241,207,610 bytes) is named as the difference; a manifest of the written files' own
    sha256s passes with every hash checked, then names the one file changed and a missing one."""
    import hashlib

    import yaml

    from harness.data import verify as data_verify

    from conftest import REPO

    cache, meta = reference_layout(str(tmp_path))
    config = os.path.join(REPO, "configs", "dlrmv4", "reference.yaml")
    where = [f"data.data_dir={cache}", f"data.metadata_dir={meta}"]
    manifest, report = data_verify.verify_config(config, where)
    assert [fs.name for fs in manifest.sets] == ["cache", "metadata"]
    total = sum(os.path.getsize(os.path.join(cache, n)) for n in os.listdir(cache))
    assert report.errors == [f"{cache}/*: 16 files of {total} bytes in all, the reference's are 227241207610 bytes "
                             f"(source: mlcommons/training@a30a01a7eee77846b282221dd0bc2e31a0269005:"
                             f"recommendation_v4/sha256sums_yambda_5b_cache.txt)"], report.errors
    assert report.checked[1].startswith(f"metadata ({meta}/*_item_mapping.parquet): 2 files named as published")

    with open(os.path.join(REPO, "benchmarks", "dlrmv4", "data_manifest.yaml")) as f:
        own = yaml.safe_load(f)
    cached = own["sets"]["cache"]
    cached["total_size"]["value"] = total
    for name, facts in cached["files"].items():
        with open(os.path.join(cache, name), "rb") as f:
            facts["sha256"]["value"] = hashlib.sha256(f.read()).hexdigest()
    path = str(tmp_path / "manifest.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(own, f)
    _, report = data_verify.verify_config(config, where, manifest_file=path)
    assert report.errors == [] and "16 hashes" in report.checked[0], report
    with open(os.path.join(cache, "flat_is_like.npy"), "r+b") as f:  # same size, one byte flipped
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    _, report = data_verify.verify_config(config, where, manifest_file=path)
    assert len(report.errors) == 1 and report.errors[0].startswith(f"{cache}/flat_is_like.npy: sha256 "), report
    os.remove(os.path.join(cache, "_READY"))
    _, report = data_verify.verify_config(config, where, manifest_file=path)
    assert report.errors == [f"{cache}/_READY: missing (the reference's layout has 16 cache files; source: "
                             f"mlcommons/training@a30a01a7eee77846b282221dd0bc2e31a0269005:"
                             f"recommendation_v4/sha256sums_yambda_5b_cache.txt)"], report.errors
