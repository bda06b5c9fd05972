"""GPT-OSS's cost for `mlperf-harness plan`: multiply-adds per row of `data.seq_length` tokens, counted from
the config.

Per token and layer: the q/k/v/o projections h*hd*(2*heads + 2*kv_heads); attention scores and context
2*span*heads*hd, where span is the sliding window on sliding layers and half the row (causal) on full ones;
the router h*E; the k active SwiGLU experts 3*h*eh each (gate, up, down). Per token: the LM head h*V. Only
the k routed experts count (dropless top-k: the other experts do no work on the token). The architecture
options (q/k norm, sinks, biases, the clamped GLU, YaRN) add no multiply-adds worth counting (norms, adds,
one more softmax logit per query) but their parameters are counted (`option_params`). GPT-OSS 20B at 8192
tokens counts about 3.8 G multiply-adds per token forward. Training = 3 x forward; eval: the forward pass.
This is the model's useful work (what MFU counts), a lower bound of what the harness's implementation hands
XLA (the sorted MoE dispatch's padding blocks and dense full-row attention add about 19% at the reference;
the one-hot `dense` dispatch computes every slot, and so does `alltoall`: dropless, each expert's capacity
is the whole routing group, experts / k times the routed work; with a capacity factor cf, about cf times):
--calibrate absorbs the difference.
Everything else (bytes, tensor-parallel and FSDP collectives, the eval split and cadence) is the decoder LMs'
shared cost, benchmarks/lm/cost.py; expert-parallel all-to-all traffic is not modelled (per layer and
device, each way: experts x groups x capacity x hidden values per row, `moe.MoE._alltoall`'s buffer).
"""
from __future__ import annotations

from harness.plan.cost import CostModel, ModelCost

from benchmarks.lm.cost import (CONVERGE_UNIT, decoder_activation_bytes, decoder_macs_and_params, decoder_model_cost,
                                kept_activation_bytes, rules_eval_positions)
from benchmarks.lm.rules import PRETRAINING


def option_params(m) -> int:
    """Parameters per layer of the architecture options that are on (benchmarks/gpt_oss_20b/config.py)."""
    h, d = m.hidden_size, m.head_dim
    count = 0
    if m.qk_norm:
        count += 2 * d                                                # query and key RMSNorm weights
    if m.attention_sinks:
        count += m.num_heads
    if m.attention_bias:
        count += d * (m.num_heads + 2 * m.num_kv_heads) + h           # q, k, v and output biases
    if m.router_bias:
        count += m.num_experts
    if m.expert_bias:
        count += m.num_experts * (2 * m.expert_hidden + h)            # gate, up and down biases
    return count


def forward_macs_and_params(cfg) -> tuple[float, int]:
    """Multiply-adds per row (seq_length tokens) and the parameter count."""
    m, s = cfg.model, cfg.data.seq_length
    h, experts, eh = m.hidden_size, m.num_experts, m.expert_hidden
    layers_sliding = (m.num_layers + 1) // 2  # even layers (0, 2, ...) slide, odd ones attend fully
    full_span = min(m.full_attention_span or s, s) / 2.0
    keys = layers_sliding * min(m.sliding_window, s) + (m.num_layers - layers_sliding) * full_span
    return decoder_macs_and_params(cfg, keys, h * experts + m.experts_per_token * 3 * h * eh,
                                   h * experts + experts * 3 * h * eh + option_params(m))


def model_cost(cfg) -> ModelCost:
    macs, params = forward_macs_and_params(cfg)
    return decoder_model_cost(
        cfg, "gpt_oss_20b", macs, params,
        "counted (benchmarks/gpt_oss_20b/cost.py: projections, windowed/causal attention, k active experts, LM head)",
        notes="expert-parallel all-to-all traffic (experts on the data axis) not modelled")


def _window_keys(seq: int, window: int, block: int) -> int:
    """Keys one query's scores span in benchmarks/lm/attention.py's blockwise attention (its block_plan)."""
    if window >= seq or block >= seq:
        return seq
    return (-(-(window - 1) // block) + 1) * block


def train_activation_bytes(cfg, rows: int) -> int:
    """Host bytes of the train step beyond the variables (benchmarks/lm/cost.py): sliding layers' scores span
    their window's blocks, full layers' the row (or full_attention_span's blocks); each token keeps its
    routed experts' hidden units (the dispatch's buffers are not counted: a lower bound). The options: q/k
    norm keeps the normalized queries and keys; sinks a fourth copy of the scores (the scores with the sink
    column, then the probabilities without it); the clamped GLU four more copies of the hidden units
    (clamped gate and up, alpha x gate, up + offset); biases nothing the projections do not keep already."""
    m, s = cfg.model, cfg.data.seq_length
    sliding = (m.num_layers + 1) // 2
    full = _window_keys(s, m.full_attention_span or s, m.attention_block)
    keys = sliding * _window_keys(s, m.sliding_window, m.attention_block) + (m.num_layers - sliding) * full
    glu_copies = 5 + 2 * (m.swiglu_limit > 0) + (m.swiglu_alpha != 1.0) + (m.swiglu_up_offset != 0.0)
    return decoder_activation_bytes(cfg, rows, keys, m.experts_per_token * m.expert_hidden + m.num_experts,
                                    extra_units=m.head_dim * (m.num_heads + m.num_kv_heads) if m.qk_norm else 0,
                                    score_copies=3 + m.attention_sinks, ffn_copies=glu_copies)


COST = CostModel(model_cost, rules_eval_positions(PRETRAINING), CONVERGE_UNIT,
                 train_activation_bytes=train_activation_bytes, kept_activation_bytes=kept_activation_bytes)
