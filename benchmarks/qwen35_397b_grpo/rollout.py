"""The synchronous GRPO loop (trajectory age 0, the reference's exact small form): the harness's timed run
(harness/train/loop.py run_timed) with train blocks made of rollout steps (the workload's `train_block`).

Each step: the workload's rollout batch with the current weights (generator -> environment -> advantages),
handed to the harness's compiled train step as that step's one global batch (a fresh input over it: the step's
function takes it with the same signature, so nothing retraces), one optimizer step. The generator reads the
updated variables at its next call: that is the refit. Initialization, evaluation, the MLPerf log's sequence and
the stop at the target are the harness's loop, unchanged.
"""
from __future__ import annotations

import time
from typing import Any

import tensorflow as tf

from harness.mlperf import KEYS as K
from harness.mlperf import MLPerfLog
from harness.train.loop import BlockResult, CompiledSteps, EvalPoint, RunObserver, train_input
from harness.train.workload import tidy


class RolloutBlocks:
    """The GRPO workload's train blocks: every optimizer step trains on rollouts made with the weights it updates."""

    def __init__(self, workload: Any) -> None:
        self.workload = workload

    def warm_up(self, steps: CompiledSteps) -> None:
        """Compiles the generator's prefill and decode in init (the weights are untouched)."""
        self.workload.rollouts(1)

    def __call__(self, steps: CompiledSteps, iterator: Any, log: MLPerfLog, observer: RunObserver,
                 prev: EvalPoint, point: EvalPoint, done: int) -> BlockResult:
        """block_start, rollout steps from `done` to `point` (each: generate, score, one optimizer step),
        block_stop. `iterator` is None: each step makes its own input over its rollouts."""
        workload = self.workload
        cfg, runtime, schedule = workload.cfg, steps.runtime, observer.schedule
        gbs = cfg.schedule.global_batch_size
        first = schedule.first_epoch_num(prev)
        log.start(K.BLOCK_START, metadata={"first_epoch_num": first,
                                           "epoch_count": tidy(point.epoch_num - prev.epoch_num),
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
