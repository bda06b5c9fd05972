"""The timed run: compiled train/eval functions (the "what") driven by a controller (the "when").

Event order in the MLPerf log: cache_clear, init_start, submission keys and hyperparameters, init_stop,
run_start, then blocks of (block_start, train, block_stop, eval_start, eval_accuracy, eval_stop), then
run_stop with a status. Compilation and a warm-up step on dummy tensors happen before run_start, and the
variables are restored afterwards, so the timed run starts from the initial model and no training
example is read before run_start.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable

import numpy as np
import tensorflow as tf
from absl import logging

from harness.errors import HarnessError
from harness.mlperf import KEYS as K
from harness.mlperf import MLPerfLog
from harness.runtime.base import InputContext, Runtime
from harness.workload import EvalPoint, Workload

MASK = "eval_mask"


@dataclasses.dataclass
class RunResult:
    status: str                      # "success" or "aborted"
    reason: str
    target: float
    evals: list[dict[str, float]]    # epoch_num, score, elapsed_s, counted
    init_time_s: float
    run_time_s: float                # run_start -> run_stop: the MLPerf time to train
    train_time_s: float
    eval_time_s: float
    steps: int
    samples: int
    epochs_done: float
    samples_per_s: float             # training samples per second of training time
    traces: dict[str, int]

    @property
    def converged_at(self) -> float | None:
        return self.evals[-1]["epoch_num"] if self.status == "success" else None


# ----------------------------------------------------------------------------------------- inputs

def _zeros_like_spec(spec: Any) -> Any:
    return tf.nest.map_structure(lambda s: tf.zeros([d or 1 for d in s.shape], s.dtype), spec)


def train_input(runtime: Runtime, workload: Workload, global_batch: int, seed: int,
                dummy: bool = False) -> Any:
    """Per-replica (or per-host on a mesh) batches of training examples, or zeros of the same shape."""

    def dataset_fn(ctx: InputContext) -> tf.data.Dataset:
        ds = workload.train_dataset(ctx).batch(ctx.batch_size, drop_remainder=True)
        if dummy:
            ds = tf.data.Dataset.from_tensors(_zeros_like_spec(ds.element_spec)).repeat()
        return ds.prefetch(tf.data.AUTOTUNE)

    return runtime.distribute_dataset(dataset_fn, global_batch, seed)


def eval_steps_for(eval_samples: int, global_batch: int) -> int:
    return math.ceil(eval_samples / global_batch)


def eval_input(runtime: Runtime, workload: Workload, global_batch: int, seed: int,
               dummy: bool = False) -> Any:
    """The eval set padded to a whole number of global batches (padding masked out), split over hosts.

    Every host builds the same ordered record stream, pads it, and keeps its contiguous share before
    parsing, so each replica sees the same number of batches and each real example is counted once.
    """
    n = workload.eval_samples
    padded = eval_steps_for(n, global_batch) * global_batch

    def dataset_fn(ctx: InputContext) -> tf.data.Dataset:
        records = workload.eval_records(ctx)
        real = records.take(n).map(lambda r: (r, tf.constant(1.0)))
        pad = records.take(1).repeat().map(lambda r: (r, tf.constant(0.0)))
        ds = real.concatenate(pad).take(padded)
        per_host = padded // ctx.num_hosts
        ds = ds.skip(ctx.host_id * per_host).take(per_host)

        def parse(record: Any, mask: tf.Tensor) -> dict[str, tf.Tensor]:
            features = dict(workload.eval_parse(record))
            features[MASK] = mask
            return features

        ds = ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        ds = ds.batch(ctx.batch_size, drop_remainder=True)
        if dummy:
            ds = tf.data.Dataset.from_tensors(_zeros_like_spec(ds.element_spec)).repeat()
        return ds.prefetch(tf.data.AUTOTUNE)

    return runtime.distribute_dataset(dataset_fn, global_batch, seed)


# ------------------------------------------------------------------------------ compiled functions

class CompiledSteps:
    """Builds the train loop and eval step once; counts traces so a retrace after run_start shows."""

    def __init__(self, runtime: Runtime, workload: Workload) -> None:
        self.runtime = runtime
        self.workload = workload
        self.traces = {"train": 0, "eval": 0}
        self.train_loop = runtime.function(self._train_loop)
        self.eval_step = runtime.function(self._eval_step)

    def _train_loop(self, iterator: Any, steps: tf.Tensor) -> dict[str, tf.Tensor]:
        self.traces["train"] += 1
        loss = tf.constant(0.0)
        finite = tf.constant(True)
        for _ in tf.range(steps):
            out = self.runtime.run(self.workload.train_step, (next(iterator),))
            loss = tf.cast(self.runtime.mean(out["loss"]), tf.float32)
            finite = tf.logical_and(finite, tf.math.is_finite(loss))
        return {"loss": loss, "finite": finite}

    def _eval_step(self, iterator: Any) -> dict[str, tf.Tensor]:
        self.traces["eval"] += 1

        def replica_fn(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            batch = dict(batch)
            mask = batch.pop(MASK)
            return self.workload.eval_step(batch, mask)

        return self.runtime.sum(self.runtime.run(replica_fn, (next(iterator),)))


def evaluate(steps: CompiledSteps, dist_eval: Any, num_steps: int) -> dict[str, float]:
    """Runs the whole eval set; sums the replicas' partial sums in float64 on the host."""
    iterator = iter(dist_eval)
    totals: dict[str, float] = {}
    try:
        for _ in range(num_steps):
            for k, v in steps.eval_step(iterator).items():
                totals[k] = totals.get(k, 0.0) + float(np.asarray(v, dtype=np.float64))
    except (tf.errors.OutOfRangeError, StopIteration):
        raise HarnessError("the eval data ran out before the configured eval_samples were read: "
                           "check data paths and data.eval_samples") from None
    return totals


# ---------------------------------------------------------------------------------- the controller

def run_timed(runtime: Runtime, workload: Workload, log: MLPerfLog, hparams_fn: Callable[[], None],
              progress: Callable[[str], None] = print) -> RunResult:
    """Initializes, warms up, then runs blocks of training and evaluation until target or budget.

    Inputs are validated by the caller (harness.run.execute) before the log file is created.
    """
    cfg = workload.cfg
    gbs = cfg.schedule.global_batch_size
    ebs = cfg.schedule.eval_batch_size or gbs
    target = workload.target

    log.event(K.CACHE_CLEAR, True)
    log.start(K.INIT_START)
    t_init = time.time()
    hparams_fn()

    with runtime.scope():
        workload.build()
    steps = CompiledSteps(runtime, workload)
    dist_train = train_input(runtime, workload, gbs, cfg.seed)
    dist_eval = eval_input(runtime, workload, ebs, cfg.seed)
    num_eval_steps = eval_steps_for(workload.eval_samples, ebs)

    # Compile and warm up on zeros, then put every variable back: the timed run starts from init.
    saved = [v.variable.read_value() for v in runtime.variables()]
    warm = steps.train_loop(iter(train_input(runtime, workload, gbs, cfg.seed, dummy=True)),
                            tf.constant(1))
    float(warm["loss"])
    steps.eval_step(iter(eval_input(runtime, workload, ebs, cfg.seed, dummy=True)))
    for v, value in zip(runtime.variables(), saved):
        v.variable.assign(value)
    del saved
    traces_at_start = dict(steps.traces)

    log.end(K.INIT_STOP)
    init_time = time.time() - t_init
    log.start(K.RUN_START)
    t_run = time.time()
    iterator = iter(dist_train)

    points = workload.eval_points(gbs)
    status, reason = "aborted", ""
    evals: list[dict[str, float]] = []
    train_time = eval_time = 0.0
    prev = EvalPoint(0, 0, 0)
    done_steps = 0
    for point in points:
        block_meta = {"first_epoch_num": prev.epoch_num, "epoch_count": _num(point.epoch_num - prev.epoch_num),
                      "samples_count": prev.samples}
        log.start(K.BLOCK_START, metadata=block_meta)
        t0 = time.time()
        finite, loss = True, float("nan")
        while done_steps < point.step:
            n = min(cfg.schedule.steps_per_loop, point.step - done_steps)
            out = steps.train_loop(iterator, tf.constant(n))
            loss = float(out["loss"])
            finite = bool(out["finite"])
            done_steps += n
            if not finite:
                break
        block_time = time.time() - t0
        train_time += block_time
        here = point if finite else EvalPoint(done_steps, _num(done_steps * gbs / workload.train_samples)
                                               if workload.EVAL_UNIT == "epoch" else done_steps * gbs,
                                               done_steps * gbs)
        log.end(K.BLOCK_STOP, metadata={"first_epoch_num": prev.epoch_num,
                                        "samples_count": here.samples})

        t1 = time.time()
        log.start(K.EVAL_START, metadata={"epoch_num": here.epoch_num})
        totals = evaluate(steps, dist_eval, num_eval_steps)
        counted = int(round(totals.get("count", -1)))
        if counted != workload.eval_samples:
            raise HarnessError(f"eval counted {counted} examples but eval_samples is "
                               f"{workload.eval_samples}: the eval data does not match the config")
        score = float(workload.eval_score(totals))
        log.event(K.EVAL_ACCURACY, score, metadata={"epoch_num": here.epoch_num})
        log.end(K.EVAL_STOP, metadata={"epoch_num": here.epoch_num})
        eval_time += time.time() - t1
        elapsed = time.time() - t_run
        samples_in_block = (here.step - prev.step) * gbs
        rate = samples_in_block / block_time if block_time > 0 else 0.0
        evals.append({"epoch_num": here.epoch_num, "score": score, "elapsed_s": round(elapsed, 3),
                      "counted": counted, "loss": loss, "samples_per_s": round(rate, 1)})
        unit = "epoch" if workload.EVAL_UNIT == "epoch" else "samples"
        progress(f"{unit} {here.epoch_num:>8} | loss {loss:8.4f} | {rate:9.1f} samples/s | "
                 f"eval {workload.METRIC_NAME} {score:.4f} (target {target}) | elapsed {elapsed:7.1f} s")
        if not finite:
            reason = f"non-finite training loss ({loss}) at step {done_steps}"
            break
        if score >= target:
            status, reason = "success", f"reached {workload.METRIC_NAME} {score:.4f} >= {target}"
            break
        prev = here
    else:
        reason = (f"budget of {cfg.schedule.max_epochs:g} epochs spent; best {workload.METRIC_NAME} "
                  f"{max(e['score'] for e in evals):.4f} < target {target}")

    log.end(K.RUN_STOP, metadata={"status": status})
    run_time = time.time() - t_run
    if steps.traces != traces_at_start:
        logging.warning("functions were retraced inside the timed run: %s -> %s", traces_at_start,
                        steps.traces)
    samples = done_steps * gbs
    return RunResult(status=status, reason=reason, target=target, evals=evals, init_time_s=init_time,
                     run_time_s=run_time, train_time_s=train_time, eval_time_s=eval_time, steps=done_steps,
                     samples=samples, epochs_done=samples / workload.train_samples,
                     samples_per_s=samples / train_time if train_time > 0 else 0.0,
                     traces=dict(steps.traces))


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(float(x), 6)
