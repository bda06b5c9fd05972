"""The Llama 3.1 decoder as the MLPerf llama31_8b reference configures it (NeMo `Llama31Config8B`).

RMSNorm (eps 1e-5) pre-norm blocks, grouped-query attention with RoPE (base 500000, Llama 3.1 frequency
scaling), full causal attention over the whole row (documents are packed and attention crosses them: the
reference resets no mask), a dense SwiGLU feed-forward, no biases, no dropout, untied input and output
embeddings, every weight drawn from a normal of std init_stddev but the attention output and feed-forward
down projections (std init_stddev / sqrt(2 * layers), Megatron's scaled output-layer init).

Named dimensions let a mesh runtime split them: `heads` (key/value heads with their query groups), `ff`
(the feed-forward's hidden units) and `vocab` (the embedding table through `vocab_parallel_lookup`, and the
output layer). Every shape is static and no op leaves the device, so a step compiles under XLA.
"""
from __future__ import annotations

import tensorflow as tf

from harness.nn.layers import Block, RMSNorm, normal, vocab_parallel_lookup
from harness.runtime.base import Runtime

from benchmarks.lm.attention import Attention
from benchmarks.llama31_8b.config import ModelConfig


class SwiGLU(Block):
    """silu(x W_gate) * (x W_up), then W_down; the hidden units on `ff`, so tensor parallelism splits them
    and sums the down projection (one all-reduce)."""

    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig) -> None:
        super().__init__(runtime, path, seed)
        m, f = cfg.hidden_size, cfg.ffn_hidden
        init = lambda name: normal(cfg.init_stddev, f"{path}/{name}/kernel", seed)  # noqa: E731
        self.w_gate = self.var("gate/kernel", (m, f), (None, "ff"), init("gate"))
        self.w_up = self.var("up/kernel", (m, f), (None, "ff"), init("up"))
        self.w_down = self.var("down/kernel", (f, m), ("ff", None),
                               normal(cfg.output_stddev(), f"{path}/down/kernel", seed))

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        dt = self.dtype
        gate = tf.einsum("bsm,mf->bsf", x, tf.cast(self.w_gate, dt))
        up = tf.einsum("bsm,mf->bsf", x, tf.cast(self.w_up, dt))
        return tf.einsum("bsf,fm->bsm", tf.nn.silu(gate) * up, tf.cast(self.w_down, dt))


class DecoderLayer(Block):
    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig, seq: int) -> None:
        super().__init__(runtime, path, seed)
        self.attention_norm = RMSNorm(runtime, f"{path}/attention_norm", seed, cfg.hidden_size, cfg.norm_epsilon)
        # Full causal attention: the window is the row, one dense block.
        self.attention = Attention(runtime, f"{path}/attention", seed, cfg, window=seq, block=seq,
                                   rope_scaling=cfg.rope_scaling(), output_stddev=cfg.output_stddev())
        self.mlp_norm = RMSNorm(runtime, f"{path}/mlp_norm", seed, cfg.hidden_size, cfg.norm_epsilon)
        self.mlp = SwiGLU(runtime, f"{path}/mlp", seed, cfg)

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        x = x + self.attention(self.attention_norm(x), None)
        return x + self.mlp(self.mlp_norm(x))


class Llama(Block):
    def __init__(self, runtime: Runtime, seed: int, cfg: ModelConfig, seq: int) -> None:
        super().__init__(runtime, "llama", seed)
        self.cfg = cfg
        m, v, sd = cfg.hidden_size, cfg.vocab_size, cfg.init_stddev
        self.embeddings = self.var("embedding/embeddings", (v, m), ("vocab", None),
                                   normal(sd, "llama/embedding/embeddings", seed))
        self.layers = [DecoderLayer(runtime, f"llama/layer_{i}", seed, cfg, seq) for i in range(cfg.num_layers)]
        self.final_norm = RMSNorm(runtime, "llama/final_norm", seed, m, cfg.norm_epsilon)
        self.output = self.var("output/kernel", (m, v), (None, "vocab"), normal(sd, "llama/output/kernel", seed))

    def __call__(self, inputs: tf.Tensor) -> tuple[tf.Tensor, None]:
        """Logits [b, s, vocab] (float32) of the next token after each of inputs [b, s]; no extras."""
        x = tf.cast(vocab_parallel_lookup(self.runtime, self.embeddings, inputs), self.dtype)
        for layer in self.layers:
            x = tf.recompute_grad(layer)(x) if self.cfg.remat else layer(x)
        x = self.final_norm(x)
        logits = tf.einsum("bsm,mv->bsv", x, tf.cast(self.output, self.dtype))
        return tf.cast(logits, tf.float32), None
