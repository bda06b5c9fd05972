"""The decoder LM pretraining workloads' common part (MLPerf gpt_oss_20b, llama31_8b): their closed rules are
one checker file but for the target.

AdamW with a cosine-with-linear-warmup schedule over `max_steps` (decay steps = max_steps - warmup), global
norm clipping, next-token cross-entropy over every position, or over every position whose input is not EOD
where the workload's reference sets Megatron's `eod_mask_loss` (`EOD_MASK_LOSS`: gpt_oss_20b yes, llama31_8b
no). The quality metric is the token-weighted mean cross-entropy in nats over the fixed eval
rows (Megatron's `lm loss`, numerators and denominators summed over the whole eval set before dividing):
LOWER is better. Evals fall every ceil(12288 / gbs) * gbs samples in the closed division; positions are
training samples. `global_batch_size` counts rows of `data.seq_length` tokens. A subclass builds the model
(`make_model`, whose call returns the final hidden states and anything else its loss needs; the loss
applies the LM head blockwise, harness/nn/cross_entropy.py) and adds its own checks,
loss terms, eval metrics and log keys through the hooks below.
"""
from __future__ import annotations

import abc
import math
import os
from typing import Any, ClassVar

import tensorflow as tf

from harness import benchmark_rules as rules
from harness.errors import HarnessError
from harness.nn import cross_entropy, hf_checkpoint
from harness.nn.cross_entropy import token_cross_entropy
from harness.nn.optim import AdamW, cosine_warmup_schedule
from harness.train.reference import ReferenceModel, lookup
from harness.train.workload import EvalSchedule, LossTerm, Workload, sample_schedule

from benchmarks.lm import data
from benchmarks.lm.moe_dispatch import DROPPED_METRIC

CLOSED_SEQ_LENGTH, CLOSED_EVAL_SAMPLES = 8192, 1024
PRECISION_NAMES = {"float32": "fp32", "bfloat16": "bfloat16", "float16": "fp16"}
# What the closed checker (and, for the end learning rate, the rules) fix: (config key, value).
CLOSED_OPTIMIZER = (("max_steps", 1_200_000), ("beta_1", 0.9), ("beta_2", 0.95), ("epsilon", 1e-5),
                    ("weight_decay", 0.1), ("clip_norm", 1.0))


class DecoderLMWorkload(Workload):
    """What gpt_oss_20b and llama31_8b share; a subclass sets NAME, MLPERF_KEY, RULESETS, SECTIONS and
    REFERENCE_MODEL and implements `make_model` (the closed target and its direction come from the benchmark's
    record in harness/benchmark_rules.py)."""

    METRIC = "log perplexity"
    EOD_MASK_LOSS: ClassVar[bool] = True   # no loss where the input is EOD (Megatron's eod_mask_loss)
    REFERENCE_MODEL: ClassVar[ReferenceModel]
    # Model sizes a runtime layout may split over devices: config key -> named dimension. Each must divide
    # evenly (checked with the config, before the log); a subclass extends it with its blocks' sizes.
    SPLIT_DIMS: ClassVar[dict[str, str]] = {"model.num_kv_heads": "heads", "model.vocab_size": "vocab"}

    def __init__(self, cfg, runtime) -> None:
        super().__init__(cfg, runtime)
        self.source = data.Source(cfg.data, cfg.model.vocab_size)
        self.model: Any = None
        self.loss_budget_scale = 1.0  # the cross-entropy's block budgets x this (a dry run's stand-in vocabulary)

    def stand_in_for(self, full: Any) -> None:
        """At a stood-in vocabulary the loss's block and keep budgets shrink with it, so each block spans the
        positions the full vocabulary's would, and the loss's memory grows linearly to the full size's."""
        self.loss_budget_scale = self.cfg.model.vocab_size / full.model.vocab_size

    @property
    def train_samples(self) -> int:
        return self.source.train_samples

    @property
    def data_source(self) -> str:
        return self.cfg.data.source

    # ------------------------------------------------------------------------------------ schedule
    @property
    def eval_every_samples(self) -> int:
        return self.cfg.data.eval_every_samples or rules.lm_eval_every(self.cfg.schedule.global_batch_size)

    def eval_schedule(self) -> EvalSchedule:
        """An eval every `eval_every_samples` up to the budget (and at the budget)."""
        gbs = self.cfg.schedule.global_batch_size
        budget = max(1, math.ceil(self.cfg.schedule.max_epochs * self.train_samples / gbs - 1e-9)) * gbs
        every = self.eval_every_samples
        marks = list(range(every, budget, every)) + [budget]
        return sample_schedule(marks, self.train_samples, gbs, None)

    def reference_model(self) -> ReferenceModel:
        return self.REFERENCE_MODEL

    def validate(self) -> None:
        self.validate_config()
        self.source.validate()
        if self.cfg.model.init_checkpoint:
            hf_checkpoint.check_config(self.cfg.model.init_checkpoint, self.HF_FORMAT, self.cfg.model)
        d = self.cfg.data
        if self.cfg.submission.division == "closed" and d.source == "indexed" and d.train_samples:
            rows = self.source.indexed_rows(d.train_prefix)
            if d.train_samples != rows:
                path = os.path.join(d.data_dir, d.train_prefix)
                raise HarnessError(f"closed {self.NAME}: data.train_samples={d.train_samples} but {path} holds "
                                   f"{rows} rows of {d.seq_length + 1} tokens; set data.train_samples=0 (counted "
                                   "from the files)")

    def dry_run_inputs(self) -> tuple[dict[str, tf.TensorSpec], dict[str, tf.TensorSpec], list[str]]:
        self.validate_config()
        d, notes = self.cfg.data, []
        if d.source != "synthetic" and not d.train_samples:
            d.train_samples = self.cfg.optimizer.max_steps * self.cfg.schedule.global_batch_size
            notes.append(f"data.train_samples stood in as optimizer.max_steps x global batch = {d.train_samples} "
                         f"rows (the index files are not read)")
        if self.cfg.model.init_checkpoint:
            notes.append(f"model.init_checkpoint {self.cfg.model.init_checkpoint} not read: weights from the "
                         f"initializers")
            self.cfg.model.init_checkpoint = ""  # the dry run's own config: build() then reads no file
        row = {"tokens": tf.TensorSpec([d.seq_length + 1], tf.int32)}
        return row, dict(row), notes

    def validate_config(self) -> None:
        """What `validate` checks of the config alone (no data file is read); then `validate_model`, then that
        every size in SPLIT_DIMS divides over its devices."""
        c, m = self.cfg, self.cfg.model
        if c.submission.division == "closed":
            self.validate_closed()
        if m.num_heads % m.num_kv_heads:
            raise HarnessError(f"model.num_heads={m.num_heads} is not a multiple of model.num_kv_heads="
                               f"{m.num_kv_heads}")
        if m.head_dim % 2:
            raise HarnessError(f"model.head_dim={m.head_dim} must be even (RoPE turns pairs)")
        self.validate_model()
        for key, dim in self.SPLIT_DIMS.items():
            self.runtime.check_divides(key, lookup(self.cfg, key), dim)

    def validate_closed(self) -> None:
        """What the closed division fixes of the config (HarnessError): gpt_oss_20b's and llama31_8b's rules."""
        c, m, d = self.cfg, self.cfg.model, self.cfg.data
        fix = "; or set submission.division=open"
        if d.eval_every_samples:
            raise HarnessError(f"closed {self.NAME} evaluates every ceil(12288/gbs)*gbs samples: set "
                               f"data.eval_every_samples=0{fix}")
        if d.seq_length != CLOSED_SEQ_LENGTH or d.eval_samples != CLOSED_EVAL_SAMPLES:
            raise HarnessError(f"closed {self.NAME} trains on rows of {CLOSED_SEQ_LENGTH} tokens and scores "
                               f"{CLOSED_EVAL_SAMPLES} eval rows (got data.seq_length={d.seq_length}, "
                               f"data.eval_samples={d.eval_samples}){fix}")
        o = c.optimizer
        for key, want in CLOSED_OPTIMIZER:
            if not math.isclose(getattr(o, key), want, rel_tol=1e-9):
                raise HarnessError(f"closed {self.NAME}: the checker fixes optimizer.{key}={want:g} (got "
                                   f"{getattr(o, key):g}){fix}")
        if not math.isclose(o.end_learning_rate, 0.1 * o.base_learning_rate, rel_tol=1e-6):
            raise HarnessError(f"closed {self.NAME}: the rules fix optimizer.end_learning_rate at 0.1 x "
                               f"base_learning_rate = {0.1 * o.base_learning_rate:g} (got "
                               f"{o.end_learning_rate:g}){fix}")
        if m.init_checkpoint:
            raise HarnessError(f"closed {self.NAME} pretrains from the reference's random initialization: "
                               f"remove model.init_checkpoint{fix}")

    def validate_model(self) -> None:
        """The model's own config checks (HarnessError)."""

    # ----------------------------------------------------------------------------- model and inputs
    @abc.abstractmethod
    def make_model(self) -> Any:
        """The model: called on inputs [b, s], it returns (hidden states [b, s, hidden], extras); `head()` gives
        the LM head's kernel [hidden, vocab] in the compute dtype."""

    def build(self) -> None:
        o = self.cfg.optimizer
        self.model = self.make_model()
        if self.cfg.model.init_checkpoint:
            hf_checkpoint.load_into(self.runtime, self.cfg.model.init_checkpoint, self.HF_FORMAT, self.cfg.model)
        schedule = cosine_warmup_schedule(o.base_learning_rate, o.end_learning_rate, o.warmup_steps,
                                          self.decay_steps)
        self.optimizer = AdamW(self.runtime, self.runtime.variables(trainable=True), schedule,
                               weight_decay=o.weight_decay, exclude_from_decay=o.exclude_from_decay,
                               beta_1=o.beta_1, beta_2=o.beta_2, epsilon=o.epsilon)
        self.optimizer.build()

    @property
    def decay_steps(self) -> int:
        return max(1, self.cfg.optimizer.max_steps - self.cfg.optimizer.warmup_steps)

    def train_dataset(self, ctx) -> tf.data.Dataset:
        return self.source.train(ctx)

    def train_epoch_dataset(self, ctx) -> tf.data.Dataset:
        """One epoch of rows for the tf.data service: both sources are TensorFlow ops alone."""
        return self.source.train(ctx, repeat=False)

    def eval_records(self, ctx) -> tf.data.Dataset:
        return self.source.eval_records()

    def eval_parse(self, record: Any) -> dict[str, tf.Tensor]:
        return {"tokens": record}

    # ------------------------------------------------------------------------------- computation
    def token_losses(self, tokens: tf.Tensor):
        """Cross-entropy per position [b, s], its weights (0 where the input is EOD under EOD_MASK_LOSS, else 1)
        and the model's extras."""
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        hidden, extras = self.model(inputs)
        scale = self.loss_budget_scale
        xent = token_cross_entropy(self.runtime, hidden, self.model.head(), targets,
                                   budget=max(1, int(cross_entropy.BLOCK_ELEMENTS * scale)),
                                   keep=int(cross_entropy.KEEP_ELEMENTS * scale))
        if self.EOD_MASK_LOSS:
            weights = tf.cast(tf.not_equal(inputs, self.cfg.data.eod_id), tf.float32)
        else:
            weights = tf.ones_like(xent)
        return xent, weights, extras

    def loss(self, batch: dict[str, tf.Tensor], seed: tf.Tensor) -> dict[str, LossTerm]:
        """Mean cross-entropy over scored tokens, plus the subclass's `extra_losses`."""
        xent, weights, extras = self.token_losses(batch["tokens"])
        terms = {"cross_entropy": LossTerm(tf.reduce_sum(xent * weights), tf.reduce_sum(weights))}
        terms.update(self.extra_losses(extras))
        return terms

    def extra_losses(self, extras: Any) -> dict[str, LossTerm]:
        return {}

    def process_gradients(self, grads: list[tf.Tensor]) -> list[tf.Tensor]:
        if self.cfg.optimizer.clip_norm:
            grads, _ = tf.clip_by_global_norm(grads, self.cfg.optimizer.clip_norm)
        return grads

    def eval_step(self, batch: dict[str, tf.Tensor], mask: tf.Tensor) -> dict[str, tf.Tensor]:
        xent, weights, extras = self.token_losses(batch["tokens"])
        w = weights * tf.expand_dims(mask, 1)
        return {"nll": tf.reduce_sum(xent * w), "tokens": tf.reduce_sum(w), "rows": tf.reduce_sum(mask),
                **self.extra_eval_sums(extras, mask)}

    def extra_eval_sums(self, extras: Any, mask: tf.Tensor) -> dict[str, tf.Tensor]:
        return {}

    def eval_finalize(self, state: dict[str, float]) -> dict[str, float]:
        return {self.METRIC: state["nll"] / max(state["tokens"], 1e-9), **self.extra_eval_metrics(state)}

    def extra_eval_metrics(self, state: dict[str, float]) -> dict[str, float]:
        return {}

    def deviations(self, evals: list[dict[str, Any]]) -> list[str]:
        """A mixture of experts under a capacity factor that dropped assignments: the references' MoEs are
        dropless, so a closed run's result is then not their computation (the eval shows the share dropped)."""
        shares = [e["metrics"].get(DROPPED_METRIC, 0.0) for e in evals]
        worst = max(shares, default=0.0)
        if worst <= 0:
            return []
        return [f"model.capacity_factor={self.cfg.model.capacity_factor} dropped expert assignments in "
                f"{sum(v > 0 for v in shares)} of {len(shares)} evals (at most {worst:.3%}); the reference's "
                f"MoE drops none, so this {self.cfg.submission.division} result is not its computation"]

    # ------------------------------------------------------------------------------------ logging
    def mllog_hparams(self) -> dict[str, Any]:
        """The closed keys (warmup logged before decay steps: the checker reads them in log order), 6.1.0's
        precision/parallelism disclosure (the older rulesets ignore keys they do not know), then the
        subclass's `extra_hparams`."""
        o, rt = self.cfg.optimizer, self.runtime
        precision = PRECISION_NAMES[rt.precision]
        keys = {
            "max_sequence_length": self.cfg.data.seq_length,
            "opt_name": "adamw",
            "opt_base_learning_rate": o.base_learning_rate,
            "opt_end_learning_rate": o.end_learning_rate,
            "opt_learning_rate_warmup_steps": o.warmup_steps,
            "opt_learning_rate_decay_steps": self.decay_steps,
            "opt_learning_rate_decay_schedule": "cosine with linear warmup",
            "opt_adamw_beta_1": o.beta_1,
            "opt_adamw_beta_2": o.beta_2,
            "opt_adamw_epsilon": o.epsilon,
            "opt_adamw_weight_decay": o.weight_decay,
            "opt_gradient_clip_norm": o.clip_norm,
            "max_steps": o.max_steps,
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

    def extra_hparams(self) -> dict[str, Any]:
        return {}
