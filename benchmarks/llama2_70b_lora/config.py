"""llama2_70b_lora's config sections (defaults: the MLPerf reference: Llama 2 70B, rows of 8192 tokens, LoRA r 16
alpha 32 dropout 0.1 on the fused qkv and o projections, AdamW 0.9/0.999/1e-8, wd 1e-4, clip 0.3, a cosine
to 0 over max_steps without warmup)."""
from __future__ import annotations

import dataclasses

from harness.config import field

from benchmarks.lm.config import OptimizerConfig as DecoderOptimizerConfig
from benchmarks.lm.llama import LlamaModelConfig


@dataclasses.dataclass
class ModelConfig(LlamaModelConfig):  # Llama 2 70B (regisss/llama2-70b-fused-qkv-mlperf config.json)
    vocab_size: int = field(32000, min=8, doc="Llama-2 SentencePiece tokenizer")
    hidden_size: int = field(8192, min=8)
    num_layers: int = field(80, min=1)
    num_heads: int = field(64, min=1)
    num_kv_heads: int = field(8, min=1)
    head_dim: int = field(128, min=2)
    ffn_hidden: int = field(28672, min=1)
    rope_base: float = field(10000.0, min=1.0)
    rope_scaling_factor: float = field(0.0, min=0.0, doc="Llama 2: no RoPE scaling (positions up to 8192 "
                                       "extrapolated as the reference does)")
    lora_rank: int = field(16, min=1, doc="LoRA rank r (closed: 16)")
    lora_alpha: float = field(32.0, min=0.0, doc="LoRA alpha; the adapters' output is scaled by alpha / r")
    lora_dropout: float = field(0.1, min=0.0, max=1.0, doc="dropout on the adapters' input")
    frozen_dtype: str = field("bfloat16", choices=("bfloat16", "float32"),
                              doc="storage of the frozen base weights (RMSNorm weights stay float32, as the "
                              "reference's peft_module_casting_to_bf16 keeps them)")


@dataclasses.dataclass
class OptimizerConfig(DecoderOptimizerConfig):
    base_learning_rate: float = field(4e-4, min=0.0)
    end_learning_rate: float = field(0.0, min=0.0)
    warmup_steps: int = field(0, min=0)
    max_steps: int = field(1024, min=1, doc="length of the cosine (MLPerf opt_learning_rate_training_steps)")
    beta_1: float = field(0.9, min=0.0, max=1.0)
    beta_2: float = field(0.999, min=0.0, max=1.0)
    epsilon: float = field(1e-8, min=0.0)
    weight_decay: float = field(1e-4, min=0.0)
    clip_norm: float = field(0.3, min=0.0, doc="clip the adapters' gradients by global norm (0 = off)")
    exclude_from_decay: list[str] = field(default_factory=list, doc="regexes of variable paths without weight "
                                          "decay (the reference decays every adapter weight)")
