"""GPT-OSS's cost for `mlperf-harness plan`: multiply-adds per row of `data.seq_length` tokens, counted from
the config.

Per token and layer: the q/k/v/o projections h*hd*(2*heads + 2*kv_heads); attention scores and context
2*span*heads*hd, where span is the sliding window on sliding layers and half the row (causal) on full ones;
the router h*E; the k active SwiGLU experts 3*h*eh each (gate, up, down). Per token: the LM head h*V. Only
the k routed experts count (dropless top-k: the other experts do no work on the token). GPT-OSS 20B at 8192
tokens counts about 3.8 G multiply-adds per token forward. Training = 3 x forward; eval: the forward pass.
This is the model's useful work (what MFU counts), a lower bound of what the harness's implementation hands
XLA (the sorted MoE dispatch's padding blocks and dense full-row attention add about 19% at the reference;
the one-hot `dense` dispatch computes every slot): --calibrate absorbs the difference.
Collectives on the mesh: tensor parallelism over the model axis (activation all-reduces, mp_bytes_per_sample)
and, with runtime.fsdp, the weights' all-gather over the data axis (fsdp_gather_bytes); the eval is device
work (the loss summed on the chips), split as harness/plan/project.py describes.
"""
from __future__ import annotations

import math

from harness.plan.cost import ModelCost

CONVERGE_UNIT = "samples"  # the 6.x RCP tables count rows (samples) to converge
# Where the eval runs: the eval loss is summed on the devices (the forward pass split over the chips); nothing
# is scored per sample on the host; a fixed 10 ms per eval gathers the two sums (assumption; --calibrate
# gives the device part from the logs' eval time)
EVAL_HOST_SECONDS_PER_SAMPLE = 0.0
EVAL_FIXED_SECONDS = 0.01
# FSDP (runtime.fsdp): the float32 variables are all-gathered where the model reads them, once a step (the
# forward's gathered value serves the backward: an assumption about TensorFlow's gradient of the gather)
FSDP_WEIGHT_BYTES = 4.0
# AdamW in float32: read weight, gradient, m, v (16 B), write weight, m, v (12 B)
OPTIMIZER_BYTES_PER_PARAM = 28.0


def forward_macs_and_params(cfg) -> tuple[float, int]:
    """Multiply-adds per row (seq_length tokens) and the parameter count."""
    m, s = cfg.model, cfg.data.seq_length
    h, hd, heads, kv, experts, k, eh, vocab = (m.hidden_size, m.head_dim, m.num_heads, m.num_kv_heads,
                                               m.num_experts, m.experts_per_token, m.expert_hidden, m.vocab_size)
    projections = h * hd * (2 * heads + 2 * kv)
    layers_sliding = (m.num_layers + 1) // 2  # even layers (0, 2, ...) slide, odd ones attend fully
    full_span = min(m.full_attention_span or s, s) / 2.0
    attention = 2 * heads * hd * (layers_sliding * min(m.sliding_window, s) + (m.num_layers - layers_sliding) * full_span)
    per_token = m.num_layers * (projections + h * experts + k * 3 * h * eh) + attention + h * vocab
    layer_params = projections + h * experts + experts * 3 * h * eh + 2 * h
    params = 2 * vocab * h + m.num_layers * layer_params + h
    return float(per_token * s), int(params)


def model_cost(cfg) -> ModelCost:
    macs, params = forward_macs_and_params(cfg)
    m, s = cfg.model, cfg.data.seq_length
    return ModelCost(
        workload="gpt_oss_20b",
        source="counted (benchmarks/gpt_oss/cost.py: projections, windowed/causal attention, k active experts, "
               "LM head)",
        train_flops_per_sample=3 * 2.0 * macs, eval_flops_per_sample=2.0 * macs, params=params,
        gradient_bytes=4.0 * params, optimizer_bytes_per_param=OPTIMIZER_BYTES_PER_PARAM,
        train_samples=cfg.data.train_samples or cfg.optimizer.max_steps * cfg.schedule.global_batch_size,
        eval_samples=cfg.data.eval_samples, sample_unit=f"row of {s} tokens",
        # tensor parallelism on the mesh's model axis (heads / expert hidden / vocab split): 2 activation
        # all-reduces per layer forward and 2 backward, bf16
        mp_bytes_per_sample=4 * m.num_layers * s * m.hidden_size * 2.0,
        fsdp_gather_bytes=FSDP_WEIGHT_BYTES * params if cfg.runtime.fsdp else 0.0,
        eval_host_seconds_per_sample=EVAL_HOST_SECONDS_PER_SAMPLE, eval_fixed_seconds=EVAL_FIXED_SECONDS,
        notes="expert-parallel all-to-all traffic (experts on the data axis) not modelled")


def eval_positions(cfg, upto: float, global_batch: int) -> list[float]:
    """Evals every ceil(12288 / gbs) * gbs samples (the rules) through the first at or past `upto`."""
    every = cfg.data.eval_every_samples or math.ceil(12288 / global_batch) * global_batch
    n = max(1, int(math.ceil(upto / every - 1e-9)))
    return [every * (i + 1) for i in range(n)]
