"""A mesh over several hosts gets per-replica batches of the shape DTensorDataset expects (a `rebatch`
would be right on one host only). DTensor multi-client needs GPUs or TPUs, so the hosts are emulated the way
DTensorDataset treats each one: the harness's own training stream of host h (MeshRuntime.distribute_dataset
with the host count and id of a 4-host mesh, 2 local replicas each, 8 in all) is auto-sharded with
`_AutoShardDataset(num_workers=2, index=i, num_replicas=8)` for each local replica i. In-process, one CPU."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.experimental import dtensor
from tensorflow.python.data.experimental.ops import distribute

from conftest import REPO
from harness.config import RuntimeConfig
from harness.runtime import make_runtime
from harness.runtime import mesh as mesh_lib
from harness.train import loop
from harness.train.input_pipeline import InputWait

sys.path.insert(0, os.path.join(REPO, "tests", "helpers"))
import toy  # noqa: E402

pytestmark = pytest.mark.quick

class Numbered(toy.ToyWorkload):
    """The toy whose training example i is x = i, so every row says where it came from."""

    def train_dataset(self, ctx):
        return tf.data.Dataset.range(1_000_000).map(lambda i: {"x": tf.cast(i, tf.float32)})


HOSTS, LOCAL, GLOBAL_BATCH = 4, 2, 64
REPLICAS = HOSTS * LOCAL
PER_REPLICA, PER_HOST = GLOBAL_BATCH // REPLICAS, GLOBAL_BATCH // HOSTS


class Host(mesh_lib.MeshRuntime):
    """A one-device mesh that answers as host `host` of HOSTS, with REPLICAS data-parallel replicas."""

    def __init__(self, host: int) -> None:
        mesh = dtensor.create_mesh([("data", 1)], device_type="CPU")
        super().__init__(mesh, {"data": 1}, {"batch": "data"}, "CPU", "float32", False)
        self.sizes = {"data": REPLICAS}
        self.host = host

    @property
    def num_hosts(self) -> int:
        return HOSTS

    @property
    def host_id(self) -> int:
        return self.host


def host_stream(monkeypatch, host: int) -> tf.data.Dataset:
    """What host `host` hands DTensorDataset: the toy's training stream through train_input."""
    handed = {}

    def capture(ds, **kwargs):
        handed.update(kwargs, dataset=ds)
        return ds

    monkeypatch.setattr(mesh_lib.dtensor, "DTensorDataset", capture)
    runtime = Host(host)
    cfg = toy.make("/tmp", make_runtime(RuntimeConfig()), global_batch_size=GLOBAL_BATCH).cfg
    wl = Numbered(cfg, runtime)
    loop.train_input(runtime, wl, GLOBAL_BATCH, 0, wait=InputWait())
    assert handed["global_batch_size"] == GLOBAL_BATCH and handed["dataset_already_batched"]
    return handed["dataset"]


def test_four_hosts_of_two_local_replicas_get_per_replica_batches(monkeypatch):
    steps = 3
    for host in range(HOSTS):
        ds = host_stream(monkeypatch, host)
        # Every host reads the whole stream here (the toy ignores the host id): batch s is rows s*PER_HOST...
        host_batches = np.arange(steps * PER_HOST).reshape(steps, PER_HOST)
        for local in range(LOCAL):
            shard = distribute._AutoShardDataset(ds, num_workers=LOCAL, index=local, num_replicas=REPLICAS)
            got = [b["x"] for b in shard.take(steps).as_numpy_iterator()]
            assert [b.shape for b in got] == [(PER_REPLICA,)] * steps, (host, local, [b.shape for b in got])
            want = host_batches[:, local * PER_REPLICA:(local + 1) * PER_REPLICA]
            np.testing.assert_array_equal(np.stack(got), want, err_msg=f"host {host} replica {local}")
