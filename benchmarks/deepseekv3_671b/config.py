"""deepseekv3_671b's config sections (defaults: DeepSeek-V3 671B as the MLPerf reference builds it from the
checkpoint's config.json, deepseek-ai/DeepSeek-V3@9b4e978:inference/configs/config_671B.json, through
NVIDIA-NeMo/Megatron-Bridge@21b02e0:src/megatron/bridge/recipes/deepseek/deepseek_v3.py)."""
from __future__ import annotations

import dataclasses

from harness.config import field

from benchmarks.lm import config as lm
from benchmarks.lm.config import DecoderModelConfig
from benchmarks.lm.mla import DeepseekYarn, MlaShape

# transformers' DeepseekV3TopkRouter scores a group by its top 2 experts whatever k and topk_group
# (huggingface/transformers v5.24.0: src/transformers/models/deepseek_v3/modeling_deepseek_v3.py, `.topk(2`)
TRANSFORMERS_GROUP_TOP = 2


@dataclasses.dataclass
class DataConfig(lm.DataConfig):
    """The decoder LMs' C4 data at the reference's rows of 4096 tokens (mlcommons/training@aa344c7:
    llm_moe_pretraining/nemo/pretrain_deepseek_v3_671b.py)."""
    seq_length: int = field(4096, min=8, doc="tokens per row (MLPerf max_sequence_length; the reference: 4096)")
    eval_every_samples: int = field(0, min=0, doc="eval cadence in training samples (0 = the rules: after every "
                                    "step, global_batch_size)")
    first_eval_step: int = field(-1, min=-1, doc="the step after which the first eval runs (then every "
                                 "eval_every_samples); -1: closed, the rules' (floor(42 + 24576 / gbs) when the "
                                 "run is checked under 6.1.0, else step 1), open, the first eval_every_samples")


@dataclasses.dataclass
class OptimizerConfig(lm.OptimizerConfig):
    """AdamW as the reference sets it (mlcommons/training@aa344c7:llm_moe_pretraining/nemo/, its schedule
    NVIDIA/Megatron-LM@b0cc270:megatron/core/optimizer_param_scheduler.py): LR 2.4e-5 x sqrt(GBS / 16384)
    (the default is GBS 16384's), 4 warmup steps, cosine over 12000 - 4 steps to 1e-8, epsilon 1e-8; weight decay logged
    as 0.1 (the reference's scheduler applies 0.033)."""
    base_learning_rate: float = field(2.4e-5, min=0.0)
    end_learning_rate: float = field(1e-8, min=0.0)
    warmup_steps: int = field(4, min=0)
    max_steps: int = field(12000, min=1, doc="length of the cosine (decay steps: max_steps - warmup_steps)")
    epsilon: float = field(1e-8, min=0.0)
    applied_weight_decay: float = field(-1.0, min=-1.0, doc="the decoupled decay AdamW applies when it differs "
                                        "from the logged weight_decay (the reference logs 0.1 and its scheduler "
                                        "applies 0.033); negative = weight_decay")

    def applied_decay(self) -> float:
        return self.weight_decay if self.applied_weight_decay < 0 else self.applied_weight_decay


@dataclasses.dataclass
class ModelConfig(DecoderModelConfig):
    """The decoder's fields at DeepSeek-V3 671B, then MLA's, the dense-first layers' and the MoE's."""
    vocab_size: int = field(129280, min=8, doc="DeepSeek-V3's table (the Llama-3.1 tokenizer uses the first "
                            "128256 rows; every row is in the softmax)")
    hidden_size: int = field(7168, min=8)
    num_layers: int = field(61, min=1, doc="decoder layers, dense-first (MTP not counted)")
    num_heads: int = field(128, min=1, doc="query heads (MLA: every head has its own keys and values)")
    num_kv_heads: int = field(128, min=1, doc="MLA: equal to num_heads (the `heads` split)")
    head_dim: int = field(128, min=2, doc="unused by MLA (see qk_nope_head_dim, qk_rope_head_dim, v_head_dim)")
    rope_base: float = field(10000.0, min=1.0)
    norm_epsilon: float = field(1e-6, min=0.0)
    init_stddev: float = field(0.006, min=0.0, doc="init_method_std of the MLPerf recipe (irrelevant when "
                               "every weight is loaded)")
    q_lora_rank: int = field(1536, min=1, doc="MLA: query latent width")
    kv_lora_rank: int = field(512, min=1, doc="MLA: key/value latent width")
    qk_nope_head_dim: int = field(128, min=1, doc="MLA: per-head query/key dims without RoPE")
    qk_rope_head_dim: int = field(64, min=2, doc="MLA: per-head query dims with RoPE, and the shared rope key")
    v_head_dim: int = field(128, min=1, doc="MLA: per-head value dims")
    rope_scaling_factor: float = field(40.0, min=1.0, doc="YaRN factor (1 = plain RoPE)")
    rope_original_context: int = field(4096, min=1, doc="YaRN original_max_position_embeddings")
    rope_beta_fast: float = field(32.0, min=0.0)
    rope_beta_slow: float = field(1.0, min=0.0)
    rope_mscale: float = field(1.0, min=0.0, doc="YaRN mscale (cos/sin scaled by mscale / mscale_all_dim)")
    rope_mscale_all_dim: float = field(1.0, min=0.0, doc="YaRN mscale_all_dim (softmax scale x its mscale^2)")
    ffn_hidden: int = field(18432, min=1, doc="dense layers' SwiGLU hidden units")
    first_dense_layers: int = field(3, min=0, doc="first_k_dense_replace: layers before this are dense")
    num_experts: int = field(256, min=1, doc="routed experts per MoE layer")
    experts_per_token: int = field(8, min=1)
    expert_hidden: int = field(2048, min=1, doc="SwiGLU hidden units of each routed expert")
    shared_experts: int = field(1, min=0, doc="shared experts (one SwiGLU of shared_experts x expert_hidden)")
    expert_groups: int = field(8, min=1, doc="n_group: experts in contiguous groups")
    groups_per_token: int = field(4, min=1, doc="topk_group: a token's experts come from this many groups")
    group_score_experts: int = field(0, min=0, doc="a group's score sums its top this many expert scores; 0: "
                                     "experts_per_token / groups_per_token (Megatron's group_limited_topk, the "
                                     "MLPerf reference), or 2 with model.init_checkpoint (transformers' "
                                     "DeepseekV3TopkRouter, the library that writes the checkpoint); the two "
                                     "agree at DeepSeek-V3's 8 / 4")
    routed_scaling_factor: float = field(2.5, min=0.0, doc="the normalized gate weights x this")
    moe_dispatch: str = field("alltoall", choices=("alltoall", "dense"), doc="alltoall: each row's assignments "
                              "gathered into [experts, capacity] slots and sent to the devices that own their "
                              "experts by an all-to-all over the experts' mesh axis, and back (expert weights "
                              "never gathered); dense: every expert computes every token, weighted by the "
                              "(mostly zero) gates (exact, experts / k times the work: the small reference)")
    capacity_factor: float = field(0.0, min=0.0, doc="alltoall: 0 = dropless (the reference; each expert's "
                                   "capacity is the row); else each expert takes ceil(cf * seq * k / experts) "
                                   "of a row's tokens and drops the rest (counted in eval)")
    seq_aux_loss_coef: float = field(0.01, min=0.0, doc="sequence-level load-balancing loss weight (the "
                                     "reference's moe_aux_loss_coeff)")
    mtp_layers: int = field(1, min=0, max=1, doc="multi-token prediction depth (the reference: 1; 0 = off)")
    mtp_loss_weight: float = field(0.1, min=0.0, doc="the MTP loss's weight in the training loss")
    bias_update_rate: float = field(1e-3, min=0.0, doc="aux-loss-free balancing: after each step's gradients, "
                                    "each expert bias += rate * sign(mean count - the expert's count), counted over "
                                    "the routing of every training token of the global batch (0 = off)")

    def mla(self) -> MlaShape:
        return MlaShape(self.num_heads, self.q_lora_rank, self.kv_lora_rank, self.qk_nope_head_dim,
                        self.qk_rope_head_dim, self.v_head_dim)

    def rope_scaling(self) -> DeepseekYarn | None:
        if self.rope_scaling_factor <= 1:
            return None
        return DeepseekYarn(self.rope_scaling_factor, self.rope_original_context, self.rope_beta_fast,
                            self.rope_beta_slow, True, self.rope_mscale, self.rope_mscale_all_dim)

    def group_score_top(self) -> int:
        """The experts summed to score a group (model.group_score_experts, resolved)."""
        if self.group_score_experts:
            return self.group_score_experts
        if self.init_checkpoint:
            return TRANSFORMERS_GROUP_TOP
        return max(1, self.experts_per_token // self.groups_per_token)

    def is_moe(self, layer: int) -> bool:
        return layer >= self.first_dense_layers
