"""Llama 2 LoRA fine-tuning's cost for `mlperf-harness plan` and the dry run's useful FLOPs, counted from the
config: the Llama block's multiply-adds per row of `data.seq_length` tokens (benchmarks/lm/cost.py), but a
frozen base gets no weight gradients, so training = forward + the activation gradients = 2 x forward, plus the
adapters' own (negligible, counted). Only the adapters are all-reduced and updated by AdamW; FSDP gathers the
frozen base (bf16) for the forward and again for the backward and never reduces it.
Llama 2 70B at 8192 tokens: 2,260 TFLOP of weight matmuls per row (4 x N x T) plus attention; NVIDIA's code
uses MODEL_TFLOP_PER_SAMPLE=2598."""
from __future__ import annotations

from harness.plan.cost import CostModel, ModelCost

from benchmarks.llama2_70b_lora.rules import REFERENCE_TRAIN_ROWS, RULES
from benchmarks.lm.cost import (CONVERGE_UNIT, OPTIMIZER_BYTES_PER_PARAM, decoder_activation_bytes,
                                decoder_macs_and_params, decoder_model_cost, kept_activation_bytes,
                                rules_eval_positions)



def adapter_params(cfg) -> int:
    """Trainable parameters: per layer A [hidden, r] and B [r, q + k + v] on qkv, A [heads x hd, r] and
    B [r, hidden] on o (44,564,480 for 70B at r 16)."""
    m = cfg.model
    qkv = m.head_dim * (m.num_heads + 2 * m.num_kv_heads)
    per_layer = m.lora_rank * (m.hidden_size + qkv + m.num_heads * m.head_dim + m.hidden_size)
    return m.num_layers * per_layer


def forward_macs_and_params(cfg) -> tuple[float, int]:
    """Multiply-adds per row (seq_length tokens, adapters included) and the base parameter count."""
    m = cfg.model
    ffn = 3 * m.hidden_size * m.ffn_hidden
    macs, params = decoder_macs_and_params(cfg, m.num_layers * cfg.data.seq_length / 2.0, ffn, ffn)
    return macs + adapter_params(cfg) * cfg.data.seq_length, params


def model_cost(cfg) -> ModelCost:
    macs, base = forward_macs_and_params(cfg)
    lora = adapter_params(cfg)
    adapter_macs = lora * cfg.data.seq_length
    cost = decoder_model_cost(
        cfg, "llama2_70b_lora", macs, lora,
        "counted (benchmarks/llama2_70b_lora/cost.py: frozen Llama base, forward + activation gradients; "
        "adapters' weight gradients)",
        notes=f"frozen base of {base:,} parameters: no weight gradients, no optimizer state, gathered never reduced")
    cost.train_flops_per_sample = 2 * 2.0 * macs + 2.0 * adapter_macs
    if not cfg.data.train_samples and cfg.data.source == "parquet":
        cost.train_samples = REFERENCE_TRAIN_ROWS  # the reference's train file
    cost.optimizer_bytes_per_param = OPTIMIZER_BYTES_PER_PARAM
    # FSDP moves the bf16 (or float32) base twice a step, and the float32 adapters
    width = 2 if cfg.model.frozen_dtype == "bfloat16" else 4
    cost.fsdp_gather_bytes = (width * base + 4 * lora) if cfg.runtime.fsdp else 0.0
    cost.frozen_bytes = float(width * base)
    return cost


def train_activation_bytes(cfg, rows: int) -> int:
    m = cfg.model
    return decoder_activation_bytes(cfg, rows, m.num_layers * cfg.data.seq_length, m.ffn_hidden)


COST = CostModel(model_cost, rules_eval_positions(RULES), CONVERGE_UNIT,
                 train_activation_bytes=train_activation_bytes, kept_activation_bytes=kept_activation_bytes)
