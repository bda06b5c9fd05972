"""BERT-large phase-2 pretraining as an MLPerf workload: LAMB, masked-LM + next-sentence loss, masked-LM
accuracy over the whole eval set, evaluation cadence and epoch numbers counted in training samples."""
from __future__ import annotations

import math
import os

from typing import Any

import tensorflow as tf

from harness import benchmark_rules as rules
from harness.errors import HarnessError
from harness.nn import hf_checkpoint
from harness.nn.optim import LAMB
from harness.train.reference import ReferenceModel
from harness.train.workload import EvalSchedule, LossTerm, Workload, sample_schedule

from benchmarks.bert import checkpoint, config, cost, data, hf_names, tensor_names
from benchmarks.bert.model import Bert


def lamb_schedule(base_lr: float, end_lr: float, warmup_steps: int, start_warmup_step: int,
                  train_steps: int, power: float):
    """The reference's rate: polynomial decay over `train_steps` from step 0, and for the first
    `warmup_steps` steps counted from `start_warmup_step`, a linear ramp from 0 instead."""
    def lr(step: tf.Tensor) -> tf.Tensor:
        step = tf.cast(step, tf.float32)
        frac = tf.minimum(step, float(train_steps)) / float(max(train_steps, 1))
        decayed = (base_lr - end_lr) * tf.pow(1.0 - frac, power) + end_lr
        if not warmup_steps:
            return decayed
        warm_step = step - float(start_warmup_step)
        warm = base_lr * warm_step / float(warmup_steps)
        return tf.where(warm_step < float(warmup_steps), warm, decayed)
    return lr


# BERT-large (uncased, 30522 wordpieces) on the rules' phase-2 data: 512-token sequences with at most 76
# masked-LM predictions, dropout 0.1 as the reference.
REFERENCE_MODEL = ReferenceModel("BERT-large", {
    "model.num_layers": 24, "model.hidden_size": 1024, "model.num_heads": 16, "model.ff_size": 4096,
    "model.vocab_size": 30522, "model.max_position": 512, "model.type_vocab_size": 2,
    "model.hidden_dropout": 0.1, "model.attention_dropout": 0.1,
    "data.seq_length": 512, "data.max_predictions": 76})


class BertWorkload(Workload):
    NAME = "bert"
    MLPERF_KEY = "bert"
    RULESETS = ("0.7.0", "1.0.0", "1.1.0", "2.0.0", "2.1.0", "3.0.0", "3.1.0", "4.0.0", "4.1.0", "5.0.0")
    RULESET_NOTE = ("MLPerf Training 5.1 retired BERT: the 5.1.0 checker's closed and open common rules reject "
                    "submission_benchmark 'bert' (mlperf-logging 4.1.68)")
    SECTIONS = {"data": config.DataConfig, "model": config.ModelConfig, "optimizer": config.OptimizerConfig}
    HF_FORMAT = hf_checkpoint.Format(hf_names.layout, hf_names.config_problems,
                                     lambda cfg, dtype: hf_names.hf_config(cfg.model, dtype))
    METRIC = "masked-LM accuracy"
    SPLIT_DIMS = {"model.num_heads": "heads", "model.ff_size": "ff", "model.vocab_size": "vocab"}

    def __init__(self, cfg, runtime) -> None:
        super().__init__(cfg, runtime)
        self.source = data.make_source(cfg.data, cfg.model.vocab_size)
        self.model: Bert | None = None

    def reference_model(self) -> ReferenceModel:
        return REFERENCE_MODEL

    # ----------------------------------------------------------------------------- schedule
    @property
    def eval_every_samples(self) -> int:
        return self.cfg.data.eval_every_samples or rules.bert_eval_every(self.cfg.schedule.global_batch_size)

    def total_steps(self) -> int:
        s = self.cfg.schedule
        return max(1, math.ceil(s.max_epochs * self.train_samples / s.global_batch_size - 1e-9))

    def train_steps(self) -> int:
        return self.cfg.optimizer.train_steps or self.total_steps()

    def eval_cadence_samples(self) -> tuple[int, int]:
        """(first eval, spacing) in samples: benchmarks/bert/cost.py `eval_cadence`, which `plan` reads too."""
        rule = cost.eval_cadence(self.cfg, self.cfg.schedule.global_batch_size)
        return int(rule.first), int(rule.every)

    def eval_schedule(self) -> EvalSchedule:
        """An eval at the first step boundary at or past each cadence mark, and at the budget; positions
        are the samples trained."""
        gbs = self.cfg.schedule.global_batch_size
        first, every = self.eval_cadence_samples()
        budget = self.total_steps() * gbs
        return sample_schedule(list(range(first, budget, every)) + [budget], self.train_samples, gbs, None)

    def validate_closed(self) -> None:
        """Closed BERT evaluates at the rules' cadence and its budget ends on it."""
        if self.cfg.data.eval_every_samples:
            raise HarnessError(f"closed BERT evaluates at the rules' cadence: set data.eval_every_samples=0 "
                               f"(not {self.cfg.data.eval_every_samples}); or set submission.division=open")
        gbs, total = self.cfg.schedule.global_batch_size, self.total_steps()
        first, every = self.eval_cadence_samples()
        k = max(0, math.ceil((total * gbs - first) / every))
        marks = [first + j * every for j in range(max(0, k - 1), k + 2)]
        if not any(math.ceil(m / gbs) == total for m in marks):
            ends = [math.ceil(m / gbs) * gbs for m in marks]
            below = [e for e in ends if e < total * gbs][-1:]
            above = [e for e in ends if e > total * gbs][0]
            raise HarnessError(f"closed BERT: the budget of {total * gbs} samples (schedule.max_epochs) is off "
                               f"the eval cadence (first {first}, every {every} samples); end it at "
                               f"{' or '.join(str(e) for e in below + [above])} samples; or set "
                               f"submission.division=open")

    def validate(self) -> None:
        m = self.cfg.model
        self.validate_config()
        if m.init_checkpoint and not tf.io.gfile.glob(m.init_checkpoint + "*"):
            raise HarnessError(f"model.init_checkpoint {m.init_checkpoint} does not exist")
        if m.init_checkpoint and os.path.isdir(m.init_checkpoint):
            hf_checkpoint.check_config(m.init_checkpoint, self.HF_FORMAT, m)
        self.source.validate()

    def validate_model(self) -> None:
        m = self.cfg.model
        if m.hidden_size % m.num_heads:
            raise HarnessError(f"model.hidden_size={m.hidden_size} is not a multiple of model.num_heads={m.num_heads}")
        if self.cfg.data.seq_length > m.max_position:
            raise HarnessError(f"data.seq_length={self.cfg.data.seq_length} exceeds "
                               f"model.max_position={m.max_position}")

    # --------------------------------------------------------------------------- model and inputs
    def build(self) -> None:
        c = self.cfg
        self.model = Bert(self.runtime, c.seed, c.model)
        if c.model.init_checkpoint and os.path.isdir(c.model.init_checkpoint):
            hf_checkpoint.load_into(self.runtime, c.model.init_checkpoint, self.HF_FORMAT, c.model)
        elif c.model.init_checkpoint:
            checkpoint.load(self.runtime, c.model.hidden_size, c.model.init_checkpoint)
        o = c.optimizer
        schedule = lamb_schedule(o.base_learning_rate, o.end_learning_rate, o.warmup_steps, o.start_warmup_step,
                                 self.train_steps(), o.poly_power)
        self.optimizer = LAMB(self.runtime, self.runtime.variables(trainable=True), schedule,
                              weight_decay=o.weight_decay, exclude_from_decay=o.exclude_from_decay,
                              beta_1=o.beta_1, beta_2=o.beta_2, epsilon=o.epsilon)
        self.optimizer.build()

    def train_dataset(self, ctx) -> tf.data.Dataset:
        return self.source.train(ctx)

    def train_epoch_dataset(self, ctx) -> tf.data.Dataset:
        return self.source.train(ctx, repeat=False)

    def eval_records(self, ctx) -> tf.data.Dataset:
        return self.source.eval_records()

    def eval_parse(self, record: Any) -> dict[str, tf.Tensor]:
        return self.source.eval_parse(record)

    def dry_run_inputs(self) -> tuple[dict[str, tf.TensorSpec], dict[str, tf.TensorSpec], list[str]]:
        m, d = self.cfg.model, self.cfg.data
        self.validate_config()
        notes = []
        if m.init_checkpoint:
            notes.append(f"model.init_checkpoint {m.init_checkpoint} not read: weights from the initializers")
            m.init_checkpoint = ""  # the dry run's own config: build() then reads no file
        seq, preds = [d.seq_length], [d.max_predictions]
        example = {"input_ids": tf.TensorSpec(seq, tf.int32), "input_mask": tf.TensorSpec(seq, tf.int32),
                   "segment_ids": tf.TensorSpec(seq, tf.int32),
                   "masked_lm_positions": tf.TensorSpec(preds, tf.int32),
                   "masked_lm_ids": tf.TensorSpec(preds, tf.int32),
                   "masked_lm_weights": tf.TensorSpec(preds, tf.float32),
                   "next_sentence_labels": tf.TensorSpec([], tf.int32)}
        return example, dict(example), notes

    # ------------------------------------------------------------------------------ computation
    def losses(self, batch: dict[str, tf.Tensor], training: bool, seed: tf.Tensor | None = None):
        """Masked-LM cross-entropy summed with weights, the weight sum, and next-sentence CE per sequence."""
        mlm, nsp = self.model(batch, training=training, seed=seed)
        ce = tf.nn.sparse_softmax_cross_entropy_with_logits(batch["masked_lm_ids"], mlm)
        w = batch["masked_lm_weights"]
        nsp_ce = tf.nn.sparse_softmax_cross_entropy_with_logits(batch["next_sentence_labels"], nsp)
        return tf.reduce_sum(ce * w), tf.reduce_sum(w), nsp_ce, mlm

    def loss(self, batch: dict[str, tf.Tensor], seed: tf.Tensor) -> dict[str, LossTerm]:
        """Masked-LM cross-entropy over the weighted predictions (the reference adds 1e-5 to the weight
        sum) plus next-sentence cross-entropy over sequences."""
        mlm_sum, w_sum, nsp_ce, _ = self.losses(batch, True, seed)
        return {"masked_lm": LossTerm(mlm_sum, w_sum, epsilon=1e-5),
                "next_sentence": LossTerm(tf.reduce_sum(nsp_ce), tf.shape(nsp_ce)[0])}

    def process_gradients(self, grads: list[tf.Tensor], stats: dict[str, tf.Tensor]) -> list[tf.Tensor]:
        if self.cfg.optimizer.clip_norm:
            grads, _ = tf.clip_by_global_norm(grads, self.cfg.optimizer.clip_norm)
        return grads

    def eval_step(self, batch: dict[str, tf.Tensor], mask: tf.Tensor) -> dict[str, tf.Tensor]:
        _, _, _, mlm = self.losses(batch, False)
        predicted = tf.argmax(mlm, -1, output_type=tf.int32)
        w = batch["masked_lm_weights"] * mask[:, None]
        correct = tf.cast(tf.equal(predicted, batch["masked_lm_ids"]), tf.float32) * w
        return {"correct": tf.reduce_sum(correct), "weight": tf.reduce_sum(w)}

    def eval_finalize(self, state: dict[str, float]) -> dict[str, float]:
        return {self.METRIC: state["correct"] / max(state["weight"], 1e-9)}

    # ---------------------------------------------------------------------------------- logging
    def mllog_hparams(self) -> dict[str, Any]:
        """Every ruleset's closed keys (0.7-2.0 name the epsilon opt_epsilon, 2.1+ opt_lamb_epsilon)."""
        o = self.cfg.optimizer
        return {
            "opt_name": "lamb",
            "opt_base_learning_rate": o.base_learning_rate,
            "opt_epsilon": o.epsilon,
            "opt_lamb_epsilon": o.epsilon,
            "opt_learning_rate_training_steps": self.train_steps(),
            "opt_learning_rate_warmup_steps": o.warmup_steps,
            "num_warmup_steps": o.warmup_steps,
            "start_warmup_step": o.start_warmup_step,
            "opt_lamb_beta_1": o.beta_1,
            "opt_lamb_beta_2": o.beta_2,
            "opt_lamb_weight_decay_rate": o.weight_decay,
            "opt_lamb_learning_rate_decay_poly_power": o.poly_power,
            "max_sequence_length": self.cfg.data.seq_length,
            "eval_every_samples": self.eval_every_samples,
        }

    def weights_initialization_map(self) -> dict[str, str]:
        return tensor_names.weights_initialization_map(self.cfg)
