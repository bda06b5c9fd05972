"""Harness training throughput vs a bare tf.function step of the same model, batch and device.

Both sides run in this one process on the same model variables: the harness side is the real compiled
loop (`steps_per_loop` steps per host round-trip, fed by the workload's input pipeline); the bare side
calls the workload's own train step inside a plain tf.function on one batch already in memory, so the
ratio measures what the harness adds (loop, distribution, input pipeline). Rounds alternate between the
two and the headline is the median of the per-round ratios, so machine speed drift hits both alike.

    python scripts/bench_loop_overhead.py [CONFIG] [--set key=value ...] [--rounds 5] [--steps 40] [--jit]

--jit: both sides XLA-compiled (the harness's per-replica step, the bare step under jit_compile), and the
same measurement without XLA beside it, so XLA's own effect on this machine is printed too.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402

from benchmarks import registry  # noqa: E402
from harness import config as config_lib  # noqa: E402
from harness.train.loop import CompiledSteps, train_input  # noqa: E402
from harness.train.workload import split_loss  # noqa: E402
from harness.runtime import make_runtime  # noqa: E402


def measure(config: str, overrides: list[str], rounds: int, steps: int):
    """(harness samples/s per round, bare samples/s per round, runtime, workload), rounds alternating."""
    cfg = config_lib.load_config(config, overrides + [f"schedule.steps_per_loop={steps}"])
    runtime = make_runtime(cfg.runtime)
    workload = registry.get(cfg.workload)(cfg, runtime)
    with runtime.scope():
        workload.build()
    gbs = cfg.schedule.global_batch_size
    compiled = CompiledSteps(runtime, workload)
    iterator = iter(train_input(runtime, workload, gbs, cfg.seed))

    # The bare baseline: the same per-replica step, one in-memory batch, a Python loop of tf.function calls.
    one_batch = next(iter(workload.train_dataset(
        __import__("harness.runtime.base", fromlist=["InputContext"]).InputContext(1, 0, gbs, cfg.seed)
    ).batch(gbs)))
    params = [p.variable for p in workload.optimizer.params]
    seed = tf.constant([cfg.seed, 0], tf.int64)

    def bare_train_step(batch):
        # The same model, loss, gradient hook and optimizer, with nothing of the harness around them.
        with tf.GradientTape() as tape:
            terms, stats = split_loss(workload.loss(batch, seed))
            loss = tf.add_n([t.total / (tf.cast(t.count, tf.float32) + t.epsilon) for t in terms.values()])
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, params)]
        workload.optimizer.apply(workload.process_gradients(grads, stats))
        return {"loss": loss}

    # Compiled the way the harness compiles its per-replica step: XLA when runtime.jit_compile is on.
    bare_step = (tf.function(bare_train_step, jit_compile=True) if runtime.jit_compile
                 else tf.function(bare_train_step))

    def harness_round() -> float:
        t = time.perf_counter()
        float(compiled.train_loop(iterator, tf.constant(steps))["loss"])
        return steps * gbs / (time.perf_counter() - t)

    def bare_round() -> float:
        t = time.perf_counter()
        out = None
        for _ in range(steps):
            out = bare_step(one_batch)
        float(out["loss"])
        return steps * gbs / (time.perf_counter() - t)

    if runtime.num_replicas != 1:
        raise SystemExit("the bare baseline is single-device: run with runtime.kind=default")
    harness_round(), bare_round()  # compile and warm both
    h, b = [], []
    for _ in range(rounds):
        h.append(harness_round())
        b.append(bare_round())
    return h, b, runtime, workload


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", default="configs/resnet/smoke.yaml")
    p.add_argument("--set", action="append", default=[], dest="overrides")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=40, help="train steps per timed round")
    p.add_argument("--jit", action="store_true", help="both sides under XLA, and XLA vs no XLA")
    a = p.parse_args()
    if not a.jit:
        report(a.config, a.overrides, *measure(a.config, a.overrides, a.rounds, a.steps))
        return
    plain = measure(a.config, a.overrides + ["runtime.jit_compile=false"], a.rounds, a.steps)
    xla = measure(a.config, a.overrides + ["runtime.jit_compile=true"], a.rounds, a.steps)
    report(a.config, a.overrides + ["runtime.jit_compile=false"], *plain)
    report(a.config, a.overrides + ["runtime.jit_compile=true"], *xla)
    print(f"XLA / no XLA on this machine: harness {statistics.median(xla[0]) / statistics.median(plain[0]):.3f}, "
          f"bare {statistics.median(xla[1]) / statistics.median(plain[1]):.3f} (> 1: XLA faster)")


def report(config: str, overrides: list[str], h: list[float], b: list[float], runtime, workload) -> None:
    gbs = workload.cfg.schedule.global_batch_size
    hm, bm = statistics.median(h), statistics.median(b)
    paired = statistics.median(x / y for x, y in zip(h, b))
    data = "SYNTHETIC data" if workload.is_synthetic else f"{workload.data_source} data"
    print(f"config {config} {' '.join(overrides)} | {runtime.description} | batch {gbs} | {data}")
    print(f"harness loop : {hm:9.1f} samples/s  (rounds: {', '.join(f'{x:.0f}' for x in h)})")
    print(f"bare step    : {bm:9.1f} samples/s  (rounds: {', '.join(f'{x:.0f}' for x in b)})")
    print(f"ratio harness/bare = {paired:.3f} (median of per-round paired ratios; ratio of medians "
          f"{hm / bm:.3f}; target >= 0.98)")


if __name__ == "__main__":
    main()
