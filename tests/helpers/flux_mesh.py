"""flux1's draws and train steps on a 2x2 mesh of logical CPU devices (configs/flux1/smoke-mesh.yaml) against one
device (smoke.yaml), in one process (tests/test_flux1_runs.py). Prints one RESULT line of JSON:

- `replica_rows_differ`: the noise the first training batch draws on the mesh, the rows each data-parallel replica
  holds (its shard of the batch) against the other's: no row of one equals a row of the other;
- `rerun_equal`: the same draws made again are bit-equal; `mesh_equals_one`: and equal one device's;
- `mesh_losses` / `one_losses`: 3 train steps each from the same initial weights.
"""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.experimental import dtensor  # noqa: E402

from benchmarks.flux1 import flow  # noqa: E402
from harness.train import loop  # noqa: E402
from tests.helpers.step_case import build  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def draws_and_losses(config: str) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], list[float]]:
    """(noise of the first batch, drawn twice; its per-replica shards on a mesh; 3 train-step losses)."""
    cfg, rt, wl = build(os.path.join(REPO, config), [])
    it = iter(loop.train_input(rt, wl, cfg.schedule.global_batch_size, cfg.seed))
    batch = next(it)

    def draw(b):
        seed = loop.training_seed(cfg.seed, tf.constant(0, tf.int64), rt.replica_id(), 0)
        keys = flow.sample_keys(seed, b["slot"], flow.NOISE_STREAM)
        noise = flow.normal(keys, flow.pack(tf.zeros([1] + b["mean"].shape[1:].as_list())).shape[1:].as_list())
        return rt.place(noise, ("batch", None, None))

    fn = rt.function(lambda b: rt.run(draw, (b,)))
    first, again = fn(batch), fn(batch)
    shards = []
    if rt.kind == "mesh":
        shards = [np.asarray(t) for t in dtensor.unpack(first)]
        first, again = dtensor.relayout(first, dtensor.Layout.replicated(rt.mesh, 3)), \
            dtensor.relayout(again, dtensor.Layout.replicated(rt.mesh, 3))
        first, again = np.asarray(dtensor.unpack(first)[0]), np.asarray(dtensor.unpack(again)[0])
    else:
        first, again = np.asarray(first), np.asarray(again)
    steps = loop.CompiledSteps(rt, wl)
    it = iter(loop.train_input(rt, wl, cfg.schedule.global_batch_size, cfg.seed))
    losses = [float(rt.to_host(steps.train_loop(it, tf.constant(1))["loss"])) for _ in range(3)]
    return first, again, shards, losses


def main() -> None:
    mesh, mesh_again, shards, mesh_losses = draws_and_losses("configs/flux1/smoke-mesh.yaml")
    one, _, _, one_losses = draws_and_losses("configs/flux1/smoke.yaml")
    # 4 devices of a data=2 x model=2 mesh: devices 0-1 hold replica 0's rows, 2-3 replica 1's
    r0, r1 = shards[0], shards[2]
    differ = not any(np.array_equal(a, b) for a in r0 for b in r1) and np.array_equal(shards[0], shards[1])
    print("RESULT " + json.dumps({
        "replica_rows": [len(r0), len(r1)], "replica_rows_differ": bool(differ),
        "rerun_equal": bool(np.array_equal(mesh, mesh_again)), "mesh_equals_one": bool(np.array_equal(mesh, one)),
        "mesh_losses": mesh_losses, "one_losses": one_losses}), flush=True)
    os._exit(0)


if __name__ == "__main__":
    main()
