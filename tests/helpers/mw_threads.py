"""One worker of a 2-process multi_worker cluster: runs compiled chunks of steps (20 all-reduces each, as
per-variable statistics would be) through the harness runtime with its default collective timeout, and
prints the process's thread count after a short and after a longer stretch of steps."""
from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402

from harness.config import RuntimeConfig  # noqa: E402
from harness.runtime import distribute  # noqa: E402


def threads() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("Threads:")).split()[1])


def main() -> None:
    runtime = distribute.make_multi_worker("float32", None, RuntimeConfig().collective_timeout_s,
                                           cpu_devices=1)  # CPU workers: opted in

    def replica_step() -> list[tf.Tensor]:
        ctx = tf.distribute.get_replica_context()
        return [ctx.all_reduce(tf.distribute.ReduceOp.SUM, tf.ones([4]) * i) for i in range(20)]

    def steps(n: tf.Tensor) -> tf.Tensor:
        total = tf.constant(0.0)
        for _ in tf.range(n):
            out = runtime.run(replica_step, ())
            total += tf.reduce_sum(runtime.sum(out[1]))
        return total

    run = runtime.function(steps)
    run(tf.constant(2))
    counts = []
    for n in (5, 40):
        run(tf.constant(n))
        counts.append(threads())
    print(f"THREADS {counts[0]} {counts[1]} watchdog={runtime.watchdog is not None}", flush=True)


if __name__ == "__main__":
    main()
