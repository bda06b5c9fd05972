"""dlrmv4's cost for `mlperf-harness plan`, the dry run's useful FLOPs and the run's MFU: multiply-adds per sample
as benchmarks/dlrmv4/model.py computes them, on padded histories of S = history_length + 9 positions.

Per item position (history + candidate): the content, additional and action MLPs; per sample: 8 contextual
linears, the time combiner, the item MLP and the head. Per STU layer and position: the uvqk projection D x
H(2 qk + 2 uv) and the output 3 H uv x D; per layer the causal attention computed over the whole padded square,
S^2 H (qk + uv). Training = 3 x forward. Table lookups are data movement, not counted. At the reference's size
(S 4095) this is 154.6 GFLOP forward per sample and 15,243,057 dense parameters (the reference README's
figure, 315.7 GFLOP forward and backward at S 4096, counts the attention's causal half only).
"""
from __future__ import annotations

from harness import benchmark_rules as rules
from harness.plan.cost import CostModel, ModelCost

from benchmarks.dlrmv4 import rules as dlrm_rules

CONVERGE_UNIT = "samples"
NUM_CONTEXT, ACTION_BITS, TIME_FEATURES = 8, 3, 4
# Adam in float32 on the dense weights: read weight, gradient, m, v; write weight, m, v (28 B). The tables'
# row-wise Adagrad: the row-split lookup's gradient is dense over each device's rows, so every row is read and
# written each step (weight and gradient read, weight written: 12 B, the accumulator per row is negligible).
DENSE_OPTIMIZER_BYTES, TABLE_OPTIMIZER_BYTES = 28.0, 12.0
EVAL_FIXED_SECONDS = 0.05  # gathering the logits and the exact AUC's sort (assumption; --calibrate measures it)


def mlp(d_in: int, d_hid: int, d_out: int) -> tuple[int, int]:
    """(multiply-adds per row, parameters) of the reference's two-layer MLP with its two LayerNorms."""
    return d_in * d_hid + d_hid * d_out, d_in * d_hid + d_hid + 2 * d_hid + d_hid * d_out + d_out + 2 * d_out


def forward_macs_and_params(cfg) -> tuple[float, int, int]:
    """Multiply-adds of one sample's forward pass, the dense parameters and the tables' parameters."""
    m = cfg.model
    d, hid, a, h = m.embedding_dim, m.preprocessor_hidden_dim, m.action_embedding_dim, m.num_heads
    items, seq = m.history_length + 1, m.history_length + 1 + NUM_CONTEXT
    parts = [mlp(d, hid, d), mlp(2 * d, hid, d), mlp(ACTION_BITS * a, hid, d)]
    macs = items * sum(p[0] for p in parts) + NUM_CONTEXT * d * d
    params = sum(p[1] for p in parts) + ACTION_BITS * a * 2 + NUM_CONTEXT * (d * d + d)
    params += (m.num_position_buckets + m.num_time_buckets + 1) * d
    width = h * (2 * m.attention_dim + 2 * m.linear_dim)
    per_layer_tok = d * width + 3 * h * m.linear_dim * d
    macs += m.num_layers * (seq * per_layer_tok + seq * seq * h * (m.attention_dim + m.linear_dim))
    params += m.num_layers * (d * width + width + 3 * h * m.linear_dim * d + 2 * d + 2 * h * m.linear_dim)
    macs += (d + TIME_FEATURES) * d
    params += (d + TIME_FEATURES) * d + d + 2 * d
    item_macs, item_params = mlp(3 * d, m.item_hidden_dim, d)
    macs += item_macs + d * m.head_hidden_dim + m.head_hidden_dim
    params += item_params + d * m.head_hidden_dim + m.head_hidden_dim + 2 * m.head_hidden_dim + m.head_hidden_dim + 1
    tables = sum(m.tables.values()) * d
    return float(macs), int(params), int(tables)


def model_cost(cfg) -> ModelCost:
    macs, dense, tables = forward_macs_and_params(cfg)
    d = cfg.data
    train = d.train_samples or (d.synthetic_train_samples if d.source == "synthetic" else rules.DLRMV4_TRAIN_SAMPLES)
    evals = d.eval_samples or (d.synthetic_eval_samples if d.source == "synthetic" else rules.DLRMV4_EVAL_SAMPLES)
    return ModelCost(
        workload="dlrmv4", source="counted (benchmarks/dlrmv4/cost.py: MLPs, STU projections, padded attention)",
        train_flops_per_sample=3 * 2.0 * macs, eval_flops_per_sample=2.0 * macs, params=dense + tables,
        gradient_bytes=4.0 * dense,
        optimizer_bytes_per_param=(DENSE_OPTIMIZER_BYTES * dense + TABLE_OPTIMIZER_BYTES * tables) / (dense + tables),
        train_samples=train, eval_samples=evals,
        sample_unit=f"listen event with a history of up to {cfg.model.history_length} events",
        eval_fixed_seconds=EVAL_FIXED_SECONDS,
        notes=f"{dense:,} dense parameters (all-reduced) and {tables:,} table parameters (row-split, never "
              "all-reduced: each device updates its own rows)")


def eval_positions(cfg, upto: float, global_batch: int) -> list[float]:
    """The run's eval positions (benchmarks/dlrmv4/rules.py cadence) through the first at or past `upto`."""
    return dlrm_rules.cadence(cfg, global_batch).through(upto)


COST = CostModel(model_cost, eval_positions, CONVERGE_UNIT)
