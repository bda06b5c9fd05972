"""A one-variable workload that drives the real loop in-process in seconds.

Example x (0..4, cycling) asks the model w to predict GOAL + x - 2; the loss is the squared error summed
over examples, SGD without momentum, so w settles at GOAL and every example's gradient differs (a
micro-batch or replica that is dropped or counted twice changes the update). Its eval returns per-example
predictions (gathered to the chief, in eval-set order) and its metric is 1 - |mean prediction - GOAL| /
GOAL: a run reaches a target near 1 in a few steps, a huge learning rate makes the loss non-finite, and a
target above 1 spends the budget.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf

from harness import config as config_lib
from harness.config import field
from harness.train.loop import INDEX, by_index
from harness.nn.optim import SGDMomentum, poly_warmup_schedule
from harness.runtime.base import InputContext, Runtime
from harness.train.workload import LossTerm, Workload

GOAL = 3.0


@dataclasses.dataclass
class ToyData:
    source: str = field("synthetic")
    train_samples: int = field(60)
    eval_samples: int = field(37)
    ragged_train: bool = field(False, doc="unknown feature length: forces a retrace after warm-up")


@dataclasses.dataclass
class ToyModel:
    init: float = field(0.0)


@dataclasses.dataclass
class ToyOptimizer:
    learning_rate: float = field(0.3)


class ToyWorkload(Workload):
    NAME = "toy"
    MLPERF_KEY = "resnet"
    RULESETS = ("4.0.0",)
    SECTIONS = {"data": ToyData, "model": ToyModel, "optimizer": ToyOptimizer}
    METRIC = "closeness"
    # Test hook: hosts other than the chief would never judge the target reached on their own.
    chief_only_metric = False

    def closed_target(self, ruleset: str) -> float:
        return 0.99

    def build(self) -> None:
        init = self.cfg.model.init
        self.w = self.runtime.variable("toy/w", (), (), lambda shape, dtype: tf.constant(init, dtype))
        lr = self.cfg.optimizer.learning_rate
        self.optimizer = SGDMomentum(self.runtime, self.runtime.variables(trainable=True),
                                     poly_warmup_schedule(lr, 0, 1, lr, 1.0), momentum=0.0)
        self.optimizer.build()

    def train_dataset(self, ctx: InputContext) -> tf.data.Dataset:
        x = tf.data.Dataset.range(1_000_000).map(lambda i: {"x": tf.cast(i % 5, tf.float32)})
        if self.cfg.data.ragged_train:
            # Two values per example, but a length unknown to the graph: warm-up traces length 1.
            return x.map(lambda e: {"x": tf.fill([tf.cast(e["x"] * 0, tf.int32) + 2], e["x"])})
        return x

    def eval_records(self, ctx: InputContext) -> tf.data.Dataset:
        return tf.data.Dataset.range(self.eval_samples)

    def eval_parse(self, record: Any) -> dict[str, tf.Tensor]:
        return {"id": record}

    def loss(self, batch: dict[str, tf.Tensor], seed: tf.Tensor) -> dict[str, LossTerm]:
        x = tf.reshape(batch["x"], [tf.shape(batch["x"])[0], -1])[:, 0]
        per_example = tf.square(self.w - (GOAL + x - 2.0))
        return {"squared_error": LossTerm(tf.reduce_sum(per_example), tf.shape(x)[0])}

    def eval_step(self, batch: dict[str, tf.Tensor], mask: tf.Tensor) -> dict[str, tf.Tensor]:
        ids = batch["id"]
        return {"prediction": self.w * tf.ones_like(tf.cast(ids, tf.float32)), "id": ids,
                "masked_examples": tf.reduce_sum(mask)}

    def eval_finalize(self, state: dict[str, Any]) -> dict[str, float]:
        rows = by_index(state)
        # Per-example outputs arrive in eval-set order, each example once.
        assert np.array_equal(rows["id"], np.arange(self.eval_samples)), rows["id"]
        assert np.array_equal(rows[INDEX], np.arange(self.eval_samples))
        assert state["masked_examples"] == self.eval_samples
        score = 1.0 - abs(float(rows["prediction"].mean()) - GOAL) / GOAL
        return {self.METRIC: score, "mean_prediction": float(rows["prediction"].mean())}

    def reached_target(self, metrics: dict[str, float]) -> bool:
        if self.chief_only_metric and not self.runtime.is_chief:
            return False  # a host that judged alone would never stop: the loop must adopt the chief's verdict
        return super().reached_target(metrics)

    def mllog_hparams(self) -> dict[str, Any]:
        return {"opt_base_learning_rate": self.cfg.optimizer.learning_rate}


def make(out_dir: str, runtime: Runtime, data: dict | None = None, model: dict | None = None,
         optimizer: dict | None = None, **schedule: Any) -> ToyWorkload:
    """A toy workload over `runtime`; `schedule` overrides ScheduleConfig fields."""
    sched = dict(global_batch_size=10, max_epochs=2.0, eval_every_epochs=0.5, steps_per_loop=4)
    sched.update(schedule)
    cfg = config_lib.Config(workload="toy", output_dir=out_dir, schedule=config_lib.ScheduleConfig(**sched),
                            submission=config_lib.SubmissionConfig(division="open"))
    cfg.sections = {"data": ToyData(**(data or {})), "model": ToyModel(**(model or {})),
                    "optimizer": ToyOptimizer(**(optimizer or {}))}
    return ToyWorkload(cfg, runtime)
