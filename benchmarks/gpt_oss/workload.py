"""GPT-OSS 20B pretraining (MLPerf gpt_oss_20b, rulesets 6.0.0 and 6.1.0) as a workload.

AdamW with a cosine-with-linear-warmup schedule over `max_steps`, next-token cross-entropy over every
position whose input is not EOD (the reference's `eod_mask_loss`), plus the optional router losses.
The quality metric is the token-weighted mean cross-entropy in nats over the fixed eval rows (Megatron's
`lm loss`, numerators and denominators summed over the whole eval set before dividing): LOWER is better,
target 3.34. Evals fall every ceil(12288 / gbs) * gbs samples in the closed division; positions are
training samples. `global_batch_size` counts rows of `data.seq_length` tokens.
"""
from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from harness.errors import HarnessError
from harness.nn.optim import AdamW, cosine_warmup_schedule
from harness.train.reference import ReferenceModel
from harness.train.workload import EvalSchedule, LossTerm, Workload, sample_schedule

from benchmarks.gpt_oss import config
from benchmarks.lm import data
from benchmarks.gpt_oss.model import GptOss

CLOSED_SEQ_LENGTH, CLOSED_EVAL_SAMPLES = 8192, 1024
PRECISION_NAMES = {"float32": "fp32", "bfloat16": "bfloat16"}
# GPT-OSS 20B as the MLPerf reference builds it (specs/moe.md): dropless top-4 of 32 SwiGLU experts, the
# router options beside the reference off.
REFERENCE_MODEL = ReferenceModel("GPT-OSS 20B", {
    "model.vocab_size": 128256, "model.hidden_size": 2880, "model.num_layers": 24, "model.num_heads": 64,
    "model.num_kv_heads": 8, "model.head_dim": 64, "model.rope_base": 150000, "model.sliding_window": 128,
    "model.num_experts": 32, "model.experts_per_token": 4, "model.expert_hidden": 2880,
    "model.capacity_factor": 0.0, "model.load_balancing_coef": 0.0, "model.router_z_loss_coef": 0.0})


class GptOssWorkload(Workload):
    NAME = "gpt_oss_20b"
    MLPERF_KEY = "gpt_oss_20b"
    RULESETS = ("6.0.0", "6.1.0")
    RULESET_NOTE = "gpt_oss_20b is a benchmark from MLPerf Training 6.0 on"
    SECTIONS = {"data": config.DataConfig, "model": config.ModelConfig, "optimizer": config.OptimizerConfig}
    METRIC = "log perplexity"
    HIGHER_IS_BETTER = False

    def __init__(self, cfg, runtime) -> None:
        super().__init__(cfg, runtime)
        self.source = data.Source(cfg.data, cfg.model.vocab_size)
        self.model: GptOss | None = None

    def closed_target(self, ruleset: str) -> float:
        return 3.34

    @property
    def train_samples(self) -> int:
        return self.source.train_samples

    @property
    def data_source(self) -> str:
        return self.cfg.data.source

    # ------------------------------------------------------------------------------------ schedule
    @property
    def eval_every_samples(self) -> int:
        return self.cfg.data.eval_every_samples or data.mlperf_eval_every(self.cfg.schedule.global_batch_size)

    def eval_schedule(self) -> EvalSchedule:
        """An eval every `eval_every_samples` up to the budget (and at the budget)."""
        gbs = self.cfg.schedule.global_batch_size
        budget = max(1, math.ceil(self.cfg.schedule.max_epochs * self.train_samples / gbs - 1e-9)) * gbs
        every = self.eval_every_samples
        marks = list(range(every, budget, every)) + [budget]
        return sample_schedule(marks, self.train_samples, gbs, None)

    def reference_model(self) -> ReferenceModel:
        return REFERENCE_MODEL

    def validate(self) -> None:
        self.validate_config()
        self.source.validate()

    def dry_run_inputs(self) -> tuple[dict[str, tf.TensorSpec], dict[str, tf.TensorSpec], list[str]]:
        self.validate_config()
        d, notes = self.cfg.data, []
        if d.source != "synthetic" and not d.train_samples:
            d.train_samples = self.cfg.optimizer.max_steps * self.cfg.schedule.global_batch_size
            notes.append(f"data.train_samples stood in as optimizer.max_steps x global batch = {d.train_samples} "
                         f"rows (the index files are not read)")
        row = {"tokens": tf.TensorSpec([d.seq_length + 1], tf.int32)}
        return row, dict(row), notes

    def validate_config(self) -> None:
        """What `validate` checks of the config alone (no data file is read)."""
        c, m, d = self.cfg, self.cfg.model, self.cfg.data
        fix = "; or set submission.division=open"
        if c.submission.division == "closed":
            if d.eval_every_samples:
                raise HarnessError(f"closed gpt_oss_20b evaluates every ceil(12288/gbs)*gbs samples: set "
                                   f"data.eval_every_samples=0{fix}")
            if d.seq_length != CLOSED_SEQ_LENGTH or d.eval_samples != CLOSED_EVAL_SAMPLES:
                raise HarnessError(f"closed gpt_oss_20b trains on rows of {CLOSED_SEQ_LENGTH} tokens and scores "
                                   f"{CLOSED_EVAL_SAMPLES} eval rows (got data.seq_length={d.seq_length}, "
                                   f"data.eval_samples={d.eval_samples}){fix}")
        if m.num_heads % m.num_kv_heads:
            raise HarnessError(f"model.num_heads={m.num_heads} is not a multiple of model.num_kv_heads="
                               f"{m.num_kv_heads}")
        if m.head_dim % 2:
            raise HarnessError(f"model.head_dim={m.head_dim} must be even (RoPE turns pairs)")
        if m.experts_per_token > m.num_experts:
            raise HarnessError(f"model.experts_per_token={m.experts_per_token} exceeds model.num_experts="
                               f"{m.num_experts}")
        seq = d.seq_length
        group = min(m.moe_group_size, seq)
        if seq % group:
            raise HarnessError(f"data.seq_length={seq} is not a multiple of model.moe_group_size={group}")
        for window in {m.sliding_window, m.full_attention_span or seq}:
            blk = seq if window >= seq else min(m.attention_block, seq)
            if seq % blk:
                raise HarnessError(f"data.seq_length={seq} is not a multiple of model.attention_block={blk}")
        if m.full_attention_span and m.full_attention_span < seq:
            if not m.document_attention:
                raise HarnessError(f"model.full_attention_span={m.full_attention_span} is shorter than a row: "
                                   f"full attention is only exact within documents, so it needs "
                                   f"model.document_attention=true")
            if d.source != "synthetic" or d.synthetic_doc_max > m.full_attention_span:
                longest = d.synthetic_doc_max if d.source == "synthetic" else "unbounded (indexed data)"
                raise HarnessError(f"model.full_attention_span={m.full_attention_span} must cover the longest "
                                   f"document ({longest}); set it to 0 (the whole row) or at least that")
        for what, size, dim in (("model.num_kv_heads", m.num_kv_heads, "heads"),
                                ("model.num_experts", m.num_experts, "experts"),
                                ("model.expert_hidden", m.expert_hidden, "ff"),
                                ("model.vocab_size", m.vocab_size, "vocab")):
            self.runtime.check_divides(what, size, dim)

    # ----------------------------------------------------------------------------- model and inputs
    def build(self) -> None:
        c, o = self.cfg, self.cfg.optimizer
        self.model = GptOss(self.runtime, c.seed, c.model, c.data.seq_length, c.data.eod_id)
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

    def eval_records(self, ctx) -> tf.data.Dataset:
        return self.source.eval_records()

    def eval_parse(self, record: Any) -> dict[str, tf.Tensor]:
        return {"tokens": record}

    # ------------------------------------------------------------------------------- computation
    def token_losses(self, tokens: tf.Tensor):
        """Cross-entropy per position [b, s], its weights (0 where the input is EOD) and the routings."""
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        logits, routings = self.model(inputs)
        # A one-hot product, not a gather: the vocabulary may be split over a mesh.
        picked = tf.reduce_sum(logits * tf.one_hot(targets, self.cfg.model.vocab_size, dtype=logits.dtype), -1)
        xent = tf.reduce_logsumexp(logits, -1) - picked
        weights = tf.cast(tf.not_equal(inputs, self.cfg.data.eod_id), tf.float32)
        return xent, weights, routings

    def loss(self, batch: dict[str, tf.Tensor], seed: tf.Tensor) -> dict[str, LossTerm]:
        """Mean cross-entropy over scored tokens; with their coefficients on, the load-balancing loss
        (mean over routing groups, summed over layers) and the router z-loss (mean over tokens, summed
        over layers)."""
        m = self.cfg.model
        xent, weights, routings = self.token_losses(batch["tokens"])
        terms = {"cross_entropy": LossTerm(tf.reduce_sum(xent * weights), tf.reduce_sum(weights))}
        if m.load_balancing_coef:
            terms["load_balancing"] = LossTerm(m.load_balancing_coef * tf.add_n([r.balance_sum for r in routings]),
                                               tf.constant(float(routings[0].groups)))
        if m.router_z_loss_coef:
            terms["router_z"] = LossTerm(m.router_z_loss_coef * tf.add_n([r.z_sum for r in routings]),
                                         tf.constant(float(routings[0].tokens)))
        return terms

    def process_gradients(self, grads: list[tf.Tensor]) -> list[tf.Tensor]:
        if self.cfg.optimizer.clip_norm:
            grads, _ = tf.clip_by_global_norm(grads, self.cfg.optimizer.clip_norm)
        return grads

    def eval_step(self, batch: dict[str, tf.Tensor], mask: tf.Tensor) -> dict[str, tf.Tensor]:
        xent, weights, routings = self.token_losses(batch["tokens"])
        w = weights * tf.expand_dims(mask, 1)
        return {"nll": tf.reduce_sum(xent * w), "tokens": tf.reduce_sum(w), "rows": tf.reduce_sum(mask),
                # Health metric (ST-MoE): expert assignments dropped for capacity, real rows only.
                "dropped": tf.add_n([tf.reduce_sum(r.dropped * mask) for r in routings])}

    def eval_finalize(self, state: dict[str, float]) -> dict[str, float]:
        m = self.cfg.model
        assignments = max(state["rows"], 1.0) * self.cfg.data.seq_length * m.experts_per_token * m.num_layers
        return {self.METRIC: state["nll"] / max(state["tokens"], 1e-9),
                "dropped assignments": state["dropped"] / assignments}

    # ------------------------------------------------------------------------------------ logging
    def mllog_hparams(self) -> dict[str, Any]:
        """The closed keys of both rulesets, 6.1.0's precision/parallelism disclosure, and the router
        options that are on."""
        o, m, rt = self.cfg.optimizer, self.cfg.model, self.runtime
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
        if m.capacity_factor:
            keys["moe_expert_capacity_factor"] = m.capacity_factor
        if m.load_balancing_coef:
            keys["moe_aux_loss_coeff"] = m.load_balancing_coef
        if m.router_z_loss_coef:
            keys["moe_z_loss_coeff"] = m.router_z_loss_coef
        return keys
