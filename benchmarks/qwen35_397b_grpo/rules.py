"""What the closed division fixes of a qwen35_397b_grpo config and where a run evaluates: the 6.1.0 closed checker
(mlperf-logging 4.1.68 compliance_checker/training_6.1.0/closed_qwen35_397b_grpo.yaml: 16 rollouts per task, the
LR 1e-6 x sqrt(GBS / 256) and clip 0.125 x sqrt(256 / GBS), Adam(W) 0.9 / 0.999 / 1e-8 without decay, the
sampling settings, 251 validation tasks, trajectories of up to 65,536 tokens, the first eval after step
ceil(2.5 + 3840 / GBS) and one after every step from there) and the reference's start point
(mlcommons/training@aa344c7 llm_post_training: the Hugging Face snapshot). TensorFlow-free: `plan` counts the
evals from the same cadence."""
from __future__ import annotations

import math
from typing import Any

from harness.benchmark_rules import SAMPLE, Cadence, ClosedRules

SNAPSHOT = "Qwen/Qwen3.5-397B-A17B@8472618112abcbd45acbcdc58436aff4233c23f7"
REFERENCE_TRAIN_TASKS = 685  # the curriculum file's rows (train_samples is logged as 685 x 16)


def closed_learning_rate(global_batch: int) -> float:
    return 1e-6 * math.sqrt(global_batch / 256)


def closed_clip_norm(global_batch: int) -> float:
    return 0.125 * math.sqrt(256 / global_batch)


def first_eval_step(cfg: Any, global_batch: int) -> int:
    """The step the first eval follows: grpo.first_eval_step, 0 meaning the rules' ceil(2.5 + 3840 / GBS)."""
    return cfg.section("grpo").first_eval_step or math.ceil(2.5 + 3840 / global_batch)


def cadence(cfg: Any, global_batch: int) -> Cadence:
    """After step `first_eval_step`, then every grpo.eval_every_steps, in training samples (rollouts)."""
    every = cfg.section("grpo").eval_every_steps
    return Cadence(SAMPLE, first_eval_step(cfg, global_batch) * global_batch, every * global_batch)


def checks(cfg: Any) -> str | None:
    gbs, o = cfg.schedule.global_batch_size, cfg.optimizer
    if gbs % 16:
        return f"closed qwen35_397b_grpo takes 16 rollouts per task: a global batch multiple of 16 (got {gbs})"
    for key, got, want in (("base_learning_rate", o.base_learning_rate, closed_learning_rate(gbs)),
                           ("clip_norm", o.clip_norm, closed_clip_norm(gbs))):
        if got and abs(got - want) > 1e-9 * want:
            return (f"closed qwen35_397b_grpo at global batch {gbs} has optimizer.{key}={want:.10g} (got {got:g}; "
                    f"0 = it)")
    return None


RULES = ClosedRules(
    fixed=(("grpo.num_generations_per_prompt", 16), ("data.eval_tasks", 251), ("grpo.max_trajectory_tokens", 65536),
           ("grpo.first_eval_step", 0), ("grpo.eval_every_steps", 1), ("grpo.eval_generations", 4),
           ("grpo.train_temperature", 1.0), ("grpo.train_top_p", 1.0), ("grpo.eval_temperature", 0.1),
           ("grpo.eval_top_p", 0.95), ("optimizer.beta_1", 0.9), ("optimizer.beta_2", 0.999),
           ("optimizer.epsilon", 1e-8), ("optimizer.weight_decay", 0.0), ("schedule.gradient_accumulation_steps", 1)),
    data_source="r2e_gym", data_text="runs the reference's R2E-Gym tasks", checkpoint=SNAPSHOT,
    cadence=cadence, checks=checks)
