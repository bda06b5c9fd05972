"""BERT encoder with masked-LM (tied to the word embeddings) and next-sentence heads.

Variable paths follow the reference checkpoint's names (bert/encoder/layer_3/...), so loading one is a
short name map. Named dimensions (heads, ff, vocab) let a mesh runtime shard attention heads, the
feed-forward hidden layer and the vocabulary; a data-parallel runtime ignores them.
"""
from __future__ import annotations

import tensorflow as tf

from harness.nn.layers import Block, Dense, Embedding, LayerNorm, MultiHeadAttention, constant, dropout, \
    truncated_normal
from harness.runtime.base import Runtime

from benchmarks.bert.config import ModelConfig


def gelu(x: tf.Tensor) -> tf.Tensor:
    return tf.nn.gelu(x, approximate=True)


def site_seed(seed: tf.Tensor, index: int) -> tf.Tensor:
    """A distinct stateless seed for dropout site `index` under `seed`.

    The reference draws every `tf.nn.dropout` mask independently. Hashing the index into both seed
    words (stateless_fold_in) keeps that: adding offsets to one word, as before, made layer i at step t
    reuse layer i-1's masks from step t+16.
    """
    return tf.random.experimental.stateless_fold_in(tf.cast(seed, tf.int64), index)


class EncoderLayer(Block):
    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig) -> None:
        super().__init__(runtime, path, seed)
        h, eps, sd = cfg.hidden_size, cfg.layer_norm_epsilon, cfg.init_stddev
        self.cfg = cfg
        self.attention = MultiHeadAttention(runtime, f"{path}/attention/self", seed, h, cfg.num_heads, sd,
                                            cfg.attention_dropout)
        self.attention_norm = LayerNorm(runtime, f"{path}/attention/output/LayerNorm", seed, h, eps)
        self.intermediate = Dense(runtime, f"{path}/intermediate/dense", seed, h, cfg.ff_size, (None, "ff"),
                                  stddev=sd)
        self.output = Dense(runtime, f"{path}/output/dense", seed, cfg.ff_size, h, ("ff", None), stddev=sd)
        self.output_norm = LayerNorm(runtime, f"{path}/output/LayerNorm", seed, h, eps)

    def __call__(self, x: tf.Tensor, mask: tf.Tensor, seed: tf.Tensor | None) -> tf.Tensor:
        """`seed` is this layer's own seed; each dropout site folds in its index (see `site_seed`)."""
        p = self.cfg.hidden_dropout
        seeds = [None] * 3 if seed is None else [site_seed(seed, k) for k in (0, 1, 2)]
        a = dropout(self.attention(x, mask, seeds[0]), p, seeds[1])
        x = self.attention_norm(x + a)
        y = dropout(self.output(gelu(self.intermediate(x))), p, seeds[2])
        return self.output_norm(x + y)


class Bert(Block):
    def __init__(self, runtime: Runtime, seed: int, cfg: ModelConfig) -> None:
        super().__init__(runtime, "bert", seed)
        self.cfg = cfg
        h, sd = cfg.hidden_size, cfg.init_stddev
        self.word = Embedding(runtime, "bert/embeddings/word_embeddings_layer", seed, cfg.vocab_size, h,
                              ("vocab", None), sd)
        self.position = Embedding(runtime, "bert/embeddings/position_embeddings_layer", seed, cfg.max_position,
                                  h, (None, None), sd)
        self.token_type = Embedding(runtime, "bert/embeddings/token_type_embeddings_layer", seed,
                                    cfg.type_vocab_size, h, (None, None), sd)
        self.embed_norm = LayerNorm(runtime, "bert/embeddings/LayerNorm", seed, h, cfg.layer_norm_epsilon)
        self.layers = [EncoderLayer(runtime, f"bert/encoder/layer_{i}", seed, cfg) for i in range(cfg.num_layers)]
        self.pooler = Dense(runtime, "bert/pooler/dense", seed, h, h, stddev=sd)
        # Masked-LM head: transform, then logits against the (tied) word embeddings.
        self.mlm_transform = Dense(runtime, "cls/predictions/transform/dense", seed, h, h, stddev=sd)
        self.mlm_norm = LayerNorm(runtime, "cls/predictions/transform/LayerNorm", seed, h, cfg.layer_norm_epsilon)
        self.mlm_bias = self.var_at("cls/predictions/output_bias", (cfg.vocab_size,), ("vocab",), constant(0.0))
        self.nsp_weights = self.var_at("cls/seq_relationship/output_weights", (2, h), (None, None),
                                       truncated_normal(sd, "cls/seq_relationship/output_weights", seed))
        self.nsp_bias = self.var_at("cls/seq_relationship/output_bias", (2,), (None,), constant(0.0))

    def var_at(self, path: str, shape, dims, init) -> tf.Variable:
        return self.runtime.variable(path, shape, dims, init)

    def __call__(self, batch: dict[str, tf.Tensor], training: bool,
                 seed: tf.Tensor | None = None) -> tuple[tf.Tensor, tf.Tensor]:
        """Returns masked-LM logits (batch, predictions, vocab) and next-sentence logits (batch, 2).

        `seed` (shape [2], training only) should differ per step and per replica; every dropout mask
        of the model is derived from it, distinct per layer and site.
        """
        ids, mask = batch["input_ids"], batch["input_mask"]
        seq = ids.shape[1]
        dropout_on = self.cfg.hidden_dropout > 0 or self.cfg.attention_dropout > 0
        seed = seed if training and seed is not None and dropout_on else None
        x = self.word(ids)  # vocab-parallel when the layout splits the vocabulary
        x = x + self.token_type(batch["segment_ids"])
        # Broadcast, not [None]: a new-axis strided slice of a DVariable crashes DTensor's SPMD pass.
        x = x + tf.cast(self.position.embeddings[:seq], self.dtype)
        # Per-layer seeds: the embeddings are site 0 of the step's seed, encoder layer i folds in i + 1.
        x = dropout(self.embed_norm(x), self.cfg.hidden_dropout, None if seed is None else site_seed(seed, 0))
        for i, layer in enumerate(self.layers):
            x = layer(x, mask, None if seed is None else site_seed(seed, i + 1))
        # Masked-LM logits only where predictions are asked for.
        picked = tf.gather(x, batch["masked_lm_positions"], batch_dims=1)
        t = self.mlm_norm(gelu(self.mlm_transform(picked)))
        mlm = tf.einsum("bph,vh->bpv", tf.cast(t, self.dtype), tf.cast(self.word.embeddings, self.dtype))
        mlm = tf.cast(mlm, tf.float32) + self.mlm_bias
        pooled = tf.tanh(self.pooler(x[:, 0]))
        nsp = tf.matmul(tf.cast(pooled, tf.float32), self.nsp_weights, transpose_b=True) + self.nsp_bias
        return mlm, nsp
