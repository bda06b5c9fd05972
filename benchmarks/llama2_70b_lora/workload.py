"""Llama 2 70B LoRA fine-tuning (MLPerf llama2_70b_lora, rulesets 4.0.0-6.1.0: one closed checker file, the
target eval loss <= 0.925): the decoder LMs' workload and stack (benchmarks/lm/) with the Llama block and
LoRA adapters on every layer's fused q/k/v and output projections (benchmarks/lm/attention.py `Lora`).

The base starts from a Hugging Face checkpoint (`model.init_checkpoint`, fused or separate q/k/v) and is
frozen: its variables are created non-trainable (Runtime.frozen), so the loop takes no gradient of them,
AdamW keeps no slots for them and nothing reduces them; FSDP still splits them and gathers them for use.
Rows come pre-packed (input_ids, labels with -100 where not scored); the model reads the whole row and the
logits at position j score labels[j + 1]. Training loss and eval metric are the reference's: the mean
cross-entropy over each row's scored tokens, then the mean over rows (not over tokens). Evals every
ceil(384 / GBS) * GBS samples, the first floor(0.125 * GBS + 2) skipped (not run, not logged).
"""
from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from harness.errors import HarnessError
from harness.nn import cross_entropy, hf_checkpoint
from harness.nn.cross_entropy import token_cross_entropy
from harness.nn.hf_checkpoint import Format
from harness.train.reference import ReferenceModel, lookup
from harness.train.workload import EvalSchedule, LossTerm, Workload, sample_schedule

from benchmarks.llama2_70b_lora import config, cost, peft_format
from benchmarks.llama2_70b_lora.data import LoraData
from benchmarks.llama2_70b_lora.data_config import LoraDataConfig
from benchmarks.lm import hf_names
from benchmarks.lm.attention import Lora
from benchmarks.lm.llama import LLAMA_SPLIT_DIMS, Llama
from benchmarks.lm.workload import PRECISION_NAMES, DecoderLMWorkload

IGNORE = -100
CLOSED_SEQ_LENGTH, CLOSED_TRAIN_SAMPLES, CLOSED_EVAL_SAMPLES = 8192, 3901, 173
# What the rules fix (config key, value); the checker reads only lora_rank's value.
CLOSED_FIXED = (("model.lora_rank", 16), ("model.lora_alpha", 32.0), ("model.lora_dropout", 0.1),
                ("optimizer.beta_1", 0.9), ("optimizer.beta_2", 0.999), ("optimizer.epsilon", 1e-8),
                ("optimizer.weight_decay", 1e-4), ("optimizer.clip_norm", 0.3), ("optimizer.warmup_steps", 0),
                ("optimizer.end_learning_rate", 0.0))

# Llama 2 70B as the MLPerf reference fine-tunes it (regisss/llama2-70b-fused-qkv-mlperf).
REFERENCE_MODEL = ReferenceModel("Llama 2 70B", {
    "model.vocab_size": 32000, "model.hidden_size": 8192, "model.num_layers": 80, "model.num_heads": 64,
    "model.num_kv_heads": 8, "model.head_dim": 128, "model.ffn_hidden": 28672, "model.rope_base": 10000,
    "model.rope_scaling_factor": 0.0, "model.norm_epsilon": 1e-5, "model.lora_rank": 16})


def row_mean_losses(xent: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Each row's mean cross-entropy over its scored positions [b] and whether it has any [b] (float 0/1).
    `xent` [b, s]: position j's loss against labels[j + 1] (the last position's is not used)."""
    scored = tf.cast(tf.not_equal(labels[:, 1:], IGNORE), tf.float32)
    tokens = tf.reduce_sum(scored, 1)
    has = tf.cast(tokens > 0, tf.float32)
    return tf.reduce_sum(xent[:, :-1] * scored, 1) / tf.maximum(tokens, 1.0), has


class LoraWorkload(DecoderLMWorkload):
    NAME = "llama2_70b_lora"
    MLPERF_KEY = "llama2_70b_lora"
    RULESETS = ("4.0.0", "4.1.0", "5.0.0", "5.1.0", "6.0.0", "6.1.0")
    RULESET_NOTE = "llama2_70b_lora is a benchmark from MLPerf Training 4.0 on"
    METRIC = "eval loss"
    SECTIONS = {"data": LoraDataConfig, "model": config.ModelConfig, "optimizer": config.OptimizerConfig}
    REFERENCE_MODEL = REFERENCE_MODEL
    # The dry run compiles 2 and 3 layers, SwiGLU widths of 1024 and 2048 and vocabularies of 512 and 1024
    # at full hidden size and extrapolates (harness.dryrun.extrapolate.linear_stand_in): two full 70B layers' weights
    # (1.7B parameters) are more than this host holds while they are split onto the mesh. Not 1 and 2: with
    # one layer XLA schedules its recompute otherwise, so the second layer's step looked like 514 MiB kept
    # per layer where the third adds 33 (its bfloat16 input; hidden 8192, rows of 2048, measured).
    DRY_RUN_LINEAR = {"model.num_layers": (2, 3), "model.ffn_hidden": (1024, 2048), "model.vocab_size": (512, 1024)}
    DRY_RUN_PAIRS = (("model.num_layers", "model.ffn_hidden"),)
    SPLIT_DIMS = {**DecoderLMWorkload.SPLIT_DIMS, **LLAMA_SPLIT_DIMS}
    HF_FORMAT = Format(hf_names.llama_layout, hf_names.llama_config_problems,
                       lambda cfg, dtype: hf_names.llama_config(cfg.model, cfg.data.seq_length, dtype))
    PEFT_FORMAT = peft_format  # export writes the adapters as PEFT does (harness/export/weights.py)

    def __init__(self, cfg, runtime) -> None:
        Workload.__init__(self, cfg, runtime)
        self.source = LoraData(cfg.data, cfg.data.seq_length, cfg.model.vocab_size)
        self.model: Any = None
        self.loss_budget_scale = 1.0
        m = cfg.model
        self.lora = Lora(m.lora_rank, m.lora_alpha, m.lora_dropout)

    @property
    def data_source(self) -> str:
        return self.cfg.data.source

    # ------------------------------------------------------------------------------------ schedule
    @property
    def eval_every_samples(self) -> int:
        return self.cfg.data.eval_every_samples or cost.eval_every(self.cfg.schedule.global_batch_size)

    @property
    def eval_skip(self) -> int:
        d = self.cfg.data
        return cost.eval_skip(self.cfg.schedule.global_batch_size) if d.eval_skip < 0 else d.eval_skip

    def eval_schedule(self) -> EvalSchedule:
        """Evals every `eval_every_samples` after the skipped ones, up to max_steps (and at max_steps)."""
        gbs = self.cfg.schedule.global_batch_size
        budget = self.cfg.optimizer.max_steps * gbs
        every = self.eval_every_samples
        marks = [m for m in range(every * (self.eval_skip + 1), budget, every)] + [budget]
        return sample_schedule(marks, self.train_samples, gbs, None)

    # ---------------------------------------------------------------------------------- validation
    def validate(self) -> None:
        self.validate_config()
        self.source.validate(closed=self.cfg.submission.division == "closed")
        if self.cfg.model.init_checkpoint:
            hf_checkpoint.check_config(self.cfg.model.init_checkpoint, self.HF_FORMAT, self.cfg.model)

    def validate_config(self) -> None:
        c, m, d = self.cfg, self.cfg.model, self.cfg.data
        fix = "; or set submission.division=open"
        if c.submission.division == "closed":
            if d.source != "parquet":
                raise HarnessError(f"closed {self.NAME} fine-tunes on the reference's GovReport parquet files: set "
                                   f"data.source=parquet (got {d.source}){fix}")
            if d.eval_every_samples or d.eval_skip >= 0:
                raise HarnessError(f"closed {self.NAME} evaluates every ceil(384/gbs)*gbs samples after skipping "
                                   f"floor(0.125*gbs+2) evals: set data.eval_every_samples=0 and "
                                   f"data.eval_skip=-1{fix}")
            if d.seq_length != CLOSED_SEQ_LENGTH or d.eval_samples != CLOSED_EVAL_SAMPLES or \
                    d.train_samples not in (0, CLOSED_TRAIN_SAMPLES):
                raise HarnessError(f"closed {self.NAME} trains on {CLOSED_TRAIN_SAMPLES} rows of "
                                   f"{CLOSED_SEQ_LENGTH} tokens and scores {CLOSED_EVAL_SAMPLES} eval rows (got "
                                   f"data.seq_length={d.seq_length}, data.train_samples={d.train_samples}, "
                                   f"data.eval_samples={d.eval_samples}){fix}")
            for key, want in CLOSED_FIXED:
                if not math.isclose(lookup(c, key), want, rel_tol=1e-9, abs_tol=0.0):
                    raise HarnessError(f"closed {self.NAME}: the rules fix {key}={want:g} (got "
                                       f"{lookup(c, key):g}){fix}")
            if not m.init_checkpoint:
                raise HarnessError(f"closed {self.NAME} fine-tunes the pretrained Llama 2 70B: set "
                                   f"model.init_checkpoint to its Hugging Face directory{fix}")
        if m.num_heads % m.num_kv_heads:
            raise HarnessError(f"model.num_heads={m.num_heads} is not a multiple of model.num_kv_heads="
                               f"{m.num_kv_heads}")
        if m.head_dim % 2:
            raise HarnessError(f"model.head_dim={m.head_dim} must be even (RoPE turns pairs)")
        m.validate()
        for key, dim in self.SPLIT_DIMS.items():
            self.runtime.check_divides(key, lookup(c, key), dim)

    def dry_run_inputs(self) -> tuple[dict[str, tf.TensorSpec], dict[str, tf.TensorSpec], list[str]]:
        self.validate_config()
        d, notes = self.cfg.data, []
        if d.source != "synthetic" and not d.train_samples:
            d.train_samples = CLOSED_TRAIN_SAMPLES
            notes.append(f"data.train_samples stood in as {CLOSED_TRAIN_SAMPLES} rows (the parquet files are not read)")
        if self.cfg.model.init_checkpoint:
            notes.append(f"model.init_checkpoint {self.cfg.model.init_checkpoint} not read: base weights from the "
                         f"initializers")
            self.cfg.model.init_checkpoint = ""
        if self.cfg.model.frozen_dtype == "bfloat16":
            notes.append("frozen bfloat16 base: XLA:CPU computes a bfloat16 dot in float32, so its plan holds float32 "
                         "copies of the weights of the layer it computes (made per layer, after the layer's input; "
                         "none held across layers), where a GPU or TPU reads them in bfloat16: the activation "
                         "estimate is high by up to one layer's weights in float32 (kept, not subtracted)")
        row = {"input_ids": tf.TensorSpec([d.seq_length], tf.int32), "labels": tf.TensorSpec([d.seq_length], tf.int32)}
        return row, dict(row), notes

    # ----------------------------------------------------------------------------- model and inputs
    def frozen_dtype(self, path: str) -> tf.DType | None:
        """The storage dtype of a frozen base weight (norm weights float32), None for an adapter."""
        if "/lora_" in path:
            return None
        if "norm" in path.rsplit("/", 2)[-2]:
            return tf.float32
        return tf.bfloat16 if self.cfg.model.frozen_dtype == "bfloat16" else tf.float32

    def make_model(self) -> Llama:
        with self.runtime.frozen(self.frozen_dtype):
            return Llama(self.runtime, "llama", self.cfg.seed, self.cfg.model, self.cfg.data.seq_length,
                         lora=self.lora)

    def eval_parse(self, record: Any) -> dict[str, tf.Tensor]:
        return record

    # ------------------------------------------------------------------------------- computation
    def row_losses(self, batch: dict[str, tf.Tensor], seed: tf.Tensor | None) -> tuple[tf.Tensor, tf.Tensor]:
        """(each row's mean cross-entropy over its scored tokens [b], 1 where the row has any [b]); `seed`: the
        adapters' dropout seed (None: no dropout)."""
        ids, labels = batch["input_ids"], batch["labels"]
        with self.lora.seeded(seed):  # a recomputed layer keeps its own (decoder `remat`)
            hidden, _ = self.model(ids)
        targets = tf.concat([tf.maximum(labels[:, 1:], 0), tf.zeros_like(labels[:, :1])], 1)
        scale = self.loss_budget_scale
        xent = token_cross_entropy(self.runtime, hidden, self.model.head(), targets,
                                   budget=max(1, int(cross_entropy.BLOCK_ELEMENTS * scale)),
                                   keep=int(cross_entropy.KEEP_ELEMENTS * scale))
        return row_mean_losses(xent, labels)

    def loss(self, batch: dict[str, tf.Tensor], seed: tf.Tensor) -> dict[str, LossTerm]:
        """The mean over rows of each row's mean cross-entropy (rows without a scored token count nothing)."""
        rows, has = self.row_losses(batch, seed)
        return {"cross_entropy": LossTerm(tf.reduce_sum(rows * has), tf.reduce_sum(has))}

    def eval_step(self, batch: dict[str, tf.Tensor], mask: tf.Tensor) -> dict[str, tf.Tensor]:
        rows, has = self.row_losses(batch, None)
        w = has * mask
        return {"row_loss": tf.reduce_sum(rows * w), "rows": tf.reduce_sum(w)}

    def eval_finalize(self, state: dict[str, float]) -> dict[str, float]:
        return {self.METRIC: state["row_loss"] / max(state["rows"], 1e-9)}

    # ------------------------------------------------------------------------------------ logging
    def mllog_hparams(self) -> dict[str, Any]:
        """The closed checker's keys (each once), informative ones, and 6.1.0's disclosure keys with values
        legal in 6.0.0 too."""
        o, m, rt = self.cfg.optimizer, self.cfg.model, self.runtime
        precision = PRECISION_NAMES[rt.precision]
        linear = "bfloat16" if m.frozen_dtype == "bfloat16" else precision
        return {
            "opt_base_learning_rate": o.base_learning_rate,
            "opt_learning_rate_training_steps": o.max_steps,
            "opt_learning_rate_warmup_factor": o.warmup_steps / o.max_steps,
            "opt_adamw_beta_1": o.beta_1,
            "opt_adamw_beta_2": o.beta_2,
            "opt_adamw_epsilon": o.epsilon,
            "opt_adamw_weight_decay": o.weight_decay,
            "opt_gradient_clip_norm": o.clip_norm,
            "lora_rank": m.lora_rank,
            "lora_alpha": m.lora_alpha,
            "max_sequence_length": self.cfg.data.seq_length,
            "target_accuracy": self.target,
            "lowest_numerical_precision_in_linear": linear,
            "lowest_numerical_precision_in_attn": precision,
            "lowest_numerical_precision_in_comm": precision,
            "tensor_parallelism": max(rt.shards(d) for d in ("heads", "ff", "vocab")),
            "pipeline_parallelism": 1,
            "context_parallelism": 1,
            "expert_parallelism": 1,
            "micro_batch_size": self.replica_batch,
            "config_filename": self.cfg.config_file or "unknown",
        }
