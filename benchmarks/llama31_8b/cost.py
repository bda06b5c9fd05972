"""Llama 3.1's cost for `mlperf-harness plan` and the dry run's useful FLOPs: multiply-adds per row of
`data.seq_length` tokens, counted from the config.

Per token and layer: the q/k/v/o projections h*hd*(2*heads + 2*kv_heads); causal attention's scores and
context 2*heads*hd*(seq/2) (a token sees half the row on average); the SwiGLU 3*h*ff (gate, up, down). Per
token: the LM head h*V (the embedding lookup is free). Training = 3 x forward; eval: the forward pass.
Llama 3.1 8B at 8192 tokens: 8.58 G multiply-adds per token forward, 421.6 TFLOP per training row (NVIDIA's
v5.1 code uses MODEL_TFLOP_PER_SAMPLE=421.59), 8,030,261,248 parameters.
"""
from __future__ import annotations

import math

from harness.plan.cost import ModelCost

CONVERGE_UNIT = "samples"  # the RCP tables count rows (samples) to converge
# Where the eval runs (harness/plan/project.py): the eval loss is summed on the devices (the forward pass split
# over the chips); nothing per sample on the host; a fixed 10 ms per eval gathers the sums (assumption)
EVAL_HOST_SECONDS_PER_SAMPLE = 0.0
EVAL_FIXED_SECONDS = 0.01
# AdamW in float32: read weight, gradient, m, v (16 B), write weight, m, v (12 B)
OPTIMIZER_BYTES_PER_PARAM = 28.0


def forward_macs_and_params(cfg) -> tuple[float, int]:
    """Multiply-adds per row (seq_length tokens) and the parameter count."""
    m, s = cfg.model, cfg.data.seq_length
    h, hd, heads, kv, ff, vocab = (m.hidden_size, m.head_dim, m.num_heads, m.num_kv_heads, m.ffn_hidden,
                                   m.vocab_size)
    projections = h * hd * (2 * heads + 2 * kv)
    attention = 2 * heads * hd * s / 2.0
    per_token = m.num_layers * (projections + 3 * h * ff + attention) + h * vocab
    params = 2 * vocab * h + m.num_layers * (projections + 3 * h * ff + 2 * h) + h
    return float(per_token * s), int(params)


def model_cost(cfg) -> ModelCost:
    macs, params = forward_macs_and_params(cfg)
    m, s = cfg.model, cfg.data.seq_length
    return ModelCost(
        workload="llama31_8b",
        source="counted (benchmarks/llama31_8b/cost.py: projections, causal attention, SwiGLU, LM head)",
        train_flops_per_sample=3 * 2.0 * macs, eval_flops_per_sample=2.0 * macs, params=params,
        gradient_bytes=4.0 * params, optimizer_bytes_per_param=OPTIMIZER_BYTES_PER_PARAM,
        train_samples=cfg.data.train_samples or cfg.optimizer.max_steps * cfg.schedule.global_batch_size,
        eval_samples=cfg.data.eval_samples, sample_unit=f"row of {s} tokens",
        # heads / ff / vocab split: 2 all-reduces per layer forward and 2 backward, bf16
        mp_bytes_per_sample=4 * m.num_layers * s * m.hidden_size * 2.0,
        # runtime.fsdp: the float32 variables all-gathered once a step over the data axis
        fsdp_gather_bytes=4.0 * params if cfg.runtime.fsdp else 0.0,
        eval_host_seconds_per_sample=EVAL_HOST_SECONDS_PER_SAMPLE, eval_fixed_seconds=EVAL_FIXED_SECONDS)


def eval_positions(cfg, upto: float, global_batch: int) -> list[float]:
    """Evals every ceil(12288 / gbs) * gbs samples (the rules) through the first at or past `upto`."""
    every = cfg.data.eval_every_samples or math.ceil(12288 / global_batch) * global_batch
    n = max(1, int(math.ceil(upto / every - 1e-9)))
    return [every * (i + 1) for i in range(n)]
