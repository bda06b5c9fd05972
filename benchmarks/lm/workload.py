"""The decoder benchmarks' mechanism (gpt_oss_20b, llama31_8b, llama2_70b_lora, deepseekv3_671b): build, checkpoint
load, the one cross-entropy entry point, the split-dims check, the disclosure keys and the dry-run stand-ins. What
a benchmark's rules fix (closed values, row length, eval rows, data source, cadence, the loss's mean, the metric,
the run's length, its log keys) is its `RULES` record (benchmarks/lm/rules.py), read here and never re-spelled.

AdamW with a cosine-with-linear-warmup schedule over `max_steps` (decay steps = max_steps - warmup), global norm
clipping, next-token cross-entropy at every position the data scores (`scored_rows`: every position, or every
position whose input is not EOD where the reference sets Megatron's `eod_mask_loss`, `EOD_MASK_LOSS`; a
fine-tune's answer tokens). The metric, LOWER is better, averages the eval rows' cross-entropy in nats as the loss
does (numerators and denominators summed over the whole eval set before dividing). A subclass chooses its model
(`make_model`, `forward`, `validate_model`, `extra_losses`, `routings`, `model_stats`, `model_updates`,
`extra_hparams`) and its data (`make_source`, `scored_rows`); a mixture of experts' dropped assignments are
counted in training (step statistics) and in every eval.
"""
from __future__ import annotations

import abc
from typing import Any, ClassVar

import tensorflow as tf

from harness.errors import HarnessError
from harness.nn import cross_entropy, hf_checkpoint
from harness.nn.cross_entropy import token_cross_entropy
from harness.nn.optim import AdamW, cosine_warmup_schedule
from harness.train.reference import ReferenceModel
from harness.train.workload import EvalSchedule, LossTerm, Workload, sample_schedule

from benchmarks.lm import data
from benchmarks.lm.moe_capacity import DROPPED_METRIC
from benchmarks.lm.rules import PRECISION_NAMES, ROW_MEAN, TOKEN_MEAN, DecoderRules

MOE_TOTALS = ("dropped", "assigned")  # a mixture of experts' step statistics the run totals (STEP_TOTALS)


def row_mean_losses(xent: tf.Tensor, weights: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Each row's mean cross-entropy over its scored positions [b] and whether it has any [b] (float 0/1);
    `weights` [b, s'] scores the first s' positions of `xent` [b, s]."""
    tokens = tf.reduce_sum(weights, 1)
    has = tf.cast(tokens > 0, tf.float32)
    return tf.reduce_sum(xent[:, :weights.shape[1]] * weights, 1) / tf.maximum(tokens, 1.0), has


class DecoderLMWorkload(Workload):
    """What the decoder benchmarks share; a subclass sets NAME, MLPERF_KEY, RULESETS, SECTIONS, RULES and
    REFERENCE_MODEL and implements `make_model` (the closed target and its direction come from the benchmark's
    record in harness/benchmark_rules.py, METRIC from RULES)."""

    RULES: ClassVar[DecoderRules]
    EOD_MASK_LOSS: ClassVar[bool] = True   # no loss where the input is EOD (Megatron's eod_mask_loss)
    REFERENCE_MODEL: ClassVar[ReferenceModel]
    SPLIT_DIMS = {"model.num_kv_heads": "heads", "model.vocab_size": "vocab"}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "RULES" in cls.__dict__:
            cls.METRIC = cls.RULES.metric

    def __init__(self, cfg, runtime) -> None:
        super().__init__(cfg, runtime)
        self.source = self.make_source()
        self.model: Any = None
        self.loss_budget_scale = 1.0  # the cross-entropy's block budgets x this (a dry run's stand-in vocabulary)

    def stand_in_for(self, full: Any) -> None:
        """At a stood-in vocabulary the loss's block and keep budgets shrink with it, so each block spans the
        positions the full vocabulary's would, and the loss's memory grows linearly to the full size's."""
        self.loss_budget_scale = self.cfg.model.vocab_size / full.model.vocab_size

    @property
    def train_samples(self) -> int:
        return self.source.train_samples

    # ------------------------------------------------------------------------------------ schedule
    def eval_schedule(self) -> EvalSchedule:
        """The rules' cadence (RULES.cadence, which `plan` reads too) up to the budget, and at the budget."""
        gbs = self.cfg.schedule.global_batch_size
        budget = self.RULES.budget(self.cfg, self.train_samples) * gbs
        marks = self.RULES.cadence(self.cfg, gbs).marks(budget)
        return sample_schedule(marks, self.train_samples, gbs, None)

    def reference_model(self) -> ReferenceModel:
        return self.REFERENCE_MODEL

    # ---------------------------------------------------------------------------------- validation
    def validate(self) -> None:
        self.validate_config()
        self.source.validate(closed=self.cfg.submission.division == "closed")
        if self.cfg.model.init_checkpoint:
            hf_checkpoint.check_config(self.cfg.model.init_checkpoint, self.HF_FORMAT, self.cfg.model)

    def validate_model(self) -> None:
        """The attention heads' shape; a subclass adds its block's checks."""
        m = self.cfg.model
        if m.num_heads % m.num_kv_heads:
            raise HarnessError(f"model.num_heads={m.num_heads} is not a multiple of model.num_kv_heads="
                               f"{m.num_kv_heads}")
        if m.head_dim % 2:
            raise HarnessError(f"model.head_dim={m.head_dim} must be even (RoPE turns pairs)")

    def dry_run_inputs(self) -> tuple[dict[str, tf.TensorSpec], dict[str, tf.TensorSpec], list[str]]:
        self.validate_config()
        d, notes = self.cfg.data, []
        if d.source != "synthetic" and not d.train_samples:
            d.train_samples, how = self.source.stand_in_rows(self.cfg)
            notes.append(f"data.train_samples stood in as {how} = {d.train_samples} rows (the data files are not "
                         f"read)")
        if self.cfg.model.init_checkpoint:
            notes.append(f"model.init_checkpoint {self.cfg.model.init_checkpoint} not read: weights from the "
                         f"initializers")
            self.cfg.model.init_checkpoint = ""  # the dry run's own config: build() then reads no file
        row = self.source.example_spec()
        return row, dict(row), notes

    # ------------------------------------------------------------------------ model and data choices
    def make_source(self) -> Any:
        """The data (benchmarks/lm/data.py's Source protocol: train, eval_records, eval_parse, validate,
        example_spec, stand_in_rows, train_samples)."""
        return data.Source(self.cfg.data, self.cfg.model.vocab_size)

    @abc.abstractmethod
    def make_model(self) -> Any:
        """The model: called on inputs [b, s], it returns (hidden states [b, s, hidden], extras); `head()` gives
        the LM head's kernel [hidden, vocab] in the compute dtype."""

    def scored_rows(self, batch: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """(inputs [b, s], targets [b, s], weights [b, s'] of the first s' positions: 1 scored, 0 not) of a batch
        of token rows [b, s + 1]: every position, but where the input is EOD under EOD_MASK_LOSS."""
        tokens = batch["tokens"]
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        if self.EOD_MASK_LOSS:
            return inputs, targets, tf.cast(tf.not_equal(inputs, self.cfg.data.eod_id), tf.float32)
        return inputs, targets, tf.ones(targets.shape, tf.float32)

    def forward(self, inputs: tf.Tensor, targets: tf.Tensor, seed: tf.Tensor | None) -> tuple[tf.Tensor, Any]:
        """(final hidden states, extras) of the model on `inputs`; `seed`: training's dropout seed (None: eval)."""
        return self.model(inputs)

    def routings(self, extras: Any) -> list[Any]:
        """A mixture of experts' routing results (each with `dropped` [b]: assignments dropped per row), one per
        MoE layer; [] for a dense model."""
        return []

    def model_stats(self, extras: Any) -> dict[str, tf.Tensor]:
        """Step statistics of the model's own (summed over micro-batches and replicas for `model_updates`)."""
        return {}

    def model_updates(self, stats: dict[str, tf.Tensor]) -> None:
        """Updates of the model's own once per step, after the gradients are complete (e.g. an expert bias)."""

    def extra_losses(self, extras: Any, targets: tf.Tensor) -> dict[str, LossTerm]:
        return {}

    def extra_hparams(self) -> dict[str, Any]:
        return {}

    # ---------------------------------------------------------------------------------------- build
    def build(self) -> None:
        o = self.cfg.optimizer
        self.model = self.make_model()
        if self.cfg.model.init_checkpoint:
            hf_checkpoint.load_into(self.runtime, self.cfg.model.init_checkpoint, self.HF_FORMAT, self.cfg.model)
        schedule = cosine_warmup_schedule(o.base_learning_rate, o.end_learning_rate, o.warmup_steps,
                                          self.decay_steps)
        # the decay applied, whatever opt_adamw_weight_decay logs (deepseekv3_671b's reference applies another)
        self.optimizer = AdamW(self.runtime, self.runtime.variables(trainable=True), schedule,
                               weight_decay=o.applied_decay(), exclude_from_decay=o.exclude_from_decay,
                               beta_1=o.beta_1, beta_2=o.beta_2, epsilon=o.epsilon)
        self.optimizer.build()

    @property
    def decay_steps(self) -> int:
        return max(1, self.cfg.optimizer.max_steps - self.cfg.optimizer.warmup_steps)

    def train_dataset(self, ctx) -> tf.data.Dataset:
        return self.source.train(ctx)

    def train_epoch_dataset(self, ctx) -> tf.data.Dataset:
        """One epoch of rows for the tf.data service: every source is TensorFlow ops alone."""
        return self.source.train(ctx, repeat=False)

    def eval_records(self, ctx) -> tf.data.Dataset:
        return self.source.eval_records()

    def eval_parse(self, record: Any) -> dict[str, tf.Tensor]:
        return self.source.eval_parse(record)

    # ------------------------------------------------------------------------------- computation
    def xent(self, hidden: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
        """The cross-entropy [b, s] of the LM head on `hidden` against `targets`, applied blockwise
        (harness/nn/cross_entropy.py): the one place every loss and metric here computes it."""
        scale = self.loss_budget_scale
        return token_cross_entropy(self.runtime, hidden, self.model.head(), targets,
                                   budget=max(1, int(cross_entropy.BLOCK_ELEMENTS * scale)),
                                   keep=int(cross_entropy.KEEP_ELEMENTS * scale))

    def position_losses(self, batch: dict[str, tf.Tensor], seed: tf.Tensor | None):
        """(cross-entropy [b, s], weights [b, s'], the model's extras, targets [b, s])."""
        inputs, targets, weights = self.scored_rows(batch)
        hidden, extras = self.forward(inputs, targets, seed)
        return self.xent(hidden, targets), weights, extras, targets

    def moe_sums(self, extras: Any, mask: tf.Tensor) -> dict[str, tf.Tensor]:
        """A mixture of experts' assignments dropped for capacity (model.capacity_factor) in real rows and the
        assignments routed, over its MoE layers: the ST-MoE health metric, in training and eval."""
        moe = self.routings(extras)
        if not moe:
            return {name: tf.constant(0.0) for name in self.STEP_TOTALS}
        per_row = float(self.cfg.data.seq_length * self.cfg.model.experts_per_token * len(moe))
        return {"dropped": tf.add_n([tf.reduce_sum(r.dropped * mask) for r in moe]),
                "assigned": per_row * tf.reduce_sum(mask)}

    def loss(self, batch: dict[str, tf.Tensor], seed: tf.Tensor) -> Any:
        """The cross-entropy averaged as RULES.loss says, the subclass's `extra_losses`; step statistics: the
        dropped assignments and the model's own."""
        xent, weights, extras, targets = self.position_losses(batch, seed)
        if self.RULES.loss == ROW_MEAN:
            rows, has = row_mean_losses(xent, weights)
            terms = {"cross_entropy": LossTerm(tf.reduce_sum(rows * has), tf.reduce_sum(has))}
        else:
            terms = {"cross_entropy": LossTerm(tf.reduce_sum(xent * weights), tf.reduce_sum(weights))}
        terms.update(self.extra_losses(extras, targets))
        stats = {**self.moe_sums(extras, tf.ones([xent.shape[0]])), **self.model_stats(extras)}
        return (terms, stats) if stats else terms

    def process_gradients(self, grads: list[tf.Tensor], stats: dict[str, tf.Tensor]) -> list[tf.Tensor]:
        """The global-norm clip, then the model's own updates from the step's statistics."""
        if self.cfg.optimizer.clip_norm:
            grads, _ = tf.clip_by_global_norm(grads, self.cfg.optimizer.clip_norm)
        self.model_updates(stats)
        return grads

    def eval_step(self, batch: dict[str, tf.Tensor], mask: tf.Tensor) -> dict[str, tf.Tensor]:
        xent, weights, extras, _ = self.position_losses(batch, None)
        if self.RULES.loss == ROW_MEAN:
            rows, has = row_mean_losses(xent, weights)
            w = has * mask
            sums = {"row_loss": tf.reduce_sum(rows * w), "rows": tf.reduce_sum(w)}
        else:
            w = weights * tf.expand_dims(mask, 1)
            sums = {"nll": tf.reduce_sum(xent[:, :w.shape[1]] * w), "tokens": tf.reduce_sum(w),
                    "rows": tf.reduce_sum(mask)}
        return {**sums, **self.moe_sums(extras, mask)}

    def eval_finalize(self, state: dict[str, float]) -> dict[str, float]:
        num, den = ("nll", "tokens") if self.RULES.loss == TOKEN_MEAN else ("row_loss", "rows")
        metrics = {self.METRIC: state[num] / max(state[den], 1e-9)}
        if "dropped" in state:
            metrics[DROPPED_METRIC] = state["dropped"] / max(state["assigned"], 1.0)
        return metrics

    def deviations(self, evals: list[dict[str, Any]], train_totals: dict[str, float]) -> list[str]:
        """A mixture of experts under a capacity factor that dropped assignments in training or in an eval: the
        references' MoEs are dropless, so a closed run's result is then not their computation."""
        shares = [e["metrics"].get(DROPPED_METRIC, 0.0) for e in evals]
        worst = max(shares, default=0.0)
        dropped, assigned = train_totals.get("dropped", 0.0), train_totals.get("assigned", 0.0)
        where = []
        if worst > 0:
            where.append(f"in {sum(v > 0 for v in shares)} of {len(shares)} evals (at most {worst:.3%})")
        if dropped > 0:
            where.append(f"in training ({dropped / max(assigned, 1.0):.3%} of {assigned:,.0f})")
        if not where:
            return []
        return [f"model.capacity_factor={self.cfg.model.capacity_factor} dropped expert assignments "
                f"{' and '.join(where)}; the reference's MoE drops none, so this {self.cfg.submission.division} "
                f"result is not its computation"]

    # ------------------------------------------------------------------------------------ logging
    def mllog_hparams(self) -> dict[str, Any]:
        """The benchmark's keys (RULES.keys) and its target, 6.1.0's precision/parallelism disclosure (the older
        rulesets ignore keys they do not know), then the subclass's `extra_hparams` (a key already named keeps
        its place)."""
        rt = self.runtime
        precision = PRECISION_NAMES[rt.precision]
        keys = {
            **self.RULES.keys(self),
            "target_accuracy": self.target,
            "lowest_numerical_precision_in_linear": precision,
            "lowest_numerical_precision_in_attn": precision,
            "lowest_numerical_precision_in_comm": precision,
            "tensor_parallelism": max(rt.shards(d) for d in ("heads", "ff", "vocab")),
            "pipeline_parallelism": 1,
            "context_parallelism": 1,
            "expert_parallelism": rt.shards("experts"),
            "micro_batch_size": self.replica_batch,
            "config_filename": self.cfg.config_file or "unknown",
        }
        keys.update(self.extra_hparams())
        return keys
