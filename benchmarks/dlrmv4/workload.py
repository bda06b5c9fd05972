"""MLPerf Training 6.1 dlrmv4: the HSTU ranker (benchmarks/dlrmv4/model.py) over 11 embedding tables, trained in
one time-ordered pass over Yambda-5B's day windows 0..298 to an AUC >= 0.75 on window 299.

As the reference trains (mlcommons/training@a67b8459 recommendation_v4/generative_recommenders/dlrm_v4/train/):
the loss is 0.2 x the batch mean of BCE-with-logits; torch's Adam (0.95, 0.999, 1e-8) on the dense weights after
clipping their global norm to 1.0, FBGEMM's exact row-wise Adagrad on every table row a step looked up, one LR
for both with a linear warmup from 0 (benchmarks/dlrmv4/training.py). The attention divides by the longest
sequence of each replica's own batch: a mesh step holds the global batch and splits it into its batch shards.
The eval scores every sample of the eval window: each replica's logits are gathered to the host and the AUC
computed exactly over all of them (benchmarks/dlrmv4/metrics.py), never averaged over replicas.

On a mesh whose layout splits `vocab`, every table and its Adagrad accumulator are held in row shards (model.py
`lookup`); a layout splitting the batch over the same axis routes each device's ids to their owners by
all-to-all (owner_lookup.py `routed_lookup`). On TPU the native engine for such tables is TPUEmbedding, which
the harness does not wire: a TPU run is refused.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf

from harness import benchmark_rules as rules
from harness.errors import HarnessError
from harness.platforms import device_memory
from harness.train.workload import EvalSchedule, LossTerm, Workload, sample_schedule

from benchmarks.dlrmv4 import config, data, hparams, memory, training
from benchmarks.dlrmv4.metrics import exact_auc
from benchmarks.dlrmv4.model import HSTURanker
from benchmarks.dlrmv4.owner_lookup import routed
from benchmarks.dlrmv4.rules import RULES

PRECISION_NAMES = {"float32": "fp32", "bfloat16": "bfloat16", "float16": "fp16"}


class DlrmV4Workload(Workload):
    NAME = "dlrmv4"
    MLPERF_KEY = "dlrmv4"
    RULESETS = ("6.1.0",)
    RULESET_NOTE = "dlrmv4 is a benchmark from MLPerf Training 6.1 on"
    SECTIONS = {"data": config.DataConfig, "model": config.ModelConfig, "optimizer": config.OptimizerConfig}
    METRIC = "AUC"
    RULES = RULES

    def __init__(self, cfg, runtime) -> None:
        super().__init__(cfg, runtime)
        self.source = data.make_source(cfg.data, cfg.model)
        self.model: HSTURanker | None = None
        self.dense_count = 0

    # ------------------------------------------------------------------------------- facts of the run
    @property
    def train_samples(self) -> int:
        return self.source.train_samples

    @property
    def eval_samples(self) -> int:
        return self.source.eval_samples

    @property
    def groups(self) -> int:
        """Replicas whose batches one call of the model holds: all of them on a mesh (its step sees the global
        batch), one on tf.distribute and on the dry run's stand-in replica (which compiles one replica's share of
        a mesh whose batch axis is split)."""
        return self.runtime.program_batch(self.runtime.num_replicas)

    def eval_schedule(self) -> EvalSchedule:
        """The cadence's evals (rules.py, which `plan` reads too) within schedule.max_epochs passes, then one at the
        budget (off the checker's grid unless the budget is on it: a run that gets there has missed the target)."""
        gbs = self.cfg.schedule.global_batch_size
        budget = max(1, math.ceil(self.cfg.schedule.max_epochs * self.train_samples / gbs - 1e-9)) * gbs
        cadence = RULES.cadence(self.cfg, gbs)
        return sample_schedule(cadence.marks(budget), self.train_samples, gbs, cadence.every)

    # ---------------------------------------------------------------------------------- validation
    def validate_model(self) -> None:
        problems = self.cfg.model.check()
        if problems:
            raise HarnessError(problems[0])
        if self.runtime.device_type == "TPU":
            raise HarnessError("dlrmv4 does not run on TPU: its tables belong in TPUEmbedding, which the harness "
                               "does not wire; run on GPU or CPU")
        gbs, shards = self.cfg.schedule.global_batch_size, self.runtime.shards("vocab")
        limit = device_memory(self.cfg.submission.platform) or memory.REFERENCE_DEVICE
        if routed(self.runtime):
            # Each device routes its batch share's ids to their owners (owner_lookup.py `routed_lookup`).
            if gbs % shards:
                raise HarnessError(f"schedule.global_batch_size={gbs}: the routed lookup splits the batch over the "
                                   f"{shards} devices splitting the tables' rows; use a multiple of {shards}")
            line = memory.refusal(self.cfg, shards, gbs, limit, routed=True)
        else:
            # A mesh step looks up the global batch's ids on every device (owner_lookup deduplicates them over
            # the whole batch); a tf.distribute replica its own batch's.
            line = memory.refusal(self.cfg, shards, self.runtime.program_batch(gbs), limit)
        if line:
            raise HarnessError(line)

    def validate(self) -> None:
        self.validate_config()
        self.source.validate()
        d = self.cfg.data
        if self.cfg.submission.division == "closed":
            for key, want in (("train_samples", rules.DLRMV4_TRAIN_SAMPLES),
                              ("eval_samples", rules.DLRMV4_EVAL_SAMPLES)):
                got = getattr(self, key)
                if got != want:
                    raise HarnessError(f"closed dlrmv4 logs {key} {want:,} (the reference's); the data gives "
                                       f"{got:,}; or set submission.division=open")
        elif d.source == "synthetic" and not d.eval_every_samples:
            raise HarnessError("synthetic dlrmv4 has no place on the checker's grid: set data.eval_every_samples")

    def dry_run_inputs(self) -> tuple[dict[str, tf.TensorSpec], dict[str, tf.TensorSpec], list[str]]:
        self.validate_config()
        notes = []
        d = self.cfg.data
        if d.source != "synthetic":
            d.train_samples = d.train_samples or rules.DLRMV4_TRAIN_SAMPLES
            d.eval_samples = d.eval_samples or rules.DLRMV4_EVAL_SAMPLES
            notes.append(f"data.train_samples / eval_samples stood in as {d.train_samples:,} / {d.eval_samples:,} "
                         f"(the cache is not read)")
            self.source = data.SyntheticSource(d, self.cfg.model)
        spec = data.signature(self.cfg.model.history_length)
        return spec, spec, notes

    # ---------------------------------------------------------------------------- model and inputs
    def build(self) -> None:
        c, o = self.cfg, self.cfg.optimizer
        self.model = HSTURanker(self.runtime, "hstu", c.seed, c.model)
        schedule = training.warmup_schedule(o.base_learning_rate, o.warmup_steps)
        self.optimizer = training.make_optimizer(self.runtime, self.runtime.variables(trainable=True), schedule)
        self.dense_count = len(self.optimizer.parts[0].params)
        self.optimizer.build()

    def train_dataset(self, ctx) -> tf.data.Dataset:
        return self.source.train(ctx, self.runtime.num_replicas, self.replica_batch)

    def eval_records(self, ctx) -> tf.data.Dataset:
        return self.source.eval_records()

    def eval_parse(self, record: Any) -> dict[str, tf.Tensor]:
        return dict(record) if isinstance(record, dict) else self.source.parse(record)

    # ----------------------------------------------------------------------------------- computation
    def loss(self, batch: dict[str, tf.Tensor], seed: tf.Tensor) -> dict[str, LossTerm]:
        """0.2 x BCE summed over this replica's samples, divided by the global batch by the loop."""
        logits = self.model.logits(batch, seed=seed, groups=self.groups)
        return {"bce": LossTerm(self.model.loss_sum(logits, batch["label"]), tf.cast(tf.shape(logits)[0], tf.float32))}

    def process_gradients(self, grads: list[tf.Tensor], stats: dict[str, tf.Tensor]) -> list[tf.Tensor]:
        """The reference's clip_grad_norm_(1.0) over the dense gradients; the tables' are not clipped."""
        grads = training.clip_dense(grads, self.dense_count)
        if self.runtime.jit_compile:  # XLA: each table's gradient summed per row, in the table's static shape
            grads = grads[:self.dense_count] + [tf.convert_to_tensor(g) for g in grads[self.dense_count:]]
        return grads

    def eval_step(self, batch: dict[str, tf.Tensor], mask: tf.Tensor) -> dict[str, tf.Tensor]:
        """Each sample's logit and label (per-example outputs: the loop drops the padding)."""
        logits = self.model.logits(batch, seed=None, groups=self.groups)
        return {"logit": logits, "label": tf.cast(batch["label"], tf.float32)}

    def eval_finalize(self, state: dict[str, Any]) -> dict[str, float]:
        scores, labels = np.concatenate(state["logit"]), np.concatenate(state["label"])
        return {self.METRIC: exact_auc(scores, labels), "positives": float(np.mean(labels > 0.5))}

    # ---------------------------------------------------------------------------------------- logging
    def mllog_hparams(self) -> dict[str, Any]:
        """The 6.1.0 keys after global_batch_size, train_samples and eval_samples (which the run logs first, so
        the checker has the LR band when it reads the LR), in the checker's order."""
        o, rt, m, d = self.cfg.optimizer, self.runtime, self.cfg.model, self.cfg.data
        precision = PRECISION_NAMES[rt.precision]
        out = hparams.closed_hparams(o.base_learning_rate, o.warmup_steps, m.max_seq_len,
                                     {"linear": precision, "attn": precision, "comm": precision},
                                     self.replica_batch, rt.shards("vocab"), self.cfg.config_file or "unknown")
        if d.eval_every_samples:  # an open run's own cadence, as the fraction of the pass it is
            out["eval_every_data_pct"] = d.eval_every_samples / self.train_samples
        return out
