"""DeepSeek-V3's cost for `mlperf-harness plan` and the dry run's useful FLOPs: multiply-adds per row of
`data.seq_length` tokens, counted from the config.

Per token and layer: MLA's projections h*q_lora + q_lora*H*(nope + rope) + h*(kv_lora + rope) +
kv_lora*H*(nope + v) + H*v*h, and causal attention's scores and context H*(nope + rope + v) per key a query
sees (half the row on average); the dense layers' SwiGLU 3*h*ff; the MoE layers' router h*E, the k routed
experts 3*h*eh each and the shared expert 3*h*(shared x eh). Per token: the LM head h*V. Multi-token
prediction adds its projection 2*h*h, one MLA + MoE layer and the head again. Only the k routed experts count:
the useful work, what MFU counts. What XLA is handed for the routed experts is their slots (`routed_slots` per
token): dropless (model.capacity_factor 0, the reference's, either dispatch) every expert computes every
token, E / k times the useful routed work (4x at the smoke, 32x at the reference's 256 top-8); a capacity
factor cf makes it about cf x; the dry run's compiled count shows it. Training = 3 x forward; eval: the
forward pass. The expert bias is no parameter (not trained). At the tiny configuration of the smoke and
the transformers golden (scripts/make_hf_goldens.py) the count is 284,416 parameters and 78,704 more for MTP; at
the full size (the checkpoint's config.json) 671,026,404,352 and 11,610,067,968.
"""
from __future__ import annotations

from harness.plan.cost import CostModel, ModelCost

from benchmarks.deepseekv3_671b.rules import RULES
from benchmarks.lm.cost import (CONVERGE_UNIT, decoder_activation_bytes, decoder_model_cost, kept_activation_bytes,
                                rules_eval_positions)
from benchmarks.lm.moe_capacity import expert_capacity


def attention_macs_and_params(m) -> tuple[int, int]:
    """MLA's projection multiply-adds per token and its parameters (norms included) per layer."""
    h, heads, ql, kvl = m.hidden_size, m.num_heads, m.q_lora_rank, m.kv_lora_rank
    qk = m.qk_nope_head_dim + m.qk_rope_head_dim
    macs = (h * ql + ql * heads * qk + h * (kvl + m.qk_rope_head_dim)
            + kvl * heads * (m.qk_nope_head_dim + m.v_head_dim) + heads * m.v_head_dim * h)
    return macs, macs + ql + kvl


def forward_macs_and_params(cfg) -> tuple[float, int]:
    """Multiply-adds per row (seq_length tokens) and the parameter count."""
    m, s = cfg.model, cfg.data.seq_length
    h, v, e, eh = m.hidden_size, m.vocab_size, m.num_experts, m.expert_hidden
    attn_macs, attn_params = attention_macs_and_params(m)
    moe_layers = max(0, m.num_layers - m.first_dense_layers)
    dense_layers = m.num_layers - moe_layers
    dense = 3 * h * m.ffn_hidden
    shared = 3 * h * m.shared_experts * eh
    moe_macs = h * e + m.experts_per_token * 3 * h * eh + shared
    moe_params = h * e + e * 3 * h * eh + shared
    scores = m.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) * s / 2.0
    per_token = m.num_layers * (attn_macs + scores) + dense_layers * dense + moe_layers * moe_macs + h * v
    params = 2 * v * h + m.num_layers * (attn_params + 2 * h) + dense_layers * dense + moe_layers * moe_params + h
    if m.mtp_layers:  # eh_proj, one MLA + MoE layer, the shared head again; enorm, hnorm, its final norm
        per_token += 2 * h * h + attn_macs + scores + moe_macs + h * v
        params += 2 * h * h + attn_params + 2 * h + moe_params + 3 * h
    return float(per_token * s), int(params)


def routed_slots(cfg) -> float:
    """Routed-expert rows computed per token: every expert under the dense dispatch, else the all-to-all
    buffer's experts x capacity per row over its tokens (dropless: every expert; cf: about cf x k). The
    capacity is the dispatch's (benchmarks/lm/moe_capacity.py, TensorFlow-free)."""
    m, s = cfg.model, cfg.data.seq_length
    if m.moe_dispatch == "dense" or m.capacity_factor <= 0:
        return float(m.num_experts)
    capacity = expert_capacity(s, m.num_experts, m.experts_per_token, m.capacity_factor)
    return m.num_experts * capacity / s


def model_cost(cfg) -> ModelCost:
    macs, params = forward_macs_and_params(cfg)
    return decoder_model_cost(
        cfg, "deepseekv3_671b", macs, params,
        "counted (benchmarks/deepseekv3_671b/cost.py: MLA, causal attention, dense SwiGLU, k routed + shared "
        "experts, LM head)",
        notes=f"expert-parallel all-to-all traffic not modelled; the routed experts compile "
              f"{routed_slots(cfg) / cfg.model.experts_per_token:.3g}x their useful work ({cfg.model.moe_dispatch} "
              f"dispatch, capacity_factor {cfg.model.capacity_factor:g})")


def train_activation_bytes(cfg, rows: int) -> int:
    """Host bytes of the train step beyond the variables (benchmarks/lm/cost.py): every query's scores span the
    row; the MoE layers keep the hidden units of every routed slot (`routed_slots`) and the shared expert's
    per token, the latents and the all-to-all buffers (a slot's hidden size, each way) besides."""
    m = cfg.model
    slots = routed_slots(cfg)
    units = max(m.ffn_hidden, (slots + m.shared_experts) * m.expert_hidden)
    latents = m.q_lora_rank + m.kv_lora_rank + m.num_heads * (2 * m.qk_nope_head_dim + m.qk_rope_head_dim
                                                              + 2 * m.v_head_dim)
    buffers = 2 * slots * m.hidden_size if m.moe_dispatch == "alltoall" else 0
    return decoder_activation_bytes(cfg, rows, m.num_layers * cfg.data.seq_length, units,
                                    extra_units=latents + buffers)


COST = CostModel(model_cost, rules_eval_positions(RULES), CONVERGE_UNIT, train_activation_bytes=train_activation_bytes,
                 kept_activation_bytes=kept_activation_bytes, routed_slots=routed_slots)
