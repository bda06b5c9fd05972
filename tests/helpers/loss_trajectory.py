"""Prints the first N training losses of a config as JSON, on one device and on D replicas, in one process:
D logical CPUs are set up before TensorFlow starts; the one-device run (the default runtime) takes the first.

    python tests/helpers/loss_trajectory.py CONFIG N D [OVERRIDE ...]
"""
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
from harness.runtime.distribute import configure_logical_cpus  # noqa: E402


def losses(config_path: str, steps: int, overrides: list[str]) -> None:
    cfg = config_lib.load_config(config_path, overrides)
    runtime = make_runtime(cfg.runtime)
    workload = registry.get(cfg.workload)(cfg, runtime)
    with runtime.scope():
        workload.build()
    compiled = CompiledSteps(runtime, workload)
    iterator = iter(train_input(runtime, workload, cfg.schedule.global_batch_size, cfg.seed))
    losses = [float(compiled.train_loop(iterator, tf.constant(1))["loss"]) for _ in range(steps)]
    print("LOSSES " + json.dumps({"replicas": runtime.num_replicas, "losses": losses}), flush=True)


def main(config_path: str, steps: int, devices: int, overrides: list[str]) -> None:
    configure_logical_cpus(devices)
    losses(config_path, steps, overrides + ["runtime.kind=default", "runtime.cpu_devices=0"])
    losses(config_path, steps, overrides + ["runtime.kind=mirrored", f"runtime.cpu_devices={devices}"])


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:])
