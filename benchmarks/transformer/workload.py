"""Transformer-big on WMT14 En-De as an MLPerf workload: Adam with the rsqrt schedule, label-smoothed
cross entropy over real tokens of packed rows, and beam-search BLEU over the whole eval set.

`global_batch_size` counts training rows of `data.row_length` tokens (packed rows hold several pairs),
as Google's v0.7 submissions count it; `train_samples` counts rows in one epoch. The eval decodes every
sentence on some replica (padded and masked); the chief turns the gathered hypotheses into BLEU n-gram
statistics, batch by batch, and the score from their sum is logged as a fraction.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf

from harness.benchmark_rules import ClosedRules
from harness.errors import HarnessError
from harness.train.workload import INDEX
from harness.mlperf import Logged
from harness.nn.optim import Adam, rsqrt_warmup_schedule
from harness.train.reference import ReferenceModel
from harness.train.workload import LossTerm, Workload

from benchmarks.transformer import bleu, config, data
from benchmarks.transformer.model import Transformer


VOCAB = "vocabulary size (data.vocab_file)"
# Transformer-big (6 + 6 layers) over the reference's shared 33,708-subword vocabulary.
REFERENCE_MODEL = ReferenceModel("Transformer-big", {
    "model.num_layers": 6, "model.hidden_size": 1024, "model.num_heads": 16, "model.filter_size": 4096,
    VOCAB: 33708, "model.layer_postprocess_dropout": 0.1, "model.attention_dropout": 0.1,
    "model.relu_dropout": 0.1, "model.label_smoothing": 0.1})


def closed_checks(cfg: Any) -> str | None:
    """Rules v0.7: an eval after every whole epoch (the cadence itself is fixed in CLOSED_RULES)."""
    s = cfg.schedule
    if s.eval_epochs:
        return "closed Transformer evaluates after every epoch: use schedule.eval_every_epochs=1, not eval_epochs"
    if s.max_epochs != int(s.max_epochs):
        return f"closed Transformer: schedule.max_epochs={s.max_epochs:g} must be whole epochs"
    return None


# Closed Transformer: an eval every epoch (rules v0.7), the reference's decode and Adam epsilon.
CLOSED_RULES = ClosedRules(
    fixed=(("schedule.eval_every_epochs", 1.0), ("schedule.eval_offset_epochs", 0.0), ("eval.beam_size", 4),
           ("eval.alpha", 0.6), ("eval.extra_decode_length", 50), ("optimizer.epsilon", 1e-9)),
    fixed_by="the reference fixes", checks=closed_checks)


class TransformerWorkload(Workload):
    NAME = "transformer"
    MLPERF_KEY = "transformer"
    # 0.6.0 has transformer too, but its parser reads only the legacy line format (MLPERF_RULES.md).
    RULESETS = ("0.7.0",)
    RULES = CLOSED_RULES
    SECTIONS = {"data": config.DataConfig, "model": config.ModelConfig, "optimizer": config.OptimizerConfig,
                "eval": config.EvalConfig}
    METRIC = "bleu"

    def __init__(self, cfg, runtime) -> None:
        super().__init__(cfg, runtime)
        self.source = data.make_source(cfg.data)
        self.model: Transformer | None = None
        self._stand_in: dict[str, int] = {}  # sizes a dry run takes from the config instead of the data

    @property
    def eval_cfg(self) -> config.EvalConfig:
        return self.cfg.section("eval")

    def reference_model(self) -> ReferenceModel:
        return REFERENCE_MODEL

    def model_settings(self) -> dict[str, Any]:
        """The config's values, and the vocabulary the model is built with (the data's)."""
        settings = super().model_settings()
        settings[VOCAB] = self.vocab_size
        return settings

    # ---------------------------------------------------------------------------------- sizes
    @property
    def vocab_size(self) -> int:
        return self._stand_in.get("vocab_size") or self.source.tokenizer.vocab_size

    @property
    def train_samples(self) -> int:
        return self.cfg.data.train_samples or self.source.counted_rows() or 0

    @property
    def eval_length(self) -> int:
        """Static length of eval inputs: the longest eval sentence, rounded up to a multiple of 8."""
        if "eval_length" in self._stand_in:
            return self._stand_in["eval_length"]
        longest = max(len(ids) for ids in self.source.eval_set[0])
        return int(math.ceil(longest / 8) * 8)

    @property
    def decode_length(self) -> int:
        return self.eval_length + self.eval_cfg.extra_decode_length

    def validate(self) -> None:
        c, m = self.cfg, self.cfg.model
        if c.submission.division == "closed":
            self.validate_closed()
        self.source.validate()
        if m.vocab_size and m.vocab_size != self.vocab_size:
            raise HarnessError(f"model.vocab_size={m.vocab_size} does not match the data's vocabulary of "
                               f"{self.vocab_size} entries ({c.data.vocab_file or c.data.source}); set it to "
                               f"{self.vocab_size} or 0")
        self.validate_model()
        sources, references = self.source.eval_set
        if len(sources) != c.data.eval_samples:
            raise HarnessError(f"the eval set has {len(sources)} sentences but data.eval_samples="
                               f"{c.data.eval_samples}")
        if not self.train_samples:
            raise HarnessError("data.train_samples is 0 and the source cannot count its rows")

    def validate_model(self) -> None:
        """The model's sizes against the rows, the eval inputs and the layout (shared with the dry run,
        where the vocabulary and the eval length stand in for the files)."""
        c, m = self.cfg, self.cfg.model
        if m.hidden_size % m.num_heads or m.hidden_size % 2:
            raise HarnessError(f"model.hidden_size={m.hidden_size} must be even and a multiple of "
                               f"model.num_heads={m.num_heads}")
        row = self.source.row_length
        if c.data.max_sequence_length > row:
            raise HarnessError(f"data.max_sequence_length={c.data.max_sequence_length} exceeds data.row_length={row}")
        if row > m.max_position:
            raise HarnessError(f"training rows of {row} tokens (data.row_length / max_sequence_length) exceed "
                               f"model.max_position={m.max_position}")
        if self.decode_length > m.max_position:
            raise HarnessError(f"decoding needs {self.decode_length} positions (eval inputs of {self.eval_length} "
                               f"tokens + eval.extra_decode_length) but model.max_position={m.max_position}")
        for what, size, dim in (("model.num_heads", m.num_heads, "heads"),
                                ("model.filter_size", m.filter_size, "ff"),
                                ("vocab size", self.vocab_size, "vocab")):
            self.runtime.check_divides(what, size, dim)

    # ----------------------------------------------------------------------------- model and inputs
    def build(self) -> None:
        c, o = self.cfg, self.cfg.optimizer
        self.model = Transformer(self.runtime, c.seed, c.model, self.vocab_size)
        schedule = rsqrt_warmup_schedule(o.base_learning_rate, o.warmup_steps, c.model.hidden_size)
        self.optimizer = Adam(self.runtime, self.runtime.variables(trainable=True), schedule,
                              beta_1=o.beta_1, beta_2=o.beta_2, epsilon=o.epsilon)
        self.optimizer.build()

    def train_dataset(self, ctx) -> tf.data.Dataset:
        return self.source.train_rows(ctx)

    def train_epoch_dataset(self, ctx) -> tf.data.Dataset:
        rows = self.source.epoch_rows(ctx)
        return super().train_epoch_dataset(ctx) if rows is None else rows

    def eval_records(self, ctx) -> tf.data.Dataset:
        sources = self.source.eval_set[0]
        padded = np.zeros([len(sources), self.eval_length], np.int32)
        for i, ids in enumerate(sources):
            padded[i, :len(ids)] = ids
        return tf.data.Dataset.from_tensor_slices(padded)

    def eval_parse(self, record: Any) -> dict[str, tf.Tensor]:
        return {"inputs": record}

    def dry_run_inputs(self) -> tuple[dict[str, tf.TensorSpec], dict[str, tf.TensorSpec], list[str]]:
        c, m = self.cfg, self.cfg.model
        # The synthetic language's vocabulary is built in memory from the config (no file to read).
        synthetic = c.data.source == "synthetic" and not m.vocab_size
        if not m.vocab_size and not synthetic:
            raise HarnessError("a dry run reads no vocabulary file: set model.vocab_size (33708 for the "
                               "reference's vocab.ende.32768)")
        vocab = self.source.tokenizer.vocab_size if synthetic else m.vocab_size
        length = int(math.ceil(c.data.max_sequence_length / 8) * 8)
        self._stand_in = {"vocab_size": vocab, "eval_length": length}
        self.validate_config()
        row = self.source.row_length
        read = "the synthetic language's" if synthetic else f"model.vocab_size={vocab} (no vocab file read)"
        notes = [f"vocabulary of {vocab}: {read}; eval inputs of {length} "
                 f"tokens (data.max_sequence_length rounded up to 8; a real run pads to its longest eval sentence)"]
        train = {k: tf.TensorSpec([row], tf.int32) for k in (
            "inputs", "targets", "inputs_segmentation", "targets_segmentation", "inputs_position",
            "targets_position")}
        return train, {"inputs": tf.TensorSpec([length], tf.int32)}, notes

    # ------------------------------------------------------------------------------- training
    def token_losses(self, batch: dict[str, tf.Tensor], seed: tf.Tensor | None) -> tuple[tf.Tensor, tf.Tensor]:
        """Label-smoothed cross entropy per target position and the real-token weights.

        As the reference: the target class gets 1 - eps, every other class eps / (V - 1), and the constant
        entropy of that distribution is subtracted, so a perfect prediction scores 0.
        """
        logits = self.model(batch, seed)
        logp = tf.nn.log_softmax(logits)
        targets = batch["targets"]
        eps, v = self.cfg.model.label_smoothing, float(self.vocab_size)
        confidence, low = 1.0 - eps, eps / (v - 1.0)
        # A one-hot product, not a gather: the vocab axis may be split over a mesh.
        picked = tf.reduce_sum(logp * tf.one_hot(targets, self.vocab_size, dtype=logp.dtype), -1)
        xent = -(confidence * picked + low * (tf.reduce_sum(logp, -1) - picked))
        xent -= -(confidence * math.log(confidence) + (v - 1.0) * low * math.log(low + 1e-20))
        weights = tf.cast(batch["targets_segmentation"] > 0, tf.float32)
        return xent, weights

    def loss(self, batch: dict[str, tf.Tensor], seed: tf.Tensor) -> dict[str, LossTerm]:
        dropout_on = any((self.cfg.model.layer_postprocess_dropout, self.cfg.model.attention_dropout,
                          self.cfg.model.relu_dropout))
        xent, weights = self.token_losses(batch, seed if dropout_on else None)
        return {"cross_entropy": LossTerm(tf.reduce_sum(xent * weights), tf.reduce_sum(weights))}

    # ----------------------------------------------------------------------------------- eval
    def eval_step(self, batch: dict[str, tf.Tensor], mask: tf.Tensor) -> dict[str, tf.Tensor]:
        e = self.eval_cfg
        return {"hypothesis": self.model.translate(batch["inputs"], e.beam_size, e.alpha, e.extra_decode_length,
                                                   self.decode_length)}

    def eval_accumulate(self, state: dict[str, Any], outputs: dict[str, np.ndarray]) -> None:
        """BLEU n-gram statistics of this batch's real sentences, added to the running sum."""
        references = self.source.eval_set[1]
        tokenizer = self.source.tokenizer
        hyps = [tokenizer.decode(data.cut_at_eos(ids)) for ids in outputs["hypothesis"]]
        refs = [references[int(i)] for i in outputs[INDEX]]
        state["bleu_stats"] = state.get("bleu_stats", 0.0) + bleu.bleu_stats(hyps, refs)
        state["sentences"] = state.get("sentences", 0) + len(hyps)

    def eval_finalize(self, state: dict[str, Any]) -> dict[str, float]:
        return {self.METRIC: bleu.bleu_from_stats(state["bleu_stats"])}

    # -------------------------------------------------------------------------------- logging
    def mllog_hparams(self) -> dict[str, Any]:
        o = self.cfg.optimizer
        return {
            "opt_name": o.name,
            "opt_base_learning_rate": o.base_learning_rate,
            "opt_learning_rate_warmup_steps": o.warmup_steps,
            "opt_adam_beta_1": o.beta_1,
            "opt_adam_beta_2": o.beta_2,
            "opt_adam_epsilon": o.epsilon,
            "max_sequence_length": Logged(self.cfg.data.max_sequence_length, {"method": "discard"}),
        }
