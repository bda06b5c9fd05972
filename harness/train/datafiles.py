"""Finding a workload's data files, with the clear errors every file-based source needs."""
from __future__ import annotations

import os

import tensorflow as tf

from harness.errors import HarnessError
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
                    deterministic: bool | None, repeat: bool = True) -> tf.data.Dataset:
    """This host's share of the training files as an endless, shuffled stream of raw records.

    Whole files go to hosts (so no record is read twice), file order is reshuffled every pass, and
    records from `cycle_length` files are interleaved and shuffled again. `repeat=False` gives one pass
    (one tf.data service job), shuffled afresh by each job rather than from the run seed.
    `deterministic=None` leaves the order to the dataset's options.
    """
    if len(files) < ctx.num_hosts:
        raise HarnessError(f"{len(files)} training shards cannot be split over {ctx.num_hosts} hosts")
    ds = tf.data.Dataset.from_tensor_slices(files).shard(ctx.num_hosts, ctx.host_id)
    seed = ctx.seed if repeat else None
    ds = ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    if repeat:
        ds = ds.repeat()
    ds = ds.interleave(tf.data.TFRecordDataset, cycle_length=min(cycle_length, len(files)),
                       num_parallel_calls=tf.data.AUTOTUNE if cycle_length > 1 else None,
                       deterministic=deterministic)
    return ds.shuffle(shuffle_buffer, seed=seed)
