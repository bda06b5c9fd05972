"""gpt_oss_20b's own config sections (defaults: the MLPerf reference, GPT-OSS 20B pretraining on C4).

The model defaults are what AMD's Primus/Megatron reference computes, the implementation that produced the
6.0.0/6.1.0 RCPs (docs/workloads/gpt_oss_20b.md, "Which gpt-oss"); the published gpt-oss architecture's
features (sinks, biases, the clamped GLU, YaRN) are options, off by default.
"""
from __future__ import annotations

import dataclasses

from harness.config import field
from harness.nn.layers import YarnScaling

from benchmarks.lm.ffn import Glu

from benchmarks.lm.config import DataConfig, DecoderModelConfig, OptimizerConfig  # noqa: F401  (its sections)


@dataclasses.dataclass
class ModelConfig(DecoderModelConfig):
    """The decoder's fields (benchmarks/lm/config.py) at GPT-OSS 20B, then its attention pattern and experts."""
    hidden_size: int = field(2880, min=8)
    num_layers: int = field(24, min=1, doc="even layers use the sliding window, odd layers full attention")
    num_heads: int = field(64, min=1, doc="query heads")
    head_dim: int = field(64, min=2)
    rope_base: float = field(150000.0, min=1.0)
    norm_epsilon: float = field(1e-6, min=0.0)
    init_stddev: float = field(0.008, min=0.0)
    sliding_window: int = field(129, min=1, doc="a query sees this many tokens (itself included) on the "
                                "windowed layers: 129 = the reference's Transformer Engine window_size (128, 0), keys "
                                "i-128..i; NeMo's (127, 0) and transformers' sliding_window 128 are 128")
    full_attention_span: int = field(0, min=0, doc="full layers: 0 = the whole row (dense); N > 0 = "
                                     "blockwise over the last N tokens, exact when documents never exceed N "
                                     "tokens and document_attention is on (checked against the data)")
    document_attention: bool = field(False, doc="attention never crosses a document boundary (Megatron "
                                     "reset_attention_mask; the reference leaves it off)")
    attention_block: int = field(128, min=1, doc="query block of the blockwise (windowed) attention")
    num_experts: int = field(32, min=1)
    experts_per_token: int = field(4, min=1, doc="top-k on the router logits, then a softmax over the k")
    expert_hidden: int = field(2880, min=1, doc="SwiGLU hidden units of each expert")
    moe_group_size: int = field(512, min=1, doc="tokens routed together (a group's capacity is shared)")
    capacity_factor: float = field(0.0, min=0.0, doc="0 = dropless (the reference); else each expert takes "
                                   "ceil(cf * group * k / experts) tokens per group and drops the rest")
    moe_dispatch: str = field("sorted", choices=("sorted", "dense", "alltoall"), doc="sorted: each row's "
                              "assignments sorted by expert into blocks of moe_block_size rows, one gathered expert "
                              "weight per block (compiled expert work <= assignments + experts x block); dense: "
                              "one-hot dispatch/combine einsums into [experts, capacity] slots (dropless: capacity = "
                              "group); alltoall: tokens gathered into [experts, capacity] slots and sent to the "
                              "devices that own their experts by an all-to-all over the experts' mesh axis, and "
                              "back (expert weights never gathered; dropless: capacity = group)")
    moe_block_size: int = field(128, min=1, doc="sorted dispatch: rows per expert block (each expert's rows are "
                                "padded to a multiple of it; fewer blocks = fewer gathered weight copies)")
    moe_chunk_blocks: int = field(16, min=0, doc="sorted dispatch: blocks computed at a time, so only their "
                                  "gathered expert weight copies are live (the backward pass gathers them again); "
                                  "0 = all of a layer's blocks at once")
    load_balancing_coef: float = field(0.0, min=0.0, doc="Switch/GShard load-balancing loss weight (0 = off, "
                                       "the reference)")
    router_z_loss_coef: float = field(0.0, min=0.0, doc="ST-MoE router z-loss weight (0 = off, the reference)")
    # The architecture's options: the reference (Primus/Megatron) has q/k norm and none of the rest; NVIDIA's
    # NeMo submission (v6.0 closed) has sinks, biases and the clamped GLU and no q/k norm; the published
    # gpt-oss (transformers GptOssForCausalLM) has those and YaRN.
    qk_norm: bool = field(True, doc="RMSNorm over head_dim of queries and keys before RoPE, one weight each per "
                          "layer (Megatron qk_layernorm: the reference inherits it from Primus's "
                          "deepseek_v2_base.yaml; NeMo and transformers: off)")
    attention_sinks: bool = field(False, doc="one learned logit per query head in every softmax denominator "
                                  "(transformers GptOssAttention.sinks; NeMo softmax_type learnable; zero init)")
    attention_bias: bool = field(False, doc="biases on the q/k/v/o projections (transformers attention_bias; "
                                 "Megatron add_bias_linear, as NeMo sets it; zero init)")
    router_bias: bool = field(False, doc="a bias on the router logits, before the top-k (transformers "
                                "GptOssTopKRouter.bias; Megatron router bias with add_bias_linear; zero init)")
    expert_bias: bool = field(False, doc="biases on each expert's gate, up and down projections; the down bias "
                                "is weighted by the gate like the rest of the expert's output (transformers "
                                "gate_up_proj_bias / down_proj_bias; Megatron add_bias_linear; zero init)")
    swiglu_alpha: float = field(1.0, min=0.0, doc="expert GLU: gate * sigmoid(alpha * gate) * (up + "
                                "swiglu_up_offset); 1 = silu, the reference; 1.702 = gpt-oss (quick_gelu)")
    swiglu_limit: float = field(0.0, min=0.0, doc="expert GLU: gate clamped to <= limit and up to [-limit, limit] "
                                "before the activation; 0 = no clamp, the reference; 7 = gpt-oss")
    swiglu_up_offset: float = field(0.0, doc="expert GLU: added to the up projection; 0 = the reference; 1 = "
                                    "gpt-oss (glu_linear_offset)")
    rope_type: str = field("default", choices=("default", "yarn"), doc="default: plain RoPE (the reference and "
                           "NeMo); yarn: YaRN as transformers computes it (the published gpt-oss)")
    rope_scaling_factor: float = field(32.0, min=1.0, doc="yarn: factor")
    rope_original_context: int = field(4096, min=1, doc="yarn: original_max_position_embeddings")
    rope_beta_fast: float = field(32.0, min=0.0, doc="yarn: beta_fast")
    rope_beta_slow: float = field(1.0, min=0.0, doc="yarn: beta_slow")
    rope_truncate: bool = field(False, doc="yarn: floor/ceil the correction range (gpt-oss: false)")

    def glu(self) -> Glu:
        return Glu(self.swiglu_alpha, self.swiglu_limit, self.swiglu_up_offset)

    def rope_scaling(self) -> YarnScaling | None:
        if self.rope_type != "yarn":
            return None
        return YarnScaling(self.rope_scaling_factor, self.rope_original_context, self.rope_beta_fast,
                           self.rope_beta_slow, self.rope_truncate)
