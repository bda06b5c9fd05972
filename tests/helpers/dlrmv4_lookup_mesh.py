"""dlrmv4's table lookups (benchmarks/dlrmv4/model.py `lookup`, benchmarks/dlrmv4/owner_lookup.py `owner_lookup`)
on a DTensor mesh of 2 logical CPU devices whose layout splits the table's rows (`vocab`) over `model`, run in a
subprocess (tests/test_dlrmv4_lookup_mesh.py): the devices are set before TensorFlow starts, and DTensor dumps
each device's program only when asked at start.

argv: dump dir. Prints one RESULT line: {"forward": max |diff| of the looked-up rows against numpy, "grad": max
|diff| of the table's gradient against numpy (np.add.at), "shards": [local table shape per device],
"whole": result shapes of the whole table (or its [rows per device, devices, dim] view) found in the per-device
programs, "dumps": files read, "owner": max |diff| of owner_lookup's rows, table gradient and, after one row-wise
Adagrad step from each lookup's gradient, of the tables and accumulators, against `lookup`'s, "smoke_tables":
{variable path: [global shape, [local shape per device]]} for every table and row-wise Adagrad accumulator of
configs/dlrmv4/smoke-mesh.yaml's model and optimizer as built (the same 2 devices: no process of its own)}.
"""
from __future__ import annotations

import glob
import json
import os
import re
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402
from tensorflow.experimental import dtensor  # noqa: E402

from harness.config import RuntimeConfig  # noqa: E402
from harness.runtime import make_runtime  # noqa: E402

from harness.nn.optim import RowWiseAdagrad  # noqa: E402

from benchmarks.dlrmv4.model import lookup  # noqa: E402
from benchmarks.dlrmv4.owner_lookup import owner_lookup  # noqa: E402
from tests.helpers.step_case import build  # noqa: E402

ROWS, DIM = 96, 8  # 96 x 8: a shape nothing else in the step has


def whole(x: tf.Tensor) -> np.ndarray:
    """A mesh tensor's global value: its shards concatenated when its first axis is split, else one copy."""
    parts = [t.numpy() for t in dtensor.unpack(x)]
    split = dtensor.fetch_layout(x).sharding_specs[0] != dtensor.UNSHARDED
    return np.concatenate(parts) if split else parts[0]


def main() -> None:
    dump = sys.argv[1]
    rt = make_runtime(RuntimeConfig(kind="mesh", cpu_devices=2, precision="float32", mesh={"data": 1, "model": 2},
                                    layout={"batch": "data", "vocab": "model"}))
    rng = np.random.default_rng(0)
    table0 = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    table = rt.variable("tables/t", (ROWS, DIM), ("vocab", None), lambda s, d: tf.constant(table0))
    table2 = rt.variable("tables/t2", (ROWS, DIM), ("vocab", None), lambda s, d: tf.constant(table0))
    ids0 = np.array([[3, 50, 3, 95], [50, 7, 7, 7]], np.int64)  # duplicates, rows on both devices
    dy0 = rng.normal(size=(2, 4, DIM)).astype(np.float32)
    ids = rt.to_mesh(ids0, dtensor.Layout.replicated(rt.mesh, 2))
    dy = rt.to_mesh(dy0, dtensor.Layout.replicated(rt.mesh, 3))

    def step(ids, dy):
        with tf.GradientTape() as tape:
            rows = lookup(rt, table, ids)
            loss = tf.reduce_sum(rows * dy)
        return rows, tf.convert_to_tensor(tape.gradient(loss, table))

    rows, grad = rt.function(step)(ids, dy)

    # the same step through owner_lookup, then one row-wise Adagrad update of each table from its own lookup's
    # gradient (lr 0.1): updated tables and accumulators must agree
    adagrad = RowWiseAdagrad(rt, rt.variables(trainable=True), lambda s: tf.constant(0.1), name="adagrad")
    adagrad.build()

    def both(ids, dy):
        with tf.GradientTape(persistent=True) as tape:
            a = lookup(rt, table, ids)
            b = owner_lookup(rt, table2, ids)
            la, lb = tf.reduce_sum(a * dy), tf.reduce_sum(b * dy)
        ga = tf.convert_to_tensor(tape.gradient(la, table))
        gb = tf.convert_to_tensor(tape.gradient(lb, table2))
        adagrad.apply([ga, gb])
        return a, b, ga, gb

    a, b, ga, gb = rt.function(both)(ids, dy)
    acc = adagrad.slots["accumulator"]
    owner = max(float(np.max(np.abs(whole(x) - whole(y))))
                for x, y in ((a, b), (ga, gb), (table.read_value(), table2.read_value()),
                             (acc[0].read_value(), acc[1].read_value())))
    moved = float(np.max(np.abs(whole(table2.read_value()) - table0)))
    want_grad = np.zeros_like(table0)
    np.add.at(want_grad, ids0.reshape(-1), dy0.reshape(-1, DIM))
    seen, files = set(), glob.glob(os.path.join(dump, "*.mlir"))
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            seen |= set(re.findall(rf"tensor<({ROWS}x{DIM}|{ROWS // 2}x2x{DIM})xf32>", f.read()))
    print("RESULT " + json.dumps({
        "forward": float(np.max(np.abs(rt.to_host(rows) - table0[ids0]))),
        "grad": float(np.max(np.abs(np.concatenate([t.numpy() for t in dtensor.unpack(grad)]) - want_grad))),
        "shards": [list(s) for s in rt.local_shapes(table)], "whole": sorted(seen), "dumps": len(files),
        "owner": owner, "moved": moved, "owner_shards": [list(s) for s in rt.local_shapes(table2)],
        "smoke_tables": smoke_tables()}), flush=True)
    os._exit(0)  # two meshes in one process: TensorFlow's teardown can abort after the result is out


def smoke_tables() -> dict:
    """configs/dlrmv4/smoke-mesh.yaml's tables and accumulators as built: global and per-device shapes."""
    _, rt, _ = build("configs/dlrmv4/smoke-mesh.yaml", [])
    return {v.path: [list(v.shape), [list(s) for s in rt.local_shapes(v.variable)]]
            for v in rt.variables() if "/tables/" in v.path}


if __name__ == "__main__":
    main()
