"""The Llama decoder block family (Llama 2 and 3.x): grouped-query attention over the whole row with RoPE
(Llama 3.1's frequency scaling optional), a dense SwiGLU feed-forward, every weight normal(init_stddev) but the
attention output and down projections (Megatron's scaled output-layer init). A Llama benchmark is its config
defaults plus this block."""
from __future__ import annotations

import dataclasses

from harness.config import field
from harness.errors import HarnessError
from harness.nn.layers import RopeScaling

from benchmarks.lm.attention import Attention, Lora
from benchmarks.lm.config import DecoderModelConfig
from benchmarks.lm.decoder import Decoder
from benchmarks.lm.ffn import SwiGLU


@dataclasses.dataclass
class LlamaModelConfig(DecoderModelConfig):  # the decoder's fields (defaults: Llama 3.1 8B's), then Llama's
    ffn_hidden: int = field(14336, min=1, doc="SwiGLU hidden units")
    rope_scaling_factor: float = field(8.0, min=0.0, doc="Llama 3.1 RoPE scaling (rope_type llama3); 0 = off")
    rope_low_freq_factor: float = field(1.0, min=0.0)
    rope_high_freq_factor: float = field(4.0, min=0.0)
    rope_original_context: int = field(8192, min=1, doc="original_max_position_embeddings of the scaling")

    def rope_scaling(self) -> RopeScaling | None:
        if not self.rope_scaling_factor:
            return None
        return RopeScaling(self.rope_scaling_factor, self.rope_low_freq_factor, self.rope_high_freq_factor,
                           self.rope_original_context)

    def validate(self) -> None:
        """What the block needs of the config beyond its split sizes (DecoderLMWorkload.SPLIT_DIMS)."""
        if self.rope_scaling_factor and self.rope_high_freq_factor <= self.rope_low_freq_factor:
            raise HarnessError(f"model.rope_high_freq_factor={self.rope_high_freq_factor:g} must exceed "
                               f"model.rope_low_freq_factor={self.rope_low_freq_factor:g} (Llama 3.1 RoPE scaling)")


# The sizes of the block a layout may split, beside the decoder's own (DecoderLMWorkload.SPLIT_DIMS).
LLAMA_SPLIT_DIMS = {"model.ffn_hidden": "ff"}


class Llama(Decoder):
    """Full causal attention (the window is the row, one dense block: the reference resets no mask at
    documents) and a dense SwiGLU in every layer; `lora`: adapters on every layer's attention (one Lora
    shared by all, so one seed set on it reaches every layer)."""

    def __init__(self, runtime, name: str, seed: int, cfg, seq: int, lora: Lora | None = None) -> None:
        self.lora = lora
        super().__init__(runtime, name, seed, cfg, seq)

    def attention(self, path: str, layer: int) -> Attention:
        c = self.cfg
        return Attention(self.runtime, path, self.seed, c, window=self.seq, block=self.seq,
                         rope_scaling=c.rope_scaling(), output_stddev=c.output_stddev(), lora=self.lora,
                         layer=layer)

    def ffn(self, path: str, layer: int) -> SwiGLU:
        c = self.cfg
        return SwiGLU(self.runtime, path, self.seed, c.hidden_size, c.ffn_hidden, c.init_stddev, c.output_stddev())
