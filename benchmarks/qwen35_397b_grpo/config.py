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


@dataclasses.dataclass
class DataConfig:
    """Where the tasks come from. r2e_gym: the reference's R2E-Gym tasks (685 training, 251 validation), run in
    its Apptainer containers by an OpenHands agent: not built here, so refused. synthetic: the in-process toy
    task (benchmarks/qwen35_397b_grpo/environment.py KeyedAnswerTask), a smoke."""
    source: str = field("r2e_gym", choices=("r2e_gym", "synthetic"))
    data_dir: str = field("", doc="r2e_gym: folder holding the reference's train and validation jsonl files")
    eval_tasks: int = field(251, min=1, doc="held-out validation tasks (MLPerf eval_samples; closed 251)")
    synthetic_keys: int = field(8, min=2, doc="synthetic: keys (and answers) of the toy task")
    synthetic_seed: int = field(0, doc="synthetic: fixes the hidden answers and the held-out split")


@dataclasses.dataclass
class OptimizerConfig:
    """Adam(W) with a constant LR, no warmup, a global-norm clip over the trained weights (the frozen router
    excluded): NeMo-RL@3fca04c9 grpo_qwen35_397b_swe_openhands_async_gbs256.yaml megatron_cfg.optimizer.
    The closed values depend on the global batch (1e-6 x sqrt(GBS / 256), clip 0.125 x sqrt(256 / GBS));
    0 here means them."""
    base_learning_rate: float = field(0.0, min=0.0, doc="0 = 1e-6 x sqrt(GBS / 256)")
    clip_norm: float = field(0.0, min=0.0, doc="0 = 0.125 x sqrt(256 / GBS)")
    beta_1: float = field(0.9, min=0.0, max=1.0)
    beta_2: float = field(0.999, min=0.0, max=1.0)
    epsilon: float = field(1e-8, min=0.0)
    weight_decay: float = field(0.0, min=0.0)


@dataclasses.dataclass
class GrpoConfig:
    """The rollout loop: NeMo-RL@3fca04c9 grpo_qwen35_397b_swe_openhands_async.yaml (grpo, policy.generation,
    grpo.validation_generation) and the 6.1.0 checker's eval schedule."""
    num_generations_per_prompt: int = field(16, min=1, doc="G: rollouts per task, one group")
    max_steps: int = field(30, min=1, doc="the step budget (logged max_steps); the run aborts when spent")
    max_trajectory_tokens: int = field(65536, min=2, doc="a trajectory's total token cap (MLPerf "
                                       "max_sequence_length); one that reaches it is masked from the loss")
    max_new_tokens: int = field(65536, min=1, doc="tokens generated per turn at most")
    first_eval_step: int = field(0, min=0, doc="the first eval follows this step (0 = the rules: "
                                 "ceil(2.5 + 3840 / GBS))")
    eval_every_steps: int = field(1, min=1, doc="then an eval every this many steps (the rules: 1)")
    eval_generations: int = field(4, min=1, doc="rollouts per validation task (pass@k's k; the rules: 4)")
    train_temperature: float = field(1.0, min=0.0)
    train_top_p: float = field(1.0, min=0.0, max=1.0)
    eval_temperature: float = field(0.1, min=0.0)
    eval_top_p: float = field(0.95, min=0.0, max=1.0)
    generation_slots: int = field(64, min=1, doc="rows per generator call (the engine's batch)")
