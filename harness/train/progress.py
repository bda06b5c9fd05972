"""What a person watching a run sees: progress lines on stdout and TensorBoard scalars (chief only).

Both are fed with values the loop has already fetched to the host at the end of a compiled chunk of
steps, so they add no device synchronization to the timed run.
"""
from __future__ import annotations

import os
from typing import Any

# A run whose steps wait this share of their time for input or more is called input-bound.
INPUT_BOUND_SHARE = 0.25


def _wait_column(share: float | None) -> str:
    return f" | input wait {share:4.0%}" if share is not None else ""


class Progress:
    """Prints progress lines and, when `tensorboard_dir` is set, writes scalars there. A non-chief host
    gets `Progress(enabled=False)`, which does nothing."""

    def __init__(self, enabled: bool = True, tensorboard_dir: str | None = None, unit: str = "epoch",
                 metric: str = "accuracy", target: float = 0.0, relation: str = ">=",
                 eval_steps: tuple[int, ...] = (), global_batch: int = 0) -> None:
        self.enabled = enabled
        # The steps the schedule evaluates at; the last one is the run's budget (its max_epochs).
        self.eval_steps = tuple(sorted(eval_steps))
        self.global_batch = global_batch
        self.relation = relation  # '<=' for a lower-is-better metric (a validation loss)
        self.unit = unit
        self.metric = metric
        self.target = target
        self._writer: Any = None
        if enabled and tensorboard_dir:
            import tensorflow as tf

            os.makedirs(tensorboard_dir, exist_ok=True)
            self._writer = tf.summary.create_file_writer(tensorboard_dir)

    def line(self, text: str) -> None:
        if self.enabled:
            print(text, flush=True)

    def train(self, step: int, position: float, loss: float, lr: float, samples_per_s: float,
              to_next_eval_s: float | None, print_line: bool, input_wait: float | None = None) -> None:
        """One chunk of training finished at optimizer step `step` (`position` epochs or samples);
        `input_wait` is the share of the chunk's time its steps spent blocked on input."""
        if not self.enabled:
            return
        if print_line:
            eta = f"{to_next_eval_s:7.1f} s" if to_next_eval_s is not None else "      ?"
            self.line(f"  step {step:>8} | {self.unit} {position:>10}{self._budget(step)} | loss {loss:8.4f} | "
                      f"lr {lr:.4g} | {samples_per_s:9.1f} samples/s | next eval in {eta}"
                      f"{_wait_column(input_wait)}")
        scalars = {"train/loss": loss, "train/learning_rate": lr, "train/samples_per_s": samples_per_s}
        if input_wait is not None:
            scalars["train/input_wait_share"] = input_wait
        self._scalars(step, scalars)

    def eval(self, step: int, position: float, loss: float, samples_per_s: float, metrics: dict[str, float],
             elapsed_s: float, input_wait: float | None = None) -> None:
        if not self.enabled:
            return
        score = metrics[self.metric]
        self.line(f"{self.unit} {position:>8}{self._budget(step)} | loss {loss:8.4f} | "
                  f"{samples_per_s:9.1f} samples/s | "
                  f"eval {self.metric} {score:.4f} (target {self.relation} {self.target}) | elapsed {elapsed_s:7.1f} s"
                  f"{self._next_eval(step, samples_per_s)}{_wait_column(input_wait)}")
        self._scalars(step, {f"eval/{name}": value for name, value in metrics.items()})

    def _budget(self, step: int) -> str:
        """' (12% of budget)': the share of the run's step budget (its last eval point) done."""
        if not self.eval_steps:
            return ""
        return f" ({min(step / self.eval_steps[-1], 1.0):4.0%} of budget)"

    def _next_eval(self, step: int, samples_per_s: float) -> str:
        """' | next eval in ~N s' at the measured training rate; '' after the last eval of the budget."""
        later = [s for s in self.eval_steps if s > step]
        if not later or samples_per_s <= 0 or not self.global_batch:
            return ""
        return f" | next eval in ~{(later[0] - step) * self.global_batch / samples_per_s:.1f} s"

    def input_wait(self, share: float, what: str) -> None:
        """The run's verdict on its input: the share of training time its steps waited for data."""
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        verdict = "input-bound" if share >= INPUT_BOUND_SHARE else "input keeps up"
        self.line(f"{verdict}: {share:.0%} of step time waiting for data ({what}, {cores} cores)")

    def _scalars(self, step: int, values: dict[str, float]) -> None:
        if self._writer is None:
            return
        import tensorflow as tf

        with self._writer.as_default(step=step):
            for name, value in values.items():
                tf.summary.scalar(name.replace(" ", "_"), float(value))

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None
