"""Prints the first N training losses of a config as JSON (one process per device count)."""
from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402

from benchmarks import registry  # noqa: E402
from harness import config as config_lib  # noqa: E402
from harness.train.loop import CompiledSteps, train_input  # noqa: E402
from harness.runtime import make_runtime  # noqa: E402


def main(config_path: str, steps: int, overrides: list[str]) -> None:
    cfg = config_lib.load_config(config_path, overrides)
    runtime = make_runtime(cfg.runtime)
    workload = registry.get(cfg.workload)(cfg, runtime)
    with runtime.scope():
        workload.build()
    compiled = CompiledSteps(runtime, workload)
    iterator = iter(train_input(runtime, workload, cfg.schedule.global_batch_size, cfg.seed))
    losses = [float(compiled.train_loop(iterator, tf.constant(1))["loss"]) for _ in range(steps)]
    print("LOSSES " + json.dumps({"replicas": runtime.num_replicas, "losses": losses}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
