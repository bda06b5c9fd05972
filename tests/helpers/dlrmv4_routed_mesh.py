"""dlrmv4's routed lookup (benchmarks/dlrmv4/owner_lookup.py `routed_lookup`: the batch and the tables' rows split
over the same 4 devices, ids sent to their owners by all-to-all) on 4 logical CPU devices, for
tests/test_dlrmv4_lookup_mesh.py. Run in a subprocess with DTensor's SPMD dump in its environment
(tests/spmd_trace.py).

argv: dump dir. Prints one RESULT line: {"forward", "grad": max |diff| of the looked-up rows and of the table's
gradient (np.add.at) against numpy's one-device lookup; "program": the lookup step's per-device program as
{"all_to_alls", "all_gathers": ["in->out" local shapes]}; "shards": local table shape per device; "losses":
{"mesh", "one"}: 4 train steps of configs/dlrmv4/smoke.yaml on the routed 4-device mesh and on one device}.
"""
from __future__ import annotations

import glob
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402
from tensorflow.experimental import dtensor  # noqa: E402

from harness.config import RuntimeConfig  # noqa: E402
from harness.runtime import make_runtime  # noqa: E402
from harness.train import loop  # noqa: E402
from tests.helpers.moe_alltoall import dumped, program  # noqa: E402
from tests.helpers.step_case import build, train  # noqa: E402

from benchmarks.dlrmv4.owner_lookup import routed_lookup  # noqa: E402

ROWS, DIM = 96, 8      # 24 rows per device
ROUTED = ["runtime.kind=mesh", "runtime.cpu_devices=4", "runtime.mesh={data: 1, model: 4}",
          "runtime.layout={batch: model, vocab: model}"]
# Dropout off (a mesh draws a batch-split tensor's mask per shard) and every history as long, so that each
# replica's longest sequence N is the whole batch's: the mesh then computes what one device does. One STU
# layer: a smaller program to expand and compile.
SAME = ["model.input_dropout=0", "model.linear_dropout=0", "data.synthetic_min_history=8", "model.num_layers=1"]


def whole(x: tf.Tensor) -> np.ndarray:
    """A mesh tensor split on its first axis (or replicated): its global value."""
    parts = [t.numpy() for t in dtensor.unpack(x)]
    split = dtensor.fetch_layout(x).sharding_specs[0] != dtensor.UNSHARDED
    return np.concatenate(parts) if split else parts[0]


def lookup_case(dump: str) -> dict:
    rt = make_runtime(RuntimeConfig(kind="mesh", cpu_devices=4, precision="float32", mesh={"data": 1, "model": 4},
                                    layout={"batch": "model", "vocab": "model"}))
    rng = np.random.default_rng(0)
    table0 = rng.normal(size=(ROWS, DIM)).astype(np.float32)
    table = rt.variable("tables/t", (ROWS, DIM), ("vocab", None), lambda s, d: tf.constant(table0))
    # 2 samples of 6 ids per device: repeats within a device and across devices, rows of every owner, one
    # device asking one owner only (its capacity full: 12 ids, 12 distinct)
    ids0 = np.array([[3, 3, 3, 30, 50, 95], [3, 95, 95, 30, 24, 0],
                     [1, 2, 4, 5, 6, 7], [8, 9, 10, 11, 12, 13],
                     [47, 47, 47, 47, 47, 47], [47, 48, 71, 72, 23, 3],
                     [90, 91, 92, 93, 94, 95], [30, 31, 32, 33, 34, 35]], np.int64)
    dy0 = rng.normal(size=ids0.shape + (DIM,)).astype(np.float32)
    ids = rt.to_mesh(ids0, rt.layout_for(("batch", None)))
    dy = rt.to_mesh(dy0, rt.layout_for(("batch", None, None)))

    def routed_step(ids, dy):
        with tf.GradientTape() as tape:
            rows = routed_lookup(rt, table, ids)
            loss = tf.reduce_sum(rows * dy)
        return rows, tf.convert_to_tensor(tape.gradient(loss, table))

    before = set(glob.glob(os.path.join(dump, "*")))
    rows, grad = rt.function(routed_step)(ids, dy)
    want = np.zeros_like(table0)
    np.add.at(want, ids0.reshape(-1), dy0.reshape(-1, DIM))
    return {"forward": float(np.max(np.abs(whole(rows) - table0[ids0]))),
            "grad": float(np.max(np.abs(whole(grad) - want))),
            "program": program(dumped(dump, before, "routed_step")),
            "shards": [list(s) for s in rt.local_shapes(table)]}


def train_case() -> dict:
    smoke = "configs/dlrmv4/smoke.yaml"
    out = {}
    for name, sets in (("mesh", ROUTED), ("one", ["runtime.kind=default", "runtime.cpu_devices=0"])):
        cfg, rt, wl = build(smoke, sets + SAME)
        out[name] = train(loop.CompiledSteps(rt, wl), cfg, 4)
    return {"losses": out}


def main(dump: str) -> None:
    out = lookup_case(dump)
    out.update(train_case())
    print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)  # several meshes in one process: TensorFlow's teardown can abort after the result is out


if __name__ == "__main__":
    main(sys.argv[1])
