"""gpt_oss_20b's own config sections (defaults: the MLPerf reference, GPT-OSS 20B pretraining on C4)."""
from __future__ import annotations

import dataclasses

from harness.config import field


@dataclasses.dataclass
class DataConfig:
    source: str = field("synthetic", choices=("synthetic", "indexed"))
    data_dir: str = field("", doc="indexed: folder holding the Megatron .bin/.idx pairs")
    train_prefix: str = field("c4-train.en_6_text_document", doc="indexed: <prefix>.bin/.idx of the training set")
    eval_prefix: str = field("c4-validation-91205-samples.en_text_document",
                             doc="indexed: <prefix>.bin/.idx of the validation set (first eval_samples rows)")
    seq_length: int = field(8192, min=8, doc="tokens per row (MLPerf max_sequence_length)")
    eod_id: int = field(0, min=0, doc="end-of-document token; loss is not taken where it is the input "
                        "(the reference's eod_mask_loss)")
    train_samples: int = field(0, min=0, doc="rows in one epoch (MLPerf train_samples); 0 = counted from "
                               "the data (indexed) or the synthetic corpus size")
    eval_samples: int = field(1024, min=1, doc="rows of the fixed eval set (closed: 1024)")
    eval_every_samples: int = field(0, min=0, doc="eval cadence in training samples (0 = the rules: "
                                    "ceil(12288 / global_batch_size) * global_batch_size)")
    shuffle_buffer: int = field(64, min=1)
    synthetic_seed: int = field(0, doc="fixes the synthetic language; the run seed fixes the order")
    synthetic_train_rows: int = field(4096, min=1, doc="synthetic: rows in one epoch")
    synthetic_doc_min: int = field(64, min=2, doc="synthetic: shortest document, EOD included")
    synthetic_doc_max: int = field(256, min=2, doc="synthetic: longest document, EOD included")
    synthetic_main_prob: float = field(0.8, min=0.0, max=1.0, doc="synthetic: probability of a token's "
                                       "main successor (the rest is spread over synthetic_branching - 1)")
    synthetic_branching: int = field(4, min=1, doc="synthetic: successors per token")


@dataclasses.dataclass
class ModelConfig:
    vocab_size: int = field(128256, min=8, doc="Llama-3.1 tokenizer (the reference's output layer)")
    hidden_size: int = field(2880, min=8)
    num_layers: int = field(24, min=1, doc="even layers use the sliding window, odd layers full attention")
    num_heads: int = field(64, min=1, doc="query heads")
    num_kv_heads: int = field(8, min=1, doc="key/value heads (grouped-query attention)")
    head_dim: int = field(64, min=2)
    rope_base: float = field(150000.0, min=1.0)
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
    load_balancing_coef: float = field(0.0, min=0.0, doc="Switch/GShard load-balancing loss weight (0 = off, "
                                       "the reference)")
    router_z_loss_coef: float = field(0.0, min=0.0, doc="ST-MoE router z-loss weight (0 = off, the reference)")
    norm_epsilon: float = field(1e-6, min=0.0)
    init_stddev: float = field(0.008, min=0.0)


@dataclasses.dataclass
class OptimizerConfig:
    base_learning_rate: float = field(4e-4, min=0.0)
    end_learning_rate: float = field(4e-5, min=0.0)
    warmup_steps: int = field(128, min=0)
    max_steps: int = field(1_200_000, min=1, doc="length of the cosine (MLPerf max_steps); decay steps are "
                           "max_steps - warmup_steps. The run stops at the target long before")
    beta_1: float = field(0.9, min=0.0, max=1.0)
    beta_2: float = field(0.95, min=0.0, max=1.0)
    epsilon: float = field(1e-5, min=0.0)
    weight_decay: float = field(0.1, min=0.0)
    clip_norm: float = field(1.0, min=0.0, doc="clip gradients by global norm (0 = off)")
    exclude_from_decay: list[str] = field(default_factory=lambda: [r"norm", r"/bias$"],
                                          doc="regexes of variable paths without weight decay")
