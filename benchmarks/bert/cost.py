"""BERT's cost for `mlperf-harness plan`: multiply-adds per sequence counted from the config.

Per encoder layer: Q, K, V and output projections 4*s*h^2, feed-forward 2*s*h*ff, attention scores and
context 2*s^2*h; the masked-LM head runs on the max_predictions positions (transform h^2 and the vocab
projection h*V), plus the pooler. BERT-large at s=512 counts 0.39 T FLOPs per forward sequence.
Training = 3 x forward. Eval: the forward pass over eval_samples sequences.
"""
from __future__ import annotations

import math

from harness import benchmark_rules as rules
from harness.plan.cost import ModelCost

CONVERGE_UNIT = "samples"
# Where the eval runs: masked-LM accuracy is counted on the devices (split over the chips); nothing per sample
# on the host; a fixed 10 ms per eval gathers the counters (an assumption; --calibrate measures the rest)
EVAL_HOST_SECONDS_PER_SAMPLE = 0.0
EVAL_FIXED_SECONDS = 0.01
# LAMB in float32: read weight, gradient, m, v (16 B) and write weight, m, v (12 B) for the update, then
# read weight and update again for the trust ratio (8 B)
OPTIMIZER_BYTES_PER_PARAM = 36.0


def forward_macs_and_params(cfg) -> tuple[int, int]:
    m, d = cfg.model, cfg.data
    h, ff, layers, vocab, s, p = m.hidden_size, m.ff_size, m.num_layers, m.vocab_size, d.seq_length, \
        d.max_predictions
    per_layer = 4 * s * h * h + 2 * s * h * ff + 2 * s * s * h
    macs = layers * per_layer + p * (h * h + h * vocab) + h * h + 2 * h
    layer_params = 4 * h * h + 4 * h + 2 * h * ff + ff + h + 4 * h
    params = (vocab * h + m.max_position * h + 2 * h + 2 * h + layers * layer_params + h * h + h
              + h * h + h + 2 * h + vocab + 2 * h + 2)
    return macs, params


def model_cost(cfg) -> ModelCost:
    macs, params = forward_macs_and_params(cfg)
    m, s = cfg.model, cfg.data.seq_length
    return ModelCost(
        workload="bert", source="counted (benchmarks/bert/cost.py: encoder matmuls, attention, MLM head)",
        train_flops_per_sample=3 * 2.0 * macs, eval_flops_per_sample=2.0 * macs, params=params,
        gradient_bytes=4.0 * params, optimizer_bytes_per_param=OPTIMIZER_BYTES_PER_PARAM,
        train_samples=cfg.data.train_samples, eval_samples=cfg.data.eval_samples, sample_unit="sequence",
        # Megatron-style split: 2 activation all-reduces per layer forward and 2 backward, bf16
        mp_bytes_per_sample=4 * m.num_layers * s * m.hidden_size * 2.0,
        eval_host_seconds_per_sample=EVAL_HOST_SECONDS_PER_SAMPLE, eval_fixed_seconds=EVAL_FIXED_SECONDS)


def eval_every_samples(cfg, global_batch: int) -> int:
    if cfg.data.eval_every_samples:
        return cfg.data.eval_every_samples
    return rules.bert_eval_every(global_batch)


def eval_positions(cfg, upto: float, global_batch: int) -> list[float]:
    """Eval points in samples through the first at or past `upto`: 0.7.0 evaluates from 3M samples every
    500K, later rulesets every eval_every_samples (the MLPerf formula)."""
    if cfg.ruleset.startswith("0.7"):
        rule = rules.cadence("bert", cfg.ruleset, global_batch)
        first, every = int(rule.first), int(rule.every)
    else:
        first = every = eval_every_samples(cfg, global_batch)
    n = max(0, int(math.ceil((upto - first) / every - 1e-9))) + 1
    return [first + i * every for i in range(n)]
