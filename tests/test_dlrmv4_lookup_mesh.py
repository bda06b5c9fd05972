"""dlrmv4's table lookup on a 2-device DTensor mesh splitting the table's rows (`tests/helpers/dlrmv4_lookup_mesh.py`,
in a subprocess): the looked-up rows and the table's gradient (duplicate ids summed) equal numpy's, each device
holds half the rows, and no per-device program after DTensor's SPMD expansion holds a tensor of the whole
table's shape (nor of its [rows per device, devices, dim] view). The same holds for `owner_lookup` (the ids'
distinct rows read on their owners, gradients scattered into each owner's rows), whose rows, table gradient and,
after one row-wise Adagrad step from each lookup's gradient, tables and accumulators equal the one-hot lookup's;
compiled by XLA in-process, its rows and gradient equal numpy's. The same process builds the smoke mesh's model
(configs/dlrmv4/smoke-mesh.yaml): every table and accumulator is held in halves, one per device."""
from __future__ import annotations

import numpy as np
import pytest

from tests.spmd_trace import run_spmd_helper


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory):
    """The RESULT of tests/helpers/dlrmv4_lookup_mesh.py: one process for both tests on 2 devices."""
    return run_spmd_helper("tests/helpers/dlrmv4_lookup_mesh.py", str(tmp_path_factory.mktemp("dump")),
                           timeout=900)


def test_row_sharded_lookup_holds_no_whole_table(two_devices):
    result = two_devices
    assert result["forward"] < 1e-6 and result["grad"] < 1e-6, result
    assert result["shards"] == [[48, 8], [48, 8]]
    assert result["dumps"] >= 2 and result["whole"] == [], result
    assert result["owner"] == 0.0 and result["moved"] > 0.01, result  # exact, and the step did move the rows
    assert result["owner_shards"] == [[48, 8], [48, 8]]


def test_no_device_of_the_smoke_mesh_holds_a_whole_table(two_devices):
    """configs/dlrmv4/smoke-mesh.yaml's model as built: each of the 11 tables and of their row-wise Adagrad
    accumulators is held in two halves of its rows, one per device."""
    shapes = two_devices["smoke_tables"]
    assert sum("/tables/" in p and "accumulator" not in p for p in shapes) == 11
    assert sum("accumulator" in p for p in shapes) == 11
    for path, (full, shards) in shapes.items():
        assert len(shards) == 2 and all(s[0] * 2 == full[0] and s[1:] == full[1:] for s in shards), path


class _RowsSplitFour:
    """The part of a runtime owner_lookup reads, for one device standing in for 4 splitting the rows (as the dry
    run's stand-in replica compiles it): layouts are no-ops, the arithmetic is the mesh's."""

    rules = {"batch": "data", "vocab": "model"}

    def shards(self, name: str) -> int:
        return 4

    def read(self, variable):
        return variable.read_value()

    def place(self, t, dims):
        return t


class _RoutedStandIn(_RowsSplitFour):
    """One device compiling one replica's program of a 4-device routed mesh (the dry run's stand-in): its own
    batch share, its all-to-alls relayouts of its own blocks."""

    rules = {"batch": "model", "vocab": "model"}

    def program_batch(self, global_batch: int) -> int:
        return global_batch // 4



@pytest.mark.parametrize("form", ["owner", "routed"])
def test_lookup_under_xla_equals_numpy(form):
    """owner_lookup (rows split four ways, every device the whole batch) and routed_lookup as the dry run
    compiles it (one replica's share standing in for 4 devices, its all-to-alls relayouts of its own blocks),
    compiled by XLA (the dry run's and a GPU mesh's compiler; the mesh tests here run DTensor's CPU ops): rows
    and the table's gradient, repeats summed, equal numpy's, in-process; `routed` selects the routed form for
    batch and vocab on one axis only."""
    import tensorflow as tf

    from benchmarks.dlrmv4.owner_lookup import owner_lookup, routed, routed_lookup

    assert routed(_RoutedStandIn()) and not routed(_RowsSplitFour())
    lookup, runtime = (owner_lookup, _RowsSplitFour()) if form == "owner" else (routed_lookup, _RoutedStandIn())
    rng = np.random.default_rng(1)
    table0 = rng.normal(size=(12, 3)).astype(np.float32)
    ids = np.array([[11, 0, 5, 5, 3], [3, 3, 8, 11, 2]], np.int32)
    dy = rng.normal(size=(2, 5, 3)).astype(np.float32)
    table = tf.Variable(table0)

    @tf.function(jit_compile=True)
    def step(ids, dy):
        with tf.GradientTape() as tape:
            rows = lookup(runtime, table, ids)
            loss = tf.reduce_sum(rows * dy)
        return rows, tf.convert_to_tensor(tape.gradient(loss, table))

    rows, grad = step(tf.constant(ids), tf.constant(dy))
    want = np.zeros_like(table0)
    np.add.at(want, ids.reshape(-1), dy.reshape(-1, 3))
    np.testing.assert_array_equal(rows.numpy(), table0[ids])
    np.testing.assert_allclose(grad.numpy(), want, rtol=0, atol=1e-6)


def test_routed_lookup_on_four_devices_moves_ids_by_all_to_all(tmp_path):
    """`routed_lookup` (batch and rows split over the same 4 devices, tests/helpers/dlrmv4_routed_mesh.py in a
    subprocess): rows and the table's gradient equal one device's (numpy), with ids repeated within and across
    devices, rows of every owner and a device asking one owner for all its ids; the per-device program moves
    ids and rows by three all-to-alls over the split (ids out, rows back, rows' gradients out; a device's
    [1 sender, 4 owners, 12 slots] buffer arriving as [4 senders, 1 owner, 12 slots]) and all-gathers nothing,
    neither the table nor the step's ids; 4 train steps of the smoke model on that mesh have one device's losses
    (dropout off and histories of one length, so each replica's N is the batch's)."""
    result = run_spmd_helper("tests/helpers/dlrmv4_routed_mesh.py", str(tmp_path / "dump"), timeout=900)
    assert result["forward"] == 0.0 and result["grad"] < 1e-6, result
    assert result["shards"] == [[24, 8]] * 4
    assert sorted(result["program"]["all_to_alls"]) == ["1x4x12->4x1x12", "1x4x12x8->4x1x12x8",
                                                        "4x1x12x8->1x4x12x8"], result["program"]
    assert result["program"]["all_gathers"] == [], result["program"]
    mesh, one = result["losses"]["mesh"], result["losses"]["one"]
    assert len(mesh) == 4 and len(set(one)) == 4
    np.testing.assert_allclose(mesh, one, rtol=1e-5)
