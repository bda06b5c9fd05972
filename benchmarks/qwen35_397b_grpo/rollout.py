"""The synchronous GRPO loop (trajectory age 0, the reference's exact small form): the harness's timed run
(harness/train/loop.py run_timed) with train blocks made of rollout steps (the workload's `train_block`).

Each step: the workload's rollout batch with the current weights (generator -> environment -> advantages),
handed to the harness's compiled train step as that step's one global batch (a fresh input over it: the step's
function takes it with the same signature, so nothing retraces), one optimizer step. The generator reads the
updated variables at its next call: that is the refit. Initialization, evaluation, the MLPerf log's sequence and
the stop at the target are the harness's loop, unchanged.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from harness.mlperf import MLPerfLog
from harness.train.blocks import BlockResult, RunObserver, run_block
from harness.train.loop import CompiledSteps, train_input
from harness.train.workload import EvalPoint


class RolloutBlocks:
    """The GRPO workload's train blocks: every optimizer step trains on rollouts made with the weights it updates."""

    def __init__(self, workload: Any) -> None:
        self.workload = workload

    def warm_up(self, steps: CompiledSteps) -> None:
        """Compiles the generator's prefill and decode in init (the weights are untouched)."""
        self.workload.rollouts(1)

    def __call__(self, steps: CompiledSteps, iterator: Any, log: MLPerfLog, observer: RunObserver,
                 prev: EvalPoint, point: EvalPoint, done: int) -> BlockResult:
        """The loop's block framing (harness.train.blocks.run_block) over rollout steps, each: generate, score,
        one optimizer step. `iterator` is None: each step makes its own input over its rollouts."""
        workload = self.workload
        cfg, runtime = workload.cfg, steps.runtime
        every = cfg.schedule.log_every_steps

        def advance(done: int, until: int) -> tuple[dict[str, Any], int, str]:
            workload.pending, facts = workload.rollouts(done + 1)
            out = steps.train_loop(iter(train_input(runtime, workload, cfg.schedule.global_batch_size, cfg.seed)),
                                   tf.constant(1))
            note = (f"step {done + 1}: mean reward {facts['reward']:.4f}, groups with signal "
                    f"{facts['groups_with_signal']:.2f}") if every and (done + 1) % every == 0 else ""
            return out, 1, note

        return run_block(log, observer, prev, point, done, advance)
