"""gpt_oss_20b's own config sections (defaults: the MLPerf reference, GPT-OSS 20B pretraining on C4)."""
from __future__ import annotations

import dataclasses

from harness.config import field

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
    sliding_window: int = field(128, min=1, doc="a query sees this many tokens (itself included) on the "
                                "windowed layers")
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
    moe_dispatch: str = field("sorted", choices=("sorted", "dense"), doc="sorted: each row's assignments "
                              "sorted by expert into blocks of moe_block_size rows, one gathered expert weight "
                              "per block (compiled expert work <= assignments + experts x block); dense: one-hot "
                              "dispatch/combine einsums into [experts, capacity] slots (dropless: capacity = group)")
    moe_block_size: int = field(128, min=1, doc="sorted dispatch: rows per expert block (each expert's rows are "
                                "padded to a multiple of it; fewer blocks = fewer gathered weight copies)")
    moe_chunk_blocks: int = field(16, min=0, doc="sorted dispatch: blocks computed at a time, so only their "
                                  "gathered expert weight copies are live (the backward pass gathers them again); "
                                  "0 = all of a layer's blocks at once")
    load_balancing_coef: float = field(0.0, min=0.0, doc="Switch/GShard load-balancing loss weight (0 = off, "
                                       "the reference)")
    router_z_loss_coef: float = field(0.0, min=0.0, doc="ST-MoE router z-loss weight (0 = off, the reference)")
