"""The warm-up's copy of every variable in host memory (harness/train/loop.py `warm_up_and_restore`): the timed
run starts from the initial model, and a device copy of every weight and optimizer slot could exhaust the
device."""
from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from harness.runtime.base import Runtime

HostValue = Any  # np.ndarray, or for a DTensor (layout, {shard coordinates: np.ndarray}, [key per device])


def host_snapshot(runtime: Runtime) -> list[HostValue]:
    """Every variable's value (weights, optimizer slots, statistics) copied to host memory.

    A mirrored or TPU variable read across replicas gives its primary copy; a DTensor variable gives
    this host's shards, one numpy array per distinct shard (replicated copies are stored once)."""
    from tensorflow.experimental import dtensor

    saved: list[HostValue] = []
    for info in runtime.variables():
        value = info.variable.read_value()
        if not dtensor.is_dtensor(value):
            saved.append(np.asarray(value.numpy()))
            continue
        layout = dtensor.fetch_layout(value)
        locations = layout.mesh.local_device_locations()
        keys = [tuple(loc[d] for d in layout.sharding_specs if d != dtensor.UNSHARDED) for loc in locations]
        shards: dict[tuple, np.ndarray] = {}
        for key, part in zip(keys, dtensor.unpack(value)):
            if key not in shards:
                shards[key] = np.asarray(part.numpy())
        saved.append((layout, shards, keys))
    return saved


def restore_snapshot(runtime: Runtime, saved: list[HostValue]) -> None:
    """Assigns `host_snapshot`'s values back to the variables they came from."""
    from tensorflow.experimental import dtensor

    for info, value in zip(runtime.variables(), saved):
        if isinstance(value, tuple):
            layout, shards, keys = value
            with tf.device(dtensor.device_name()):
                value = dtensor.pack([tf.constant(shards[k]) for k in keys], layout)
        info.variable.assign(value)
