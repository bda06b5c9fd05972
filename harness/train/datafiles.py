"""Finding a workload's data files, with the clear errors every file-based source needs.

Lists a source's shards (a missing directory or a pattern that matches nothing is one line), reads them
sharded over hosts (`sharded_records`), counts TFRecords from their record headers, caches counts beside the
data (`.mlperf-harness-counts.json`; the user's cache folder when that is read-only), keyed by the files'
stamps (`file_stamp`) and the settings that change a count, and turns a stated sample count that disagrees
with the files into one line naming the right number.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from harness.errors import HarnessError, op_error_line
from harness.runtime.base import InputContext


def list_files(data_dir: str, pattern: str, what: str) -> list[str]:
    """Sorted files matching `pattern` under `data_dir`; `what` names the data in the error messages."""
    if not data_dir:
        raise HarnessError(f"data.source=tfrecord needs data.data_dir (the folder of {what})")
    if not os.path.isdir(data_dir):
        raise HarnessError(f"data.data_dir {data_dir} does not exist")
    files = sorted(tf.io.gfile.glob(os.path.join(data_dir, pattern)))
    if not files:
        raise HarnessError(f"no files match {os.path.join(data_dir, pattern)}")
    return files


def sharded_records(files: list[str], ctx: InputContext, shuffle_buffer: int, cycle_length: int,
                    deterministic: bool | None, repeat: bool = True, read_threads: int = 0,
                    read_ahead: bool = False,
                    reader: Callable[[tf.Tensor], tf.data.Dataset] = tf.data.TFRecordDataset) -> tf.data.Dataset:
    """This host's share of the training files as an endless, shuffled stream of raw records.

    Whole files go to hosts (so no record is read twice), file order is reshuffled every pass, and
    records from `cycle_length` files are interleaved and shuffled again. `repeat=False` gives one pass
    (one tf.data service job), shuffled afresh by each job rather than from the run seed.
    `deterministic=None` leaves the order to the dataset's options. `read_threads` (data.read_threads): 0 =
    AUTOTUNE parallel reads, 1 = the files read in turn by the pipeline's own thread, N = N parallel reads.
    One pass (a tf.data service job) reads in parallel whatever `read_threads` says: under the service's
    distributed epoch, the sequential interleave served more records than the epoch holds (TF 2.21, seen in
    tests/test_data_service.py). `reader` turns one file name into its records (a source may pair each with
    the file's name, or drop records, as they are read).
    """
    if len(files) < ctx.num_hosts:
        raise HarnessError(f"{len(files)} training shards cannot be split over {ctx.num_hosts} hosts")
    ds = tf.data.Dataset.from_tensor_slices(files).shard(ctx.num_hosts, ctx.host_id)
    seed = ctx.seed if repeat else None
    ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    ds = ds.interleave(reader, cycle_length=min(cycle_length, len(files)),
                       num_parallel_calls=(None if cycle_length == 1 or (read_threads == 1 and repeat)
                                           else read_threads if read_threads > 1 else tf.data.AUTOTUNE),
                       deterministic=deterministic)
    ds = ds.shuffle(shuffle_buffer, seed=seed)
    # `read_ahead`: the reads get a thread of their own ahead of the caller's map. Read in the map's input thread,
    # ResNet's 76 KB records left 2 idle cores ~9% idle (scripts/bench_input.py: 1.82 cores busy, 1.89 with it);
    # for records of a few KB (BERT, the Transformer) it measured no gain.
    return ds.prefetch(tf.data.AUTOTUNE) if read_ahead else ds


# ------------------------------------------------------------------------------------------ counting

COUNT_CACHE = ".mlperf-harness-counts.json"
_HEADER = 12  # uint64 payload length + uint32 masked CRC of it; the payload is followed by a uint32 CRC


def first_record(path: str) -> bytes | None:
    """The payload of the first record of a TFRecord file (None: the file is empty), from its header alone."""
    size = tf.io.gfile.stat(path).length
    opener = open if "://" not in path else tf.io.gfile.GFile
    with opener(path, "rb") as f:
        header = f.read(_HEADER)
        if not header:
            return None
        length = int.from_bytes(header[:8], "little")
        if len(header) < _HEADER or _HEADER + length + 4 > size:  # checked before reading: no huge allocation
            raise HarnessError(f"{path} is corrupt or truncated: not a TFRecord file (its first record runs "
                               f"past its end)")
        return f.read(length)


def check_examples(files: list[str], spec: dict[str, Any] | tuple[str, ...], what: str) -> None:
    """The first record of each file is a tf.train.Example holding the features of `spec` (a parse spec, or
    the names of the features it needs), each FixedLenFeature without a default with its number and kind of
    values: a file of something else (another format, converter or sequence length) is one line naming it
    here, where the pipeline's in-graph parse would say "Could not parse example input" or "Can't parse
    serialized Example" about some record of some file."""
    from google.protobuf.message import DecodeError

    kinds = {tf.int64: "int64_list", tf.float32: "float_list", tf.string: "bytes_list"}
    for path in files:
        payload = first_record(path)
        if payload is None:
            continue  # an empty shard: the counts decide whether that is wrong
        try:
            example = tf.train.Example.FromString(payload)
        except DecodeError:
            raise HarnessError(f"{path}: its records are not tf.train.Example protos (record 0 does not parse "
                               f"as one); expected {what}") from None
        have = example.features.feature
        missing = [k for k in spec if k not in have]
        if missing:
            raise HarnessError(f"{path}: its records lack feature(s) {', '.join(missing)} (checked on record 0; "
                               f"expected {what})")
        for key, feature in (spec.items() if isinstance(spec, dict) else ()):
            if not isinstance(feature, tf.io.FixedLenFeature) or feature.default_value is not None:
                continue
            field, kind, want = have[key], kinds[feature.dtype], int(np.prod(feature.shape, dtype=np.int64))
            got = field.WhichOneof("kind")
            n = len(getattr(field, got).value) if got else 0
            if got != kind or n != want:
                raise HarnessError(f"{path}: record 0's {key} holds {n} values of {got or 'no kind'}, the config "
                                   f"parses {want} of {kind} (expected {what})")


def file_error(files: list[str], read: Callable[[str], Any], error: tf.errors.OpError, what: str) -> HarnessError:
    """One line for a read of `files` that failed on some record: the first file `read(file)` fails on, with
    the reason. Files are re-read one by one only after a failure, so a sound read takes them together."""
    for path in files:
        try:
            read(path)
        except tf.errors.OpError as e:
            return HarnessError(f"{path}: {op_error_line(e.message) or type(e).__name__}")
    return HarnessError(f"{what}: {op_error_line(error.message) or type(error).__name__}")


def count_records(files: list[str]) -> int:
    """Records in TFRecord files, from their length headers alone (each payload is skipped, not read)."""
    total = 0
    for path in files:
        size = tf.io.gfile.stat(path).length
        opener = open if "://" not in path else tf.io.gfile.GFile
        with opener(path, "rb") as f:
            pos = 0
            while pos < size:
                header = f.read(_HEADER)
                if len(header) < _HEADER:
                    raise HarnessError(f"{path} is corrupt or truncated: not a TFRecord file (a record header ends "
                                       f"at byte {pos + len(header)} of {size})")
                pos += _HEADER + int.from_bytes(header[:8], "little") + 4
                if pos > size:
                    raise HarnessError(f"{path} is corrupt or truncated: not a TFRecord file (a record runs past "
                                       f"its end)")
                f.seek(pos)
                total += 1
    return total


def file_stamp(path: str) -> dict[str, int]:
    """What a cached count or hash of the file is keyed by. Beside size and mtime, a local file's ctime, inode
    and device: `cp -a` and `rsync -a` keep size and mtime (and copy the cache files with the data), and
    `touch -r` restores an mtime after an edit, but none of them can set a ctime or keep an inode, so a
    copied or edited file is read again rather than vouched for by the cache of the original. (A chmod, a
    rename or a new hard link changes the ctime too: that file is read once more.)"""
    if "://" in path:  # object stores: their stat has a size and an mtime only
        stat = tf.io.gfile.stat(path)
        return {"size": stat.length, "mtime_ns": stat.mtime_nsec}
    stat = os.stat(path)
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns,
            "ino": stat.st_ino, "dev": stat.st_dev}


def _fingerprint(files: list[str], what: str, settings: dict[str, Any]) -> str:
    stats = [(os.path.basename(p), file_stamp(p)) for p in files]
    blob = json.dumps([what, settings, stats], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def cache_paths(files: list[str], name: str = COUNT_CACHE) -> list[str]:
    """Where cache `name` of `files` goes: beside the data first; the user's cache folder when the data folder
    is read-only."""
    home = os.path.join(os.path.expanduser("~"), ".cache", "mlperf-harness", name.lstrip("."))
    return [os.path.join(os.path.dirname(files[0]), name), home]


def read_cache(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def cached_count(files: list[str], what: str, settings: dict[str, Any], count: Callable[[], int]) -> int:
    """`count()` of `files`, computed once and kept in COUNT_CACHE beside them, keyed by the files' names and
    `file_stamp`s, `what` is counted and the `settings` the count depends on (e.g. packing)."""
    key = _fingerprint(files, what, settings)
    paths = cache_paths(files) if "://" not in files[0] else cache_paths(files)[1:]
    for path in paths:
        entry = read_cache(path).get(key)
        if isinstance(entry, dict) and isinstance(entry.get("count"), int):
            return entry["count"]
    n = int(count())
    write_cache_entry(paths, [key] * len(paths), lambda old: {"what": what, "settings": settings,
                                                             "files": len(files), "count": n})
    return n


def write_cache_entry(paths: list[str], names: list[str], entry: Callable[[Any], dict]) -> None:
    """Store `entry(old value)` under names[i] in the first cache file paths[i] that can be written (a
    read-only data folder falls through to the user's cache); each file is replaced whole, so a reader never
    sees half of one."""
    for path, name in zip(paths, names):
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            data = read_cache(path)
            data[name] = entry(data.get(name))
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
            return
        except OSError:
            continue


def counted_records(files: list[str]) -> int:
    """`count_records(files)`, cached beside them."""
    return cached_count(files, "records", {}, lambda: count_records(files))


def check_count(key: str, stated: int, counted: int, what: str, where: str) -> None:
    """One line when a config's sample count is not what the files hold, with the number to set."""
    if stated != counted:
        raise HarnessError(f"data.{key}={stated} but {where} holds {counted} {what}; set data.{key}={counted}")
