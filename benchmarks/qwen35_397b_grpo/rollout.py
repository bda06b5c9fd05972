"""The synchronous GRPO loop (trajectory age 0, the reference's exact small form): the harness's timed run with
its train blocks made of rollout steps.

Each step: the workload's rollout batch with the current weights (generator -> environment -> advantages),
handed to the harness's compiled train step as that step's one global batch (a fresh input over it: the step's
function takes it with the same signature, so nothing retraces), one optimizer step. The generator reads the
updated variables at its next call: that is the refit. Evaluation, the MLPerf log's sequence and the stop at the
target are harness/train/loop.py's, unchanged.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import tensorflow as tf
from absl import logging

from harness.mlperf import KEYS as K
from harness.mlperf import MLPerfLog
from harness.runtime.base import Runtime
from harness.train.input_pipeline import InputWait, pipeline_config
from harness.train.loop import (BlockResult, CompiledSteps, EvalPoint, RunObserver, RunResult, eval_input,
                                evaluate_and_judge, stop_reason, train_input, warm_up_and_restore)
from harness.train.progress import Progress
from harness.train.workload import tidy


def run_grpo(runtime: Runtime, workload: Any, log: MLPerfLog, hparams_fn: Callable[[], None],
             progress: Progress | None = None, wait: InputWait | None = None) -> RunResult:
    """`harness.train.loop.run_timed` for GRPO: init (model, optimizer, generator and train/eval compiles), then
    rollout steps in blocks up to each eval of the schedule, until pass@k reaches the target or the step
    budget is spent."""
    cfg, schedule, wait = workload.cfg, workload.eval_schedule(), wait or InputWait()
    gbs = cfg.schedule.global_batch_size

    log.event(K.CACHE_CLEAR, True)
    log.start(K.INIT_START)
    t_init = time.time()
    hparams_fn()
    with runtime.scope():
        workload.build()
    steps = CompiledSteps(runtime, workload)
    workload.rollouts(1)  # compiles the generator's prefill and decode (weights untouched)
    dist_eval = eval_input(runtime, workload, cfg.schedule.eval_batch_size or gbs, cfg.seed)
    warm_up_and_restore(steps)
    traces_at_start = dict(steps.traces)
    observer = RunObserver(steps, progress or Progress(enabled=False), wait, schedule)
    log.end(K.INIT_STOP)
    init_time = time.time() - t_init

    log.start(K.RUN_START)
    t_run = time.time()
    # A cached eval set repeats: one iterator across evals (the first eval fills the cache).
    eval_data = iter(dist_eval) if pipeline_config(cfg.data).cache_eval else dist_eval
    observer.run_started()
    evals: list[dict[str, Any]] = []
    train_time = eval_time = 0.0
    prev, done, stop = EvalPoint(0, 0, 0), 0, None
    totals = dict.fromkeys(workload.STEP_TOTALS, 0.0)
    for point in schedule.points:
        block = rollout_block(steps, workload, log, observer, prev, point, done)
        here, done, train_time = block.end, block.end.step, train_time + block.seconds
        totals = {name: totals[name] + block.totals.get(name, 0.0) for name in totals}
        t1 = time.time()
        score, reached, metrics, counted = evaluate_and_judge(steps, eval_data, log, schedule, here)
        eval_time += time.time() - t1
        elapsed = time.time() - t_run
        rate = (here.step - prev.step) * gbs / block.seconds if block.seconds > 0 else 0.0
        metrics = metrics or {workload.METRIC: score}
        evals.append({"epoch_num": here.epoch_num, "score": score, "metrics": metrics,
                      "elapsed_s": round(elapsed, 3), "counted": counted, "loss": block.loss,
                      "samples_per_s": round(rate, 1), "step": here.step})
        observer.evaluated(here, block.loss, rate, metrics, elapsed, train_time)
        stop = stop_reason(workload, block, reached, score)
        if stop:
            break
        prev = here
    status, reason = stop or ("aborted", f"budget of {workload.gcfg.max_steps} steps spent; best {workload.METRIC} "
                              f"{workload.best_score(e['score'] for e in evals):.4f}, target "
                              f"{workload.target_relation} {workload.target}")
    log.end(K.RUN_STOP, metadata={"status": status})
    run_time = time.time() - t_run
    observer.close(train_time, f"data.source={cfg.data.source}: rollouts generated in the loop")
    if steps.traces != traces_at_start:
        logging.warning("functions were retraced inside the timed run: %s -> %s", traces_at_start, steps.traces)
    samples = done * gbs
    return RunResult(status=status, reason=reason, target=workload.target, evals=evals, init_time_s=init_time,
                     run_time_s=run_time, train_time_s=train_time, eval_time_s=eval_time, steps=done,
                     samples=samples, epochs_done=samples / workload.train_samples,
                     samples_per_s=samples / train_time if train_time > 0 else 0.0,
                     traces=dict(steps.traces), converged_key=schedule.converged_key,
                     loss_scale=steps.loss_scale_state(), input_wait_s=observer.input_wait, train_totals=totals)


def rollout_block(steps: CompiledSteps, workload: Any, log: MLPerfLog, observer: RunObserver, prev: EvalPoint,
                  point: EvalPoint, done: int) -> BlockResult:
    """block_start, rollout steps from `done` to `point` (each: generate, score, one optimizer step), block_stop."""
    cfg, runtime, schedule = workload.cfg, steps.runtime, observer.schedule
    gbs = cfg.schedule.global_batch_size
    first = schedule.first_epoch_num(prev)
    log.start(K.BLOCK_START, metadata={"first_epoch_num": first, "epoch_count": tidy(point.epoch_num - prev.epoch_num),
                                       "samples_count": prev.samples})
    t0 = time.time()
    finite, loss, totals = True, float("nan"), {}
    while done < point.step:
        t_step = time.time()
        workload.pending, facts = workload.rollouts(done + 1)
        out = steps.train_loop(iter(train_input(runtime, workload, gbs, cfg.seed)), tf.constant(1))
        loss, lr, finite = float(out["loss"]), float(out["lr"]), bool(out["finite"])
        for name, value in out["totals"].items():
            totals[name] = totals.get(name, 0.0) + float(value)
        done += 1
        observer.train_chunk(done, 1, max(time.time() - t_step, 1e-9), loss, lr, point.step)
        if cfg.schedule.log_every_steps and done % cfg.schedule.log_every_steps == 0:
            print(f"step {done}: mean reward {facts['reward']:.4f}, groups with signal "
                  f"{facts['groups_with_signal']:.2f}", flush=True)
        if not finite:
            break
    seconds = time.time() - t0
    end = point if finite else EvalPoint(done, schedule.position(done * gbs), done * gbs)
    log.end(K.BLOCK_STOP, metadata={"first_epoch_num": first, "samples_count": end.samples})
    return BlockResult(end, loss, finite, seconds, totals)
