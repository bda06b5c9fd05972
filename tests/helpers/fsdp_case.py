"""Train steps of named configs in one process with 4 logical CPU devices, as JSON (tests/test_fsdp.py).

argv: JSON {name: [config, [overrides], calls]}: `calls` calls of the compiled train loop, each of 2 steps
(a step reads weights the step before it assigned in the same function). Runs each case in order (mesh cases
first: the logical devices are configured by the first mesh runtime) and prints one RESULT line:
{name: {"losses": [...], "layouts": {path: [sharding spec per axis]}, "shapes": {path: shape},
"itemsize": {path: bytes}, "by_layout": [paths the workload's layout already splits over data],
"replicated_bytes": n}} (layouts and bytes only on a mesh).
"""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402
from tensorflow.experimental import dtensor  # noqa: E402

from harness.train import loop  # noqa: E402
from tests.helpers.step_case import build  # noqa: E402

STEPS_PER_CALL = 2


def run(config: str, overrides: list[str], calls: int) -> dict:
    cfg, rt, wl = build(config, overrides)
    steps = loop.CompiledSteps(rt, wl)
    it = iter(loop.train_input(rt, wl, cfg.schedule.global_batch_size, cfg.seed))
    out: dict = {"losses": [float(rt.to_host(steps.train_loop(it, tf.constant(STEPS_PER_CALL))["loss"]))
                            for _ in range(calls)]}
    if rt.kind == "mesh":
        out["layouts"] = {v.path: list(dtensor.fetch_layout(v.variable.read_value()).sharding_specs)
                          for v in rt.variables()}
        out["shapes"] = {v.path: v.variable.shape.as_list() for v in rt.variables()}
        out["by_layout"] = [v.path for v in rt.variables() if rt.batch_dim in rt.layout_for(v.dims).sharding_specs]
        out["itemsize"] = {v.path: v.variable.dtype.size for v in rt.variables()}
        out["replicated_bytes"] = rt.fsdp_replicated_bytes()
        out["data"] = rt.sizes[rt.batch_dim]
    return out


def main(cases: dict[str, list]) -> None:
    out = {name: run(config, overrides, steps) for name, (config, overrides, steps) in cases.items()}
    print("RESULT " + json.dumps(out), flush=True)
    os._exit(0)  # several meshes in one process: TensorFlow's teardown can abort after the result is out


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
