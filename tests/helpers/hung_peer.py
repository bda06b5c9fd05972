"""One worker of a 2-process MultiWorkerMirroredStrategy cluster built by the harness's runtime.

Both workers run one all-reduce; then worker 1 stays alive (its heartbeats keep going) but never joins
the second all-reduce, as a hung peer would. Worker 0 prints the harness's error line for what its
collective raised: the collective timeout (the runtime's watchdog), not a heartbeat, has to end its wait.
"""
from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402

from harness.runtime import distribute  # noqa: E402


def main(index: int, timeout_s: float) -> None:
    runtime = distribute.make_multi_worker("float32", None, timeout_s, cpu_devices=1)  # CPU: opted in

    # runtime.function: the loop's own wrapper, whose watchdog enforces the collective timeout.
    all_sum = runtime.function(lambda x: runtime.run(lambda v: tf.distribute.get_replica_context().all_reduce(
        tf.distribute.ReduceOp.SUM, v * tf.ones([4])), (x,)))

    print(f"first all-reduce: {all_sum(tf.constant(1.0)).numpy()[0]:g}", flush=True)
    if index == 1:
        while True:  # alive and heartbeating, never answering; the test kills it
            time.sleep(1)
    try:
        all_sum(tf.constant(2.0))
        print("second all-reduce finished", flush=True)
    except Exception as e:  # noqa: BLE001 - the point is to see how the harness names it
        lost = distribute.lost_peer_error(e, timeout_s)
        print(f"{type(e).__name__}: error: {lost}" if lost else f"unrecognized {type(e).__name__}: {e}",
              flush=True)
    sys.stdout.flush()
    os._exit(0)  # a dead peer must not hold this process in TensorFlow's shutdown barrier


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]))
