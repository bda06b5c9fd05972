"""The contract every benchmark implements (AlgoPerf-style): the loop knows nothing else about it."""
from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any, ClassVar

import tensorflow as tf

from harness.config import Config
from harness.runtime.base import InputContext, Runtime


@dataclasses.dataclass
class EvalPoint:
    """One evaluation: after `step` train steps, logged as `epoch_num` (epochs or samples)."""
    step: int
    epoch_num: float
    samples: int


class Workload(abc.ABC):
    """A benchmark: model, optimizer, inputs, loss, metric and MLPerf keys.

    Subclasses declare their config sections as dataclasses, their MLPerf key and rulesets, and fill
    the methods below. `train_step` and `eval_step` run per replica inside the compiled loop.
    """

    NAME: ClassVar[str]
    MLPERF_KEY: ClassVar[str]
    RULESETS: ClassVar[tuple[str, ...]]
    DataConfig: ClassVar[type]
    ModelConfig: ClassVar[type]
    OptimizerConfig: ClassVar[type]
    # 'epoch': eval cadence and epoch_num metadata count epochs; 'samples': they count training samples.
    EVAL_UNIT: ClassVar[str] = "epoch"
    METRIC_NAME: ClassVar[str] = "accuracy"

    def __init__(self, cfg: Config, runtime: Runtime) -> None:
        self.cfg = cfg
        self.runtime = runtime

    # ------------------------------------------------------------------------ facts about the run
    @abc.abstractmethod
    def closed_target(self, ruleset: str) -> float:
        """The closed-division quality target for this ruleset."""

    @property
    def target(self) -> float:
        return self.cfg.schedule.target or self.closed_target(self.cfg.ruleset)

    # Workloads whose `data` section has train_samples / eval_samples / source get these for free.
    @property
    def train_samples(self) -> int:
        """Samples in one epoch of the training set (MLPerf `train_samples`)."""
        return self.cfg.data.train_samples

    @property
    def eval_samples(self) -> int:
        """Samples in the eval set; every eval counts exactly these (MLPerf `eval_samples`)."""
        return self.cfg.data.eval_samples

    @property
    def data_source(self) -> str:
        """'synthetic', 'tfrecord' or 'tfds'."""
        return self.cfg.data.source

    @property
    def is_synthetic(self) -> bool:
        return self.data_source == "synthetic"

    @property
    def eval_cadence(self) -> float | None:
        """The exact spacing of logged eval positions, for the integrity check (None: infer it)."""
        return (self.cfg.schedule.eval_every_epochs or 1.0) if self.EVAL_UNIT == "epoch" else None

    def eval_points(self, global_batch: int) -> list[EvalPoint]:
        """Eval schedule in train steps: offset + k * cadence epochs, up to the epoch budget."""
        s = self.cfg.schedule
        steps_per_epoch = self.train_samples / global_batch
        every = s.eval_every_epochs or 1.0
        total_steps = max(1, math.ceil(s.max_epochs * steps_per_epoch - 1e-9))
        points, k = [], 1
        while True:
            epoch = s.eval_offset_epochs + k * every
            step = min(total_steps, max(1, round(epoch * steps_per_epoch)))
            if not points or step > points[-1].step:
                points.append(EvalPoint(step, _tidy(min(epoch, s.max_epochs)), step * global_batch))
            if step >= total_steps:
                return points
            k += 1

    def validate(self) -> None:
        """Checks inputs (data paths, sizes) before the log is created; raise HarnessError."""

    # --------------------------------------------------------------------------- model and inputs
    @abc.abstractmethod
    def build(self) -> None:
        """Creates the model and optimizer (variables through self.runtime), slots included."""

    @abc.abstractmethod
    def train_dataset(self, ctx: InputContext) -> tf.data.Dataset:
        """This host's training examples, unbatched, shuffled and repeated forever."""

    @abc.abstractmethod
    def eval_records(self, ctx: InputContext) -> tf.data.Dataset:
        """The whole eval set as raw records in a fixed order (cheap: parsing happens after sharding)."""

    @abc.abstractmethod
    def eval_parse(self, record: Any) -> dict[str, tf.Tensor]:
        """Turns one eval record into model features."""

    # ---------------------------------------------------------------------- per-replica computation
    @abc.abstractmethod
    def train_step(self, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """One optimizer step on this replica's batch; returns scalars (at least 'loss')."""

    @abc.abstractmethod
    def eval_step(self, batch: dict[str, tf.Tensor], mask: tf.Tensor) -> dict[str, tf.Tensor]:
        """Partial sums over this replica's batch, masked (mask 0 = padding). Must include 'count'."""

    @abc.abstractmethod
    def eval_score(self, totals: dict[str, float]) -> float:
        """The quality metric from the partial sums reduced over all replicas and batches."""

    # ----------------------------------------------------------------------------------- logging
    @abc.abstractmethod
    def mllog_hparams(self) -> dict[str, Any]:
        """Hyperparameter keys and values this benchmark must log for the configured ruleset."""

    def weights_initialization_map(self) -> dict[str, str]:
        """MLPerf tensor name -> this model's variable path, for rulesets that require one
        `weights_initialization` event per named tensor (empty: the workload names none)."""
        return {}


def _tidy(x: float) -> float | int:
    return int(x) if float(x).is_integer() else round(float(x), 6)
