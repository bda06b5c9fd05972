"""What the closed division fixes of a dlrmv4 config, and where a run evaluates: the 6.1.0 closed checker
(mlperf-logging 4.1.68 compliance_checker/training_6.1.0/closed_dlrmv4.yaml: only the global batch and the
base LR, in [0.5, 1.5] x 1e-6 x GBS / 8192, are free) and the reference's model (mlcommons/training@a67b8459
recommendation_v4/generative_recommenders/dlrm_v4/configs.py with train/gin/yambda_5b.gin). TensorFlow-free:
`plan` counts the evals from the same cadence."""
from __future__ import annotations

from typing import Any

from harness import benchmark_rules as rules
from harness.benchmark_rules import SAMPLE, Cadence, ClosedRules

from benchmarks.dlrmv4.config import REFERENCE_TABLES


def cadence(cfg: Any, global_batch: int) -> Cadence:
    """Every data.eval_every_samples from its first multiple, else the checker's grid from its first eval."""
    every = cfg.data.eval_every_samples
    if every:
        return Cadence(SAMPLE, every, every)
    return rules.cadence("dlrmv4", "6.1.0", global_batch)


def checks(cfg: Any) -> str | None:
    gbs, lr = cfg.schedule.global_batch_size, cfg.optimizer.base_learning_rate
    low, high = rules.dlrmv4_lr_band(gbs)
    if not low * (1 - 1e-9) <= lr <= high * (1 + 1e-9):
        return (f"closed dlrmv4 at global batch {gbs} takes optimizer.base_learning_rate in [{low:.4g}, "
                f"{high:.4g}] (got {lr:g})")
    if cfg.schedule.gradient_accumulation_steps != 1:
        return "closed dlrmv4 steps once per global batch: set schedule.gradient_accumulation_steps=1"
    return None


RULES = ClosedRules(
    fixed=(("data.eval_every_samples", 0), ("data.train_windows", 299), ("data.eval_window", 299),
           ("optimizer.warmup_steps", 24000), ("model.embedding_dim", 512), ("model.num_layers", 3),
           ("model.num_heads", 4), ("model.attention_dim", 128), ("model.linear_dim", 128),
           ("model.preprocessor_hidden_dim", 256), ("model.action_embedding_dim", 8),
           ("model.item_hidden_dim", 512), ("model.head_hidden_dim", 512), ("model.history_length", 4086),
           ("model.max_seq_len", 4096), ("model.num_position_buckets", 8192), ("model.num_time_buckets", 2048),
           ("model.input_dropout", 0.2), ("model.linear_dropout", 0.1), ("model.loss_weight", 0.2),
           ("model.tables", dict(REFERENCE_TABLES))),
    fixed_by="the reference has",
    data_source="yambda", data_text="trains on the reference's preprocessed Yambda-5B flat cache",
    cadence=cadence, checks=checks)
