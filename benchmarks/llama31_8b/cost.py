"""Llama 3.1's cost for `mlperf-harness plan` and the dry run's useful FLOPs: multiply-adds per row of
`data.seq_length` tokens, counted from the config.

Per token and layer: the q/k/v/o projections h*hd*(2*heads + 2*kv_heads); causal attention's scores and
context 2*heads*hd*(seq/2) (a token sees half the row on average); the SwiGLU 3*h*ff (gate, up, down). Per
token: the LM head h*V (the embedding lookup is free). Training = 3 x forward; eval: the forward pass.
Llama 3.1 8B at 8192 tokens: 8.58 G multiply-adds per token forward, 421.6 TFLOP per training row (NVIDIA's
v5.1 code uses MODEL_TFLOP_PER_SAMPLE=421.59), 8,030,261,248 parameters.
"""
from __future__ import annotations

from harness.plan.cost import CostModel, ModelCost

from benchmarks.lm.cost import (CONVERGE_UNIT, decoder_activation_bytes, decoder_macs_and_params, decoder_model_cost,
                                kept_activation_bytes, rules_eval_positions)
from benchmarks.lm.rules import PRETRAINING


def forward_macs_and_params(cfg) -> tuple[float, int]:
    """Multiply-adds per row (seq_length tokens) and the parameter count."""
    m = cfg.model
    ffn = 3 * m.hidden_size * m.ffn_hidden
    return decoder_macs_and_params(cfg, m.num_layers * cfg.data.seq_length / 2.0, ffn, ffn)


def model_cost(cfg) -> ModelCost:
    macs, params = forward_macs_and_params(cfg)
    return decoder_model_cost(
        cfg, "llama31_8b", macs, params,
        "counted (benchmarks/llama31_8b/cost.py: projections, causal attention, SwiGLU, LM head)")


def train_activation_bytes(cfg, rows: int) -> int:
    """Host bytes of the train step beyond the variables (benchmarks/lm/cost.py): every query's scores span
    the whole row (exact up to 1024 tokens; longer rows go in query chunks that keep about (n + 1) / 2n of it)."""
    m = cfg.model
    return decoder_activation_bytes(cfg, rows, m.num_layers * cfg.data.seq_length, m.ffn_hidden)


COST = CostModel(model_cost, rules_eval_positions(PRETRAINING), CONVERGE_UNIT,
                 train_activation_bytes=train_activation_bytes, kept_activation_bytes=kept_activation_bytes)
