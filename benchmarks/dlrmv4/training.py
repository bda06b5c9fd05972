"""dlrmv4's optimizers and gradient clipping as the reference trains (mlcommons/training@a67b8459
recommendation_v4/generative_recommenders/dlrm_v4/train/utils.py and train/gin/yambda_5b.gin):
torch.optim.Adam (betas 0.95, 0.999, eps 1e-8, no weight decay) on every dense weight, FBGEMM's exact
row-wise Adagrad (eps 1e-8) fused into the backward on every embedding table, one learning rate for both
(linear warmup from 0, then constant), and `clip_grad_norm_(max_norm=1.0)` over the dense gradients only
(the fused tables have no .grad)."""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from harness.nn.optim import AdamW, Partitioned, RowWiseAdagrad, Schedule
from harness.runtime.base import Runtime, VariableInfo

ADAM_BETA_1, ADAM_BETA_2, ADAM_EPSILON = 0.95, 0.999, 1e-8
ADAGRAD_EPSILON = 1e-8
CLIP_NORM = 1.0
TABLE_MARK = "/tables/"


def is_table(path: str) -> bool:
    return TABLE_MARK in path


def make_optimizer(runtime: Runtime, variables: Sequence[VariableInfo], schedule: Schedule) -> Partitioned:
    """Adam on the dense weights, then row-wise Adagrad on the tables: gradients go in that order."""
    dense = [v for v in variables if not is_table(v.path)]
    tables = [v for v in variables if is_table(v.path)]
    # AdamW with no weight decay is torch.optim.Adam: bias-corrected m / (sqrt(v_hat) + eps).
    adam = AdamW(runtime, dense, schedule, beta_1=ADAM_BETA_1, beta_2=ADAM_BETA_2, epsilon=ADAM_EPSILON,
                 weight_decay=0.0, name="adam")
    adagrad = RowWiseAdagrad(runtime, tables, schedule, epsilon=ADAGRAD_EPSILON, name="rowwise_adagrad")
    return Partitioned(runtime, [adam, adagrad], schedule)


def warmup_schedule(base_lr: float, warmup_steps: int) -> Schedule:
    """base * min(1, s / warmup) for the update after s steps: the reference's first step has rate 0."""
    def lr(step: tf.Tensor) -> tf.Tensor:
        return base_lr * tf.minimum(1.0, tf.cast(step, tf.float32) / float(max(warmup_steps, 1)))
    return lr


def clip_dense(grads: list, dense_count: int, max_norm: float = CLIP_NORM) -> list:
    """torch.nn.utils.clip_grad_norm_ over the first `dense_count` gradients (the dense ones):
    scale = min(1, max_norm / (norm + 1e-6)); the tables' gradients pass unclipped."""
    dense = [tf.convert_to_tensor(g) for g in grads[:dense_count]]
    norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(g)) for g in dense]))
    scale = tf.minimum(1.0, max_norm / (norm + 1e-6))
    return [g * scale for g in dense] + list(grads[dense_count:])
