"""The decoder benchmarks' rules records: what the closed division fixes of a config, where a run evaluates,
how the loss and the metric average, how long the run is and which keys its log holds. TensorFlow-free: `plan`
reads the cadence (benchmarks/<name>/cost.py) from the same record as the run's `eval_schedule`.

`PRETRAINING` is gpt_oss_20b's and llama31_8b's (one closed checker file but for the target, which
harness/benchmark_rules.py holds); llama2_70b_lora and deepseekv3_671b declare theirs beside their workloads.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

from harness import benchmark_rules as rules
from harness.benchmark_rules import SAMPLE, Cadence, ClosedRules

TOKEN_MEAN, ROW_MEAN = "token mean", "row mean"
PRECISION_NAMES = {"float32": "fp32", "bfloat16": "bfloat16", "float16": "fp16"}


def epochs_budget(cfg: Any, train_samples: int) -> int:
    """Optimizer steps of a run of schedule.max_epochs over `train_samples` rows (at least one)."""
    gbs = cfg.schedule.global_batch_size
    return max(1, math.ceil(cfg.schedule.max_epochs * train_samples / gbs - 1e-9))


def steps_budget(cfg: Any, train_samples: int) -> int:
    """optimizer.max_steps: the run's length whatever the data's size (a fine-tune's)."""
    return cfg.optimizer.max_steps


@dataclasses.dataclass(frozen=True)
class DecoderRules(ClosedRules):
    """A decoder benchmark's rules: the closed record plus `loss` (TOKEN_MEAN: scored tokens' mean over the
    whole batch, Megatron's; ROW_MEAN: each row's mean over its scored tokens, then the mean over rows), the
    `metric` it is logged as, `budget(cfg, train_samples)` (the run's optimizer steps) and `keys(workload)`,
    the benchmark's own hyperparameter keys in the order its log holds them (the disclosure keys follow)."""
    loss: str = TOKEN_MEAN
    metric: str = "log perplexity"
    budget: Callable[[Any, int], int] = epochs_budget
    keys: Callable[[Any], dict[str, Any]] = lambda workload: {}


def pretraining_cadence(cfg: Any, global_batch: int) -> Cadence:
    """Every data.eval_every_samples, else the rules' ceil(12288 / gbs) * gbs samples, from the first."""
    every = cfg.data.eval_every_samples or rules.lm_eval_every(global_batch)
    return Cadence(SAMPLE, every, every)


def pretraining_checks(cfg: Any) -> str | None:
    o = cfg.optimizer
    if not math.isclose(o.end_learning_rate, 0.1 * o.base_learning_rate, rel_tol=1e-6):
        return (f"closed {cfg.workload}: the rules fix optimizer.end_learning_rate at 0.1 x base_learning_rate = "
                f"{0.1 * o.base_learning_rate:g} (got {o.end_learning_rate:g})")
    return None


def pretraining_keys(workload: Any) -> dict[str, Any]:
    """The closed checker's keys (warmup logged before decay steps: the checker reads them in log order)."""
    o = workload.cfg.optimizer
    return {
        "max_sequence_length": workload.cfg.data.seq_length,
        "opt_name": "adamw",
        "opt_base_learning_rate": o.base_learning_rate,
        "opt_end_learning_rate": o.end_learning_rate,
        "opt_learning_rate_warmup_steps": o.warmup_steps,
        "opt_learning_rate_decay_steps": workload.decay_steps,
        "opt_learning_rate_decay_schedule": "cosine with linear warmup",
        "opt_adamw_beta_1": o.beta_1,
        "opt_adamw_beta_2": o.beta_2,
        "opt_adamw_epsilon": o.epsilon,
        "opt_adamw_weight_decay": o.weight_decay,
        "opt_gradient_clip_norm": o.clip_norm,
        "max_steps": o.max_steps,
    }


# gpt_oss_20b and llama31_8b: what their closed checker fixes (and, for the end learning rate, the rules).
PRETRAINING = DecoderRules(
    fixed=(("data.eval_every_samples", 0), ("optimizer.max_steps", 1_200_000), ("optimizer.beta_1", 0.9),
           ("optimizer.beta_2", 0.95), ("optimizer.epsilon", 1e-5), ("optimizer.weight_decay", 0.1),
           ("optimizer.clip_norm", 1.0)),
    fixed_by="the checker fixes", row_length=8192, eval_rows=1024, checkpoint="",
    cadence=pretraining_cadence, checks=pretraining_checks, keys=pretraining_keys)
