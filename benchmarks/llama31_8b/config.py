"""llama31_8b's config sections (defaults: the MLPerf reference, Llama 3.1 8B pretraining on C4): the decoder
LMs' data and optimizer sections and the Llama block's model section, whose defaults are Llama 3.1 8B's."""
from __future__ import annotations

from benchmarks.lm.config import DataConfig, OptimizerConfig  # noqa: F401  (its sections)
from benchmarks.lm.llama import LlamaModelConfig as ModelConfig  # noqa: F401
