"""The GPT-OSS decoder as the MLPerf gpt_oss_20b reference configures it (Primus/Megatron YAMLs), on the
decoder LMs' shared stack (benchmarks/lm/decoder.py).

RMSNorm pre-norm blocks, RoPE, grouped-query attention with q/k RMSNorm (qk_layernorm, inherited by the
reference's model YAML) and no biases or attention sinks, a causal sliding window on even layers and full
causal attention on odd ones, and a mixture-of-experts feed-forward in every layer (moe.py): SwiGLU
experts, token-choice top-k on the router logits then a softmax over the k chosen
(`moe_router_pre_softmax: false`), dropless by default. Untied input and output embeddings. The published
architecture's features (attention sinks, q/k/v/o, router and expert biases, the clamped GLU, YaRN) are
`model.*` options (config.py). Named dimensions: `batch`, `heads`, `experts`, `ff` (an expert's hidden
units) and `vocab`.
"""
from __future__ import annotations

import tensorflow as tf

from harness.runtime.base import Runtime

from benchmarks.gpt_oss_20b.config import ModelConfig
from benchmarks.gpt_oss_20b.moe import MoE
from benchmarks.lm.attention import Attention
from benchmarks.lm.decoder import Decoder


def layer_window(cfg: ModelConfig, layer: int, seq: int) -> int:
    """Even layers: the sliding window; odd layers: full causal (the whole row, or `full_attention_span`)."""
    if layer % 2 == 0:
        return cfg.sliding_window
    return cfg.full_attention_span or seq


class GptOss(Decoder):
    """Each layer's extras: its MoE `Routing`."""

    FFN_NAME = "moe"

    def __init__(self, runtime: Runtime, seed: int, cfg: ModelConfig, seq: int, eod_id: int) -> None:
        super().__init__(runtime, "gpt_oss", seed, cfg, seq)
        self.eod_id = eod_id

    def attention(self, path: str, layer: int) -> Attention:
        c = self.cfg
        return Attention(self.runtime, path, self.seed, c, layer_window(c, layer, self.seq),
                         rope_scaling=c.rope_scaling(), output_stddev=c.output_stddev(), bias=c.attention_bias,
                         sinks=c.attention_sinks, qk_norm=c.qk_norm)

    def ffn(self, path: str, layer: int) -> MoE:
        return MoE(self.runtime, path, self.seed, self.cfg)

    def segments(self, inputs: tf.Tensor) -> tf.Tensor | None:
        """Document index of each position: EODs before it (an EOD closes its own document); None when
        attention crosses documents (`model.document_attention` off)."""
        if not self.cfg.document_attention:
            return None
        return tf.cumsum(tf.cast(tf.equal(inputs, self.eod_id), tf.int32), axis=1, exclusive=True)
