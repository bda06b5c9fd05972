"""dlrmv4's table lookup (benchmarks/dlrmv4/model.py `lookup`) on a DTensor mesh of 2 logical CPU devices whose
layout splits the table's rows (`vocab`) over `model`, run in a subprocess (tests/test_dlrmv4_lookup_mesh.py):
the devices are set before TensorFlow starts, and DTensor dumps each device's program only when asked at start.

argv: dump dir. Prints one RESULT line: {"forward": max |diff| of the looked-up rows against numpy, "grad": max
|diff| of the table's gradient against numpy (np.add.at), "shards": [local table shape per device],
"whole": result shapes of the whole table found in the per-device programs, "dumps": files read}.
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
import tensorflow as tf  # noqa: E402
from tensorflow.experimental import dtensor  # noqa: E402

from harness.config import RuntimeConfig  # noqa: E402
from harness.runtime import make_runtime  # noqa: E402

from benchmarks.dlrmv4.model import lookup  # noqa: E402

ROWS, DIM = 96, 8  # 96 x 8: a shape nothing else in the step has


def main() -> None:
    dump = sys.argv[1]
    rt = make_runtime(RuntimeConfig(kind="mesh", cpu_devices=2, precision="float32", mesh={"data": 1, "model": 2},
                                    layout={"batch": "data", "vocab": "model"}))
    rng = np.random.default_rng(0)
    table0 = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    table = rt.variable("tables/t", (ROWS, DIM), ("vocab", None), lambda s, d: tf.constant(table0))
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
    want_grad = np.zeros_like(table0)
    np.add.at(want_grad, ids0.reshape(-1), dy0.reshape(-1, DIM))
    seen, files = set(), glob.glob(os.path.join(dump, "*.mlir"))
    for path in files:
        with open(path, encoding="utf-8", errors="replace") as f:
            seen |= set(re.findall(rf"tensor<({ROWS}x{DIM})xf32>", f.read()))
    print("RESULT " + json.dumps({
        "forward": float(np.max(np.abs(rt.to_host(rows) - table0[ids0]))),
        "grad": float(np.max(np.abs(np.concatenate([t.numpy() for t in dtensor.unpack(grad)]) - want_grad))),
        "shards": [list(s) for s in rt.local_shapes(table)], "whole": sorted(seen), "dumps": len(files)}))


if __name__ == "__main__":
    main()
