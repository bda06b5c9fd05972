"""llama2_70b_lora's rules record (benchmarks/lm/rules.py): the closed division's GovReport rows, the LoRA and
AdamW values the rules fix, evals every ceil(384 / GBS) * GBS samples after the first floor(0.125 * GBS + 2)
(skipped: not run, not logged), the mean over rows of each row's mean loss, and the checker's keys.
TensorFlow-free: `plan` counts the evals from the same cadence."""
from __future__ import annotations

from typing import Any

from harness import benchmark_rules as rules
from harness.benchmark_rules import SAMPLE, Cadence

from benchmarks.lm.rules import ROW_MEAN, DecoderRules, steps_budget

# The MLPerf dataset (SCROLLS GovReport, tokenized and packed by the reference): rows in each split.
REFERENCE_TRAIN_ROWS, REFERENCE_EVAL_ROWS = 3901, 173


def cadence(cfg: Any, global_batch: int) -> Cadence:
    """Every data.eval_every_samples (else the rules'), after data.eval_skip skipped evals (-1: the rules')."""
    d = cfg.data
    every = d.eval_every_samples or rules.lora_eval_every(global_batch)
    skip = rules.lora_eval_skip(global_batch) if d.eval_skip < 0 else d.eval_skip
    return Cadence(SAMPLE, every * (skip + 1), every)


def checks(cfg: Any) -> str | None:
    if cfg.data.train_samples not in (0, REFERENCE_TRAIN_ROWS):
        return (f"closed {cfg.workload} trains on the reference's {REFERENCE_TRAIN_ROWS} rows: set "
                f"data.train_samples=0 (counted) or {REFERENCE_TRAIN_ROWS} (got {cfg.data.train_samples})")
    return None


def keys(workload: Any) -> dict[str, Any]:
    """The closed checker's keys (each once) and informative ones."""
    o, m = workload.cfg.optimizer, workload.cfg.model
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
        "max_sequence_length": workload.cfg.data.seq_length,
    }


# What the rules fix (config key, value); the checker reads only lora_rank's value.
RULES = DecoderRules(
    fixed=(("data.eval_every_samples", 0), ("data.eval_skip", -1), ("model.lora_rank", 16),
           ("model.lora_alpha", 32.0), ("model.lora_dropout", 0.1), ("optimizer.beta_1", 0.9),
           ("optimizer.beta_2", 0.999), ("optimizer.epsilon", 1e-8), ("optimizer.weight_decay", 1e-4),
           ("optimizer.clip_norm", 0.3), ("optimizer.warmup_steps", 0), ("optimizer.end_learning_rate", 0.0)),
    row_length=8192, eval_rows=REFERENCE_EVAL_ROWS, data_source="parquet",
    data_text="fine-tunes on the reference's GovReport parquet files",
    checkpoint="fine-tunes the pretrained Llama 2 70B",
    cadence=cadence, checks=checks, loss=ROW_MEAN, metric="eval loss", budget=steps_budget, keys=keys)
