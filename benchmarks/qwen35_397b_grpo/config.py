"""qwen35_397b_grpo's model section (defaults: Qwen3.5-397B-A17B's text model as transformers builds it,
huggingface/transformers v5.6.0: src/transformers/models/qwen3_5_moe/configuration_qwen3_5_moe.py, with the sizes
of mlcommons/training@aa344c7:llm_post_training/README.md). Any size builds from these fields; names in
brackets are transformers' config keys."""
from __future__ import annotations

import dataclasses

from harness.config import field

from benchmarks.lm.config import DecoderModelConfig
from benchmarks.qwen35_397b_grpo.deltanet import DeltaNetShape

FULL_ATTENTION, LINEAR_ATTENTION = "full_attention", "linear_attention"   # transformers' layer_types


@dataclasses.dataclass
class ModelConfig(DecoderModelConfig):
    vocab_size: int = field(248320, min=8)
    hidden_size: int = field(4096, min=8)
    num_layers: int = field(60, min=1, doc="[num_hidden_layers] decoder layers, each a sequence mixer and a MoE")
    num_heads: int = field(32, min=1, doc="[num_attention_heads] gated attention's query heads")
    num_kv_heads: int = field(2, min=1, doc="[num_key_value_heads] gated attention's key/value heads")
    head_dim: int = field(256, min=2, doc="gated attention's head size")
    rope_base: float = field(1e7, min=1.0, doc="[rope_theta]")
    rotary_dim: int = field(64, min=2, doc="RoPE turns the first this many dims of each query/key head, the rest "
                            "pass (head_dim x partial_rotary_factor 0.25; M-RoPE is plain RoPE on text)")
    norm_epsilon: float = field(1e-6, min=0.0, doc="[rms_norm_eps] every norm's")
    full_attention_interval: int = field(4, min=1, doc="layer i is gated attention when (i + 1) % this == 0, "
                                         "else Gated DeltaNet")
    linear_num_key_heads: int = field(16, min=1)
    linear_num_value_heads: int = field(64, min=1)
    linear_key_head_dim: int = field(128, min=1)
    linear_value_head_dim: int = field(128, min=1)
    linear_conv_kernel_dim: int = field(4, min=1)
    deltanet_form: str = field("chunked", choices=("chunked", "recurrent"), doc="the Gated DeltaNet rule in a "
                               "forward over whole rows (training, prefill): chunks of 64 or token by token; the "
                               "same numbers")
    num_experts: int = field(512, min=1)
    experts_per_token: int = field(10, min=1, doc="[num_experts_per_tok] softmax over all experts, top-k, "
                                   "renormalised over the k")
    expert_hidden: int = field(1024, min=1, doc="[moe_intermediate_size] SwiGLU hidden units of each expert")
    shared_expert_hidden: int = field(1024, min=0, doc="[shared_expert_intermediate_size] the shared SwiGLU "
                                      "expert's hidden units (0: none), scaled by sigmoid(x . w_gate)")
    freeze_router: bool = field(True, doc="the router weight takes no gradient (the reference's "
                                "freeze_moe_router); gradients still reach the input through the gate weights")
    moe_dispatch: str = field("alltoall", choices=("alltoall", "dense"), doc="alltoall: each row's assignments "
                              "in [experts, capacity] slots, sent to the experts' devices and back "
                              "(benchmarks/lm/moe_dispatch.py); dense: every expert computes every token, "
                              "weighted by the (mostly zero) gates (exact: the small reference)")
    capacity_factor: float = field(0.0, min=0.0, doc="alltoall: 0 = dropless (the reference); else each expert "
                                   "takes ceil(cf * seq * k / experts) of a row's tokens and drops the rest")

    def layer_type(self, layer: int) -> str:
        return FULL_ATTENTION if (layer + 1) % self.full_attention_interval == 0 else LINEAR_ATTENTION

    def deltanet(self) -> DeltaNetShape:
        return DeltaNetShape(self.hidden_size, self.linear_num_key_heads, self.linear_num_value_heads,
                             self.linear_key_head_dim, self.linear_value_head_dim, self.linear_conv_kernel_dim,
                             self.norm_epsilon)
