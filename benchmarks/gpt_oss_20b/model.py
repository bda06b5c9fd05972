"""The GPT-OSS decoder as the MLPerf gpt_oss_20b reference configures it (Primus/Megatron YAMLs).

RMSNorm pre-norm blocks, RoPE, grouped-query attention (no biases, no attention sinks, no q/k norm: the
reference YAMLs set none of them), a causal sliding window on even layers and full causal attention on
odd ones, and a mixture-of-experts feed-forward in every layer: SwiGLU experts, token-choice top-k on the
router logits then a softmax over the k chosen (`moe_router_pre_softmax: false`), dropless by default.
Untied input and output embeddings.

Named dimensions let a mesh runtime split them: `batch`, `heads` (key/value heads, their query groups
with them), `experts`, `ff` (an expert's hidden units) and `vocab`. Every shape is static and no op
leaves the device, so a step compiles under XLA.
"""
from __future__ import annotations

import tensorflow as tf

from harness.nn.layers import Block, RMSNorm, normal, vocab_parallel_lookup
from harness.runtime.base import Runtime

from benchmarks.gpt_oss_20b.config import ModelConfig
from benchmarks.gpt_oss_20b.moe import MoE, Routing
from benchmarks.lm.attention import Attention


# ------------------------------------------------------------------------------------ the decoder

def layer_window(cfg: ModelConfig, layer: int, seq: int) -> int:
    """Even layers: the sliding window; odd layers: full causal (the whole row, or `full_attention_span`)."""
    if layer % 2 == 0:
        return cfg.sliding_window
    return cfg.full_attention_span or seq


class DecoderLayer(Block):
    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig, window: int) -> None:
        super().__init__(runtime, path, seed)
        self.attention_norm = RMSNorm(runtime, f"{path}/attention_norm", seed, cfg.hidden_size, cfg.norm_epsilon)
        self.attention = Attention(runtime, f"{path}/attention", seed, cfg, window)
        self.mlp_norm = RMSNorm(runtime, f"{path}/mlp_norm", seed, cfg.hidden_size, cfg.norm_epsilon)
        self.moe = MoE(runtime, f"{path}/moe", seed, cfg)

    def __call__(self, x: tf.Tensor, segments: tf.Tensor | None) -> tuple[tf.Tensor, Routing]:
        x = x + self.attention(self.attention_norm(x), segments)
        y, routing = self.moe(self.mlp_norm(x))
        return x + y, routing


class GptOss(Block):
    def __init__(self, runtime: Runtime, seed: int, cfg: ModelConfig, seq: int, eod_id: int) -> None:
        super().__init__(runtime, "gpt_oss", seed)
        self.cfg, self.eod_id = cfg, eod_id
        m, v, sd = cfg.hidden_size, cfg.vocab_size, cfg.init_stddev
        self.embeddings = self.var("embedding/embeddings", (v, m), ("vocab", None),
                                   normal(sd, "gpt_oss/embedding/embeddings", seed))
        self.layers = [DecoderLayer(runtime, f"gpt_oss/layer_{i}", seed, cfg, layer_window(cfg, i, seq))
                       for i in range(cfg.num_layers)]
        self.final_norm = RMSNorm(runtime, "gpt_oss/final_norm", seed, m, cfg.norm_epsilon)
        self.output = self.var("output/kernel", (m, v), (None, "vocab"), normal(sd, "gpt_oss/output/kernel", seed))

    def segments(self, inputs: tf.Tensor) -> tf.Tensor:
        """Document index of each position: EODs before it (an EOD closes its own document)."""
        return tf.cumsum(tf.cast(tf.equal(inputs, self.eod_id), tf.int32), axis=1, exclusive=True)

    def __call__(self, inputs: tf.Tensor) -> tuple[tf.Tensor, list[Routing]]:
        """Logits [b, s, vocab] (float32) of the next token after each of inputs [b, s], and each layer's
        routing."""
        segments = self.segments(inputs) if self.cfg.document_attention else None
        x = tf.cast(vocab_parallel_lookup(self.runtime, self.embeddings, inputs), self.dtype)
        routings = []
        for layer in self.layers:
            x, r = self._remat(layer, x, segments) if self.cfg.remat else layer(x, segments)
            routings.append(r)
        x = self.final_norm(x)
        logits = tf.einsum("bsm,mv->bsv", x, tf.cast(self.output, self.dtype))
        return tf.cast(logits, tf.float32), routings

    @staticmethod
    def _remat(layer: DecoderLayer, x: tf.Tensor, segments: tf.Tensor | None) -> tuple[tf.Tensor, Routing]:
        """`layer` recomputed in the backward pass (tf.recompute_grad): only its input is kept. Its outputs are
        the tensors the losses and metrics read (the router losses' sums, with their gradients, and the
        dropped counts); the routing's per-token tensors (index, gates, kept) are not returned (None)."""
        shape = {}

        def run(h):
            y, r = layer(h, segments)
            shape.update(groups=r.groups, tokens=r.tokens)
            return y, r.balance_sum, r.z_sum, r.dropped

        y, balance_sum, z_sum, dropped = tf.recompute_grad(run)(x)
        return y, Routing(None, None, None, balance_sum, z_sum, dropped, **shape)
