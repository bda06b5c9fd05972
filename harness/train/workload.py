"""The contract every benchmark implements (AlgoPerf-style): the loop knows nothing else about it.

A workload says *what* to compute; the harness owns *how* it is distributed, so no workload repeats (or
forgets) a gradient all-reduce, and no workload branches on the runtime's kind:

- Training: `loss(batch, seed)` returns named `LossTerm`s, each a per-replica sum and the per-replica
  count it is divided by (examples, tokens, matched boxes), and optionally named step statistics
  (`return terms, stats`: per-replica sums that are no loss, e.g. a mixture of experts' routing counts).
  The loop sums every count over all replicas, differentiates, sums gradients over replicas, accumulates
  `gradient_accumulation_steps` micro-batches, sums the statistics over micro-batches and replicas, calls
  `process_gradients(grads, stats)` (a global-norm clip, an expert-bias update) and then the optimizer; the
  scalar statistics named in `STEP_TOTALS` are also totalled over the run (`RunResult.train_totals`).
- Evaluation, in three steps: `eval_step` on device returns per-replica outputs (a scalar is a partial
  sum, added over replicas; an array with a leading batch axis is per-example output, gathered from
  every replica and host to the chief with padding dropped, in eval-set order); `eval_accumulate` folds
  one batch of them into host state; `eval_finalize` turns the state into named metrics. The chief alone
  finalizes, `reached_target` judges the metrics, and the verdict is broadcast so every host stops at the
  same eval.
"""
from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any, ClassVar, Iterable

import numpy as np
import tensorflow as tf

from harness import benchmark_rules as rules
from harness.config import Config
from harness.errors import HarnessError
from harness.runtime.base import InputContext, Runtime
from harness.train.reference import ReferenceModel, lookup

EPOCH, SAMPLE = "epoch", "sample"

# Keys the loop adds to eval batches (MASK: 1 real, 0 padding; INDEX: position in the eval set, -1 for padding)
# and to the summed outputs (COUNT: real examples); a workload's eval outputs must not use them.
MASK, INDEX, COUNT = "eval_mask", "eval_index", "eval_count"


# ------------------------------------------------------------------------------------ schedules

@dataclasses.dataclass(frozen=True)
class EvalPoint:
    """One evaluation: after `step` optimizer steps (`samples` samples), logged at `epoch_num`."""
    step: int
    epoch_num: float | int
    samples: int


@dataclasses.dataclass(frozen=True)
class EvalSchedule:
    """Where the evals fall and how their positions are logged.

    `unit` EPOCH: positions count completed epochs and blocks number epochs from 1 (training rules: "epochs
    should always be numbered from 1"); SAMPLE: positions count training samples (BERT).
    `cadence` is the spacing of positions the integrity check expects (None: infer it from the log).
    """
    points: tuple[EvalPoint, ...]
    unit: str
    samples_per_epoch: int
    cadence: float | None = None

    def position(self, samples: int) -> float | int:
        """The logged position after `samples` training samples (for a block cut short)."""
        return tidy(samples / self.samples_per_epoch) if self.unit == EPOCH else samples

    def first_epoch_num(self, prev: EvalPoint) -> float | int:
        """`first_epoch_num` of the block that starts after `prev`."""
        if self.unit == EPOCH:
            return int(math.floor(float(prev.epoch_num) + 1e-9)) + 1
        return prev.epoch_num

    @property
    def converged_key(self) -> str:
        return "epochs_to_converge" if self.unit == EPOCH else "samples_to_converge"


def epoch_schedule(epochs: Iterable[float], train_samples: int, global_batch: int,
                   cadence: float | None = None) -> EvalSchedule:
    """Evals at the given epoch positions, each at the first step boundary at or after the end of its
    epoch (training rules: an eval point "may be rounded up to the nearest batch size", never down)."""
    points: list[EvalPoint] = []
    for epoch in sorted(set(float(e) for e in epochs)):
        step = max(1, math.ceil(epoch * train_samples / global_batch - 1e-9))
        if not points or step > points[-1].step:
            points.append(EvalPoint(step, tidy(epoch), step * global_batch))
    if not points:
        raise HarnessError("the eval schedule is empty: check schedule.max_epochs and the eval cadence")
    return EvalSchedule(tuple(points), EPOCH, train_samples, cadence)


def sample_schedule(samples: Iterable[int], train_samples: int, global_batch: int,
                    cadence: float | None = None) -> EvalSchedule:
    """Evals at the first step boundary at or past each sample count, logged as the samples trained."""
    points: list[EvalPoint] = []
    for s in sorted(set(int(x) for x in samples)):
        step = max(1, math.ceil(s / global_batch))
        if not points or step > points[-1].step:
            points.append(EvalPoint(step, step * global_batch, step * global_batch))
    if not points:
        raise HarnessError("the eval schedule is empty: check schedule.max_epochs and the eval cadence")
    return EvalSchedule(tuple(points), SAMPLE, train_samples, cadence)


def cadence_epochs(schedule: Any) -> list[float]:
    """The config's epoch cadence (harness/benchmark_rules.py `epoch_cadence`, which `plan` reads too) up to
    schedule.max_epochs, which is added as a last eval when it is off the cadence (closed workloads refuse such
    a budget in `validate`)."""
    budget = schedule.max_epochs
    return rules.epoch_cadence(schedule).marks(budget) if budget > 0 else []


# ---------------------------------------------------------------------------------------- losses

@dataclasses.dataclass
class LossTerm:
    """One additive part of the training loss: sum(total over all replicas) / (sum(count) + epsilon).

    `total` is this replica's loss summed over its examples; `count` is this replica's share of the
    normalizer. The loop adds `count` over replicas (and accumulated micro-batches), so a loss normalized
    by tokens or matched boxes is exact on any number of devices.
    """
    total: tf.Tensor
    count: tf.Tensor
    epsilon: float = 0.0


def split_loss(out: Any) -> tuple[dict[str, LossTerm], dict[str, tf.Tensor]]:
    """`loss()`'s result as (terms, step statistics): it returns the terms alone or `(terms, stats)`."""
    return out if isinstance(out, tuple) else (out, {})


# ------------------------------------------------------------------------------------- workloads

class Workload(abc.ABC):
    """A benchmark: config sections, model and optimizer, inputs, loss, eval, target and MLPerf keys."""

    NAME: ClassVar[str]
    MLPERF_KEY: ClassVar[str]
    RULESETS: ClassVar[tuple[str, ...]]
    # Said when a config asks for a ruleset outside RULESETS (e.g. the key means another model there).
    RULESET_NOTE: ClassVar[str] = ""
    # Top-level config sections this workload reads, each a dataclass checked as strictly as the rest.
    SECTIONS: ClassVar[dict[str, type]]
    # The metric `eval_finalize` returns that is logged as eval_accuracy and judged against the target.
    METRIC: ClassVar[str] = "accuracy"
    # Whether a larger METRIC is better (accuracy, BLEU, mAP) or a smaller one (a validation loss): the
    # benchmark record's, set for each class that names its MLPERF_KEY (harness.benchmark_rules).
    HIGHER_IS_BETTER: ClassVar[bool] = True
    # The model in Hugging Face layout (a harness.nn.hf_checkpoint.Format): what `model.init_checkpoint`
    # reads from a checkpoint directory and `mlperf-harness export` writes; None: the workload has none.
    HF_FORMAT: ClassVar[Any] = None
    # The benchmark's rules record (harness/benchmark_rules.py ClosedRules): what its closed division fixes of
    # the config and where a run evaluates; None: a workload without closed rules of that shape.
    RULES: ClassVar[rules.ClosedRules | None] = None
    # Model sizes a runtime layout may split over devices: config key -> named dimension. Each must divide
    # evenly (checked with the config, before the log).
    SPLIT_DIMS: ClassVar[dict[str, str]] = {}
    # Scalar step statistics `loss` returns that the run totals over its steps (summary.json `train_totals`,
    # `deviations`): each must be in every training step's statistics.
    STEP_TOTALS: ClassVar[tuple[str, ...]] = ()
    # True: `loss` keys its random draws by each sample's position in the GLOBAL batch (carried by the input)
    # and its own integer hash, so the loop hands every replica the same seed, (run seed, step) as int64 [2]
    # (harness.train.loop.position_seed): any device layout, micro-batching and XLA then draw what one device
    # draws, and replicas still draw differently because their samples' positions differ. False: a seed
    # distinct per replica and micro-batch (loop.training_seed), for draws made per replica batch (dropout).
    DRAWS_BY_GLOBAL_POSITION: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        record = rules.get(cls.__dict__.get("MLPERF_KEY"))
        if record is not None:
            cls.HIGHER_IS_BETTER = record.higher_is_better

    def __init__(self, cfg: Config, runtime: Runtime) -> None:
        self.cfg = cfg
        self.runtime = runtime
        self.optimizer: Any = None  # a harness.nn.optim.Optimizer, set by build()

    # ------------------------------------------------------------------------ facts about the run
    def closed_target(self, ruleset: str) -> float:
        """The closed-division quality target for this ruleset: the benchmark record's, at the configured
        global batch where the target depends on it (BERT 0.7.0)."""
        return rules.closed_target(self.MLPERF_KEY, ruleset, self.cfg.schedule.global_batch_size)

    @property
    def target(self) -> float:
        return self.cfg.schedule.target or self.closed_target(self.cfg.ruleset)

    def reached_target(self, metrics: dict[str, float]) -> bool:
        """Whether the run may stop; the MLPerf references stop at `>=` (`<=` for a lower-is-better
        metric) unless a workload says otherwise."""
        if self.HIGHER_IS_BETTER:
            return metrics[self.METRIC] >= self.target
        return metrics[self.METRIC] <= self.target

    @property
    def target_relation(self) -> str:
        """How a score that reaches the target relates to it, for messages: '>=' or '<='."""
        return ">=" if self.HIGHER_IS_BETTER else "<="

    def best_score(self, scores: Iterable[float]) -> float:
        """The best of several eval scores in this metric's direction."""
        return max(scores) if self.HIGHER_IS_BETTER else min(scores)

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
    def replica_batch(self) -> int:
        """Examples one replica sees in one forward pass (a micro-batch under gradient accumulation)."""
        s = self.cfg.schedule
        return max(1, s.global_batch_size // (self.runtime.num_replicas * s.gradient_accumulation_steps))

    def eval_schedule(self) -> EvalSchedule:
        """Default: `schedule.eval_epochs` if given, else offset + k * cadence epochs up to the budget."""
        s = self.cfg.schedule
        every = s.eval_every_epochs or 1.0
        epochs = s.eval_epochs or cadence_epochs(s)
        if s.eval_epochs and max(epochs) > s.max_epochs + 1e-9:
            raise HarnessError(f"schedule.eval_epochs goes to {max(epochs):g}, past schedule.max_epochs="
                               f"{s.max_epochs:g}")
        return epoch_schedule(epochs, self.train_samples, s.global_batch_size,
                              None if s.eval_epochs else every)

    # Validation, in phases each named once: `validate` (everything, data files included, before the log),
    # `validate_config` (the config alone: what a dry run checks too), within it `validate_closed` (the closed
    # division's rules) and `validate_model` (the model section's own checks).
    def validate(self) -> None:
        """Checks inputs (data paths, sizes, rules) before the log is created; raise HarnessError."""
        self.validate_config()

    def validate_config(self) -> None:
        """What `validate` checks of the config alone (no data file is read): the closed rules in the closed
        division, the model's own checks, then that every size in SPLIT_DIMS divides over its devices."""
        if self.cfg.submission.division == "closed":
            self.validate_closed()
        self.validate_model()
        for key, dim in self.SPLIT_DIMS.items():
            self.runtime.check_divides(key, lookup(self.cfg, key), dim)

    def validate_closed(self) -> None:
        """The closed division's rules: RULES's, checked in one loop (HarnessError, one line)."""
        problem = self.RULES.departures(self.cfg, self.NAME) if self.RULES is not None else None
        if problem:
            raise HarnessError(f"{problem}; or set submission.division=open")

    def validate_model(self) -> None:
        """The model section's own checks (HarnessError)."""

    def data_counts(self) -> dict[str, int]:
        """The sample counts the data files hold, by the `data.` key each belongs in (`mlperf-harness data
        count`); default: the source's `counts()`, {} when it has none (synthetic data is generated to fit)."""
        counts = getattr(getattr(self, "source", None), "counts", None)
        return counts() if callable(counts) else {}

    def reference_model(self) -> ReferenceModel | None:
        """The model the rules fix for the closed division (harness.train.reference checks a closed run on
        real data against it before `validate`); None: the workload declares none."""
        return None

    def model_settings(self) -> dict[str, Any]:
        """What this run builds, for each key of `reference_model().values`. Default: the config value at
        that dotted path; a workload overrides it for a value the config leaves to the data (e.g. 0 = the
        vocab file's size)."""
        ref = self.reference_model()
        return {} if ref is None else {key: lookup(self.cfg, key) for key in ref.values}

    # --------------------------------------------------------------------------- model and inputs
    @abc.abstractmethod
    def build(self) -> None:
        """Creates the model and `self.optimizer` (variables through self.runtime), slots included."""

    @abc.abstractmethod
    def train_dataset(self, ctx: InputContext) -> tf.data.Dataset:
        """This host's training examples, unbatched, shuffled and repeated forever."""

    def train_epoch_dataset(self, ctx: InputContext) -> tf.data.Dataset:
        """One epoch of this host's training examples, unbatched and shuffled but NOT repeated: what the
        tf.data service's workers preprocess per job (`data.service`). A source that cannot give one
        refuses the service."""
        raise HarnessError(f"data.service: {self.NAME} cannot send data.source="
                           f"{getattr(self.cfg.data, 'source', '?')} to a tf.data service (it has no "
                           f"one-epoch training pipeline); preprocess locally")

    @abc.abstractmethod
    def eval_records(self, ctx: InputContext) -> tf.data.Dataset:
        """The whole eval set as raw records in a fixed order (cheap: parsing happens after sharding)."""

    @abc.abstractmethod
    def eval_parse(self, record: Any) -> dict[str, tf.Tensor]:
        """Turns one eval record into model features."""

    # ---------------------------------------------------------------------- per-replica computation
    @abc.abstractmethod
    def loss(self, batch: dict[str, tf.Tensor], seed: tf.Tensor) -> Any:
        """The training loss of this replica's (micro-)batch as named terms, or (terms, named step statistics:
        this replica's sums, no gradient taken); runs with training=True.

        `seed` is an int64 [2] stateless-RNG seed that differs per run seed, step, micro-batch and replica
        (dropout draws from it).
        """

    def process_gradients(self, grads: list[tf.Tensor], stats: dict[str, tf.Tensor]) -> list[tf.Tensor]:
        """Hook on the summed gradients (identical on every replica) before the optimizer step; `stats`: the
        step statistics `loss` returned, summed over micro-batches and replicas (identical on every replica)."""
        return grads

    @abc.abstractmethod
    def eval_step(self, batch: dict[str, tf.Tensor], mask: tf.Tensor) -> dict[str, tf.Tensor]:
        """Outputs on this replica's eval batch (mask 0 = padding): scalars are partial sums the workload
        masks itself; arrays with a leading batch axis are per-example outputs (static shapes)."""

    def eval_accumulate(self, state: dict[str, Any], outputs: dict[str, np.ndarray]) -> None:
        """Folds one eval batch (scalars summed over replicas, per-example arrays of real examples) into
        `state`. Default: float64 sums of scalars and a list of each per-example array."""
        for k, v in outputs.items():
            if np.ndim(v) == 0:
                state[k] = state.get(k, 0.0) + float(v)
            else:
                state.setdefault(k, []).append(v)

    @abc.abstractmethod
    def eval_finalize(self, state: dict[str, Any]) -> dict[str, float]:
        """Named metrics from the whole eval set's state, METRIC among them (run on the chief only)."""

    def deviations(self, evals: list[dict[str, Any]], train_totals: dict[str, float]) -> list[str]:
        """What this run computed differently from the reference, found in its evals' metrics and its training
        totals (STEP_TOTALS; e.g. a mixture of experts that dropped assignments the reference's dropless
        dispatch keeps): printed and kept in summary.json beside the verdicts, which the checker cannot see."""
        return []

    def train_block(self) -> Any:
        """None: the loop's blocks (harness.train.loop.train_block) feed the steps from this workload's train
        pipeline. A workload whose batches are made with the weights of the step that trains on them (GRPO's
        rollouts) returns its own block runner: `warm_up(steps)` (in init, after the loop's warm-up) and a call
        with train_block's arguments and result, framed by harness.train.blocks.run_block as the loop's own
        blocks are; the loop then makes no train pipeline."""
        return None

    # ----------------------------------------------------------------------------------- logging
    def score_keys(self) -> tuple[str, ...]:
        """Keys logged with each eval's score besides eval_accuracy, with its metadata (a division's checker that
        reads another key: flux1's open averaged_validation_loss); default none."""
        return ()

    @abc.abstractmethod
    def mllog_hparams(self) -> dict[str, Any]:
        """Hyperparameter keys and values this benchmark must log for the configured ruleset."""

    # ----------------------------------------------------------------------------------- dry run
    def dry_run_inputs(self) -> tuple[dict[str, tf.TensorSpec], dict[str, tf.TensorSpec], list[str]]:
        """Called instead of `validate` by a dry run (harness.dryrun), where the data set and
        checkpoints may be absent: checks what `validate` checks of the config, makes `build` read no
        file (sizes from the config), and returns the unbatched train example and parsed eval features
        (as `train_dataset` and `eval_parse` give them) plus a line for each fact stood in for the data."""
        raise HarnessError(f"the {self.NAME} workload does not describe its inputs for a dry run")

    def experts_stay_put(self) -> bool:
        """True where the model sends tokens to the devices that hold their experts (an all-to-all over the
        axis splitting `experts`) and never gathers the experts' weights: a dry run's stand-in device then
        holds its own experts only, as the real device does."""
        return False

    def dry_run_notes(self) -> list[str]:
        """Facts a dry run's one stand-in device cannot show, computed from the config (e.g. the bytes an
        all-to-all moves between devices); printed with the report's `stood in` lines."""
        return []

    def stand_in_for(self, full: Any) -> None:
        """Called by a dry run that compiles this workload at smaller sizes (DRY_RUN_LINEAR) to extrapolate to
        the `full` config: a workload whose computation is shaped by a size beyond proportion (e.g. blocks
        sized by the vocabulary) keeps the full size's shape here, so the extrapolation holds."""

    def weights_initialization_map(self) -> dict[str, str]:
        """MLPerf tensor name -> this model's variable path, for rulesets that require one
        `weights_initialization` event per named tensor (empty: the workload names none)."""
        return {}


def tidy(x: float) -> float | int:
    """An integer-valued float as int, else rounded to 6 places (for log positions)."""
    return int(round(x)) if abs(x - round(x)) < 1e-9 else round(float(x), 6)
