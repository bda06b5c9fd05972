"""llama31_8b's config sections (defaults: the MLPerf reference, Llama 3.1 8B pretraining on C4)."""
from __future__ import annotations

import dataclasses
import math

from harness.config import field
from harness.nn.layers import RopeScaling

from benchmarks.lm.config import DataConfig, DecoderModelConfig, OptimizerConfig  # noqa: F401  (its sections)


@dataclasses.dataclass
class ModelConfig(DecoderModelConfig):  # the decoder's fields (defaults: Llama 3.1 8B's), then its own
    ffn_hidden: int = field(14336, min=1, doc="SwiGLU hidden units")
    rope_scaling_factor: float = field(8.0, min=0.0, doc="Llama 3.1 RoPE scaling (rope_type llama3); 0 = off")
    rope_low_freq_factor: float = field(1.0, min=0.0)
    rope_high_freq_factor: float = field(4.0, min=0.0)
    rope_original_context: int = field(8192, min=1, doc="original_max_position_embeddings of the scaling")
    output_init_stddev: float = field(0.0, min=0.0, doc="normal init of the attention output and feed-forward "
                                      "down projections; 0 = init_stddev / sqrt(2 * num_layers), Megatron's scaled "
                                      "init (output_layer_init_method), which the reference keeps")

    def output_stddev(self) -> float:
        return self.output_init_stddev or self.init_stddev / math.sqrt(2.0 * self.num_layers)

    def rope_scaling(self) -> RopeScaling | None:
        if not self.rope_scaling_factor:
            return None
        return RopeScaling(self.rope_scaling_factor, self.rope_low_freq_factor, self.rope_high_freq_factor,
                           self.rope_original_context)
