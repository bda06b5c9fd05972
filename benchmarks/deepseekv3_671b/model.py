"""DeepSeek-V3 on the decoder LMs' shared stack (benchmarks/lm/decoder.py): multi-head latent attention with
YaRN RoPE in every layer (benchmarks/lm/mla.py), a dense SwiGLU feed-forward in the first
`first_dense_layers` layers and the DeepSeek MoE (moe.py) after them; untied embeddings, RMSNorm pre-norm.
Attention crosses documents and positions never reset (the reference's data settings). Named dimensions:
`heads`, `experts`, `ff` and `vocab`."""
from __future__ import annotations

from harness.runtime.base import Runtime

from benchmarks.deepseekv3_671b.config import ModelConfig
from benchmarks.deepseekv3_671b.moe import DeepseekMoE
from benchmarks.lm.decoder import Decoder
from benchmarks.lm.ffn import SwiGLU
from benchmarks.lm.mla import MLAttention

NAME = "deepseek"  # the decoder's variable path prefix


class DeepseekV3(Decoder):
    """Each layer's extras: None for a dense layer, its MoE `Routing` for the others."""

    def __init__(self, runtime: Runtime, seed: int, cfg: ModelConfig, seq: int) -> None:
        super().__init__(runtime, NAME, seed, cfg, seq)

    def attention(self, path: str, layer: int) -> MLAttention:
        c = self.cfg
        return MLAttention(self.runtime, path, self.seed, c.hidden_size, c.mla(), c.rope_base, c.rope_scaling(),
                           c.norm_epsilon, c.init_stddev, c.output_stddev())

    def ffn(self, path: str, layer: int) -> SwiGLU | DeepseekMoE:
        c = self.cfg
        if c.is_moe(layer):
            return DeepseekMoE(self.runtime, path, self.seed, c)
        return SwiGLU(self.runtime, path, self.seed, c.hidden_size, c.ffn_hidden, c.init_stddev, c.output_stddev())
