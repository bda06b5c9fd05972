"""The keys a dlrmv4 run logs after `global_batch_size`, `train_samples` and `eval_samples`, in the order the
6.1.0 closed checker reads them (closed_dlrmv4.yaml: `opt_base_learning_rate` after `global_batch_size`,
`opt_sparse_base_learning_rate` after it). The values the rules pin come from harness.benchmark_rules."""
from __future__ import annotations

from typing import Any

from harness import benchmark_rules as rules

from benchmarks.dlrmv4 import training

WARMUP_STEPS = 24000  # train/gin/yambda_5b.gin LR_WARMUP_STEPS, pinned by the checker


def closed_hparams(base_lr: float, warmup_steps: int, max_sequence_length: int, precision: dict[str, str],
                   micro_batch_size: int, table_parallelism: int, config_filename: str) -> dict[str, Any]:
    """Optimizer, eval-cadence and 6.1.0 disclosure keys; `precision` maps linear/attn/comm to a name."""
    fixed = rules.record("dlrmv4").closed_fixed
    return {
        "max_sequence_length": max_sequence_length,
        "opt_name": fixed["opt_name"],
        "opt_base_learning_rate": base_lr,
        "opt_adam_beta_1": training.ADAM_BETA_1,
        "opt_adam_beta_2": training.ADAM_BETA_2,
        "opt_adam_epsilon": training.ADAM_EPSILON,
        "opt_weight_decay": 0.0,
        "opt_gradient_clip_norm": training.CLIP_NORM,
        "opt_sparse_name": fixed["opt_sparse_name"],
        "opt_sparse_base_learning_rate": base_lr,
        "opt_learning_rate_warmup_steps": warmup_steps,
        "opt_learning_rate_warmup_start_lr": 0.0,
        "eval_every_data_pct": fixed["eval_every_data_pct"],
        "lowest_numerical_precision_in_linear": precision["linear"],
        "lowest_numerical_precision_in_attn": precision["attn"],
        "lowest_numerical_precision_in_comm": precision["comm"],
        # Rows of every table are split over the devices (model parallel), the dense part is replicated.
        "tensor_parallelism": table_parallelism,
        "pipeline_parallelism": 1,
        "context_parallelism": 1,
        "expert_parallelism": 1,
        "micro_batch_size": micro_batch_size,
        "config_filename": config_filename,
    }
