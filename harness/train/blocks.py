"""One training block of the timed run (the steps between two evals) and what the run reports as it goes.

A block is framed the same way whoever makes its steps: block_start, host calls of a few optimizer steps each
with a progress line after it, stopped early by a non-finite loss, block_stop. The loop's own blocks feed the
steps from the workload's train pipeline (harness/train/loop.py:train_block); a workload that makes each
step's input itself (GRPO's rollouts, benchmarks/qwen35_397b_grpo/rollout.py) passes its own `advance` to the
same `run_block`, so the MLPerf events, the progress and the totals cannot differ between the two.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from absl import logging

from harness.mlperf import KEYS as K
from harness.mlperf import MLPerfLog
from harness.train.input_pipeline import InputWait
from harness.train.progress import Progress
from harness.train.workload import EvalPoint, EvalSchedule, tidy


class RunObserver:
    """What the timed run reports as it goes, from values already on the host: the progress lines and
    TensorBoard scalars, loss-scale changes (float16) and the input-wait meter."""

    def __init__(self, global_batch: int, log_every_steps: int, loss_scale_state: Callable[[], dict | None],
                 progress: Progress, wait: InputWait, schedule: EvalSchedule) -> None:
        self.gbs, self.log_every = global_batch, log_every_steps
        self.loss_scale_state, self.progress, self.wait, self.schedule = loss_scale_state, progress, wait, schedule
        self.scale_state = loss_scale_state()  # read before run_start: no device read inside the run
        self.input_wait = 0.0  # seconds of training time spent waiting for batches
        self.waited = 0.0

    def run_started(self) -> None:
        self.waited = self.wait.total()

    def train_chunk(self, done_steps: int, n: int, seconds: float, loss: float, lr: float, until_step: int) -> None:
        """After a host call of `n` steps that took `seconds`, with `done_steps` done of the block's `until_step`."""
        rate = n * self.gbs / seconds
        # The pipeline's own meter (a host variable, read after the loss, so no extra sync): the
        # loop has no clock of its own, which would tie each batch's fetch to the step before.
        total = self.wait.total()  # read once: a wait landing between two reads would be lost
        measured, self.waited = total - self.waited, total
        chunk_wait = min(measured, seconds)
        self.input_wait += chunk_wait
        if self.scale_state is not None:
            now = self.loss_scale_state()
            if now != self.scale_state:
                logging.info("loss scale %g -> %g by step %d (%d step(s) skipped so far)",
                             self.scale_state["scale"], now["scale"], done_steps, now["skipped_steps"])
            self.scale_state = now
        self.progress.train(done_steps, self.schedule.position(done_steps * self.gbs), loss, lr, rate,
                            (until_step - done_steps) * self.gbs / rate,
                            print_line=bool(self.log_every) and done_steps % self.log_every == 0,
                            input_wait=min(chunk_wait / seconds, 1.0))

    def evaluated(self, here: EvalPoint, loss: float, rate: float, metrics: dict[str, float], elapsed: float,
                  train_time: float) -> None:
        self.progress.eval(here.step, here.epoch_num, loss, rate, metrics, elapsed,
                           input_wait=min(self.input_wait / train_time, 1.0) if train_time > 0 else None)

    def close(self, train_time: float, source: str) -> None:
        self.progress.input_wait(self.input_wait / train_time if train_time > 0 else 0.0, source)
        self.progress.close()


@dataclasses.dataclass
class BlockResult:
    """One training block's outcome."""
    end: EvalPoint   # where it stopped: its eval point, or where a non-finite loss cut it short
    loss: float      # the global loss of its last step
    finite: bool     # every step's loss was finite
    seconds: float
    totals: dict[str, float]  # the workload's STEP_TOTALS summed over the block's steps


# advance(done_steps, until_step) -> (the train loop's output for the steps it ran: loss, lr, finite, totals;
# how many steps it ran; a line to print after that call's progress line, or "")
Advance = Callable[[int, int], tuple[dict[str, Any], int, str]]


def run_block(log: MLPerfLog, observer: RunObserver, prev: EvalPoint, point: EvalPoint, done_steps: int,
              advance: Advance) -> BlockResult:
    """block_start, `advance` called until `point`'s step (stopped by a non-finite loss), block_stop."""
    schedule = observer.schedule
    first = schedule.first_epoch_num(prev)
    log.start(K.BLOCK_START, metadata={"first_epoch_num": first,
                                       "epoch_count": tidy(point.epoch_num - prev.epoch_num),
                                       "samples_count": prev.samples})
    t0 = time.time()
    finite, loss, totals = True, float("nan"), {}
    while done_steps < point.step:
        t_chunk = time.time()
        out, n, note = advance(done_steps, point.step)
        loss, lr, finite = float(out["loss"]), float(out["lr"]), bool(out["finite"])
        for name, value in out["totals"].items():
            totals[name] = totals.get(name, 0.0) + float(value)
        done_steps += n
        observer.train_chunk(done_steps, n, max(time.time() - t_chunk, 1e-9), loss, lr, point.step)
        if note:
            print(note, flush=True)
        if not finite:
            break
    seconds = time.time() - t0
    samples = done_steps * observer.gbs
    end = point if finite else EvalPoint(done_steps, schedule.position(samples), samples)
    log.end(K.BLOCK_STOP, metadata={"first_epoch_num": first, "samples_count": end.samples})
    return BlockResult(end, loss, finite, seconds, totals)
