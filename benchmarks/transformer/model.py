"""Transformer (Vaswani et al.) as the MLPerf reference builds it: pre-layer-norm encoder and decoder
with final layer norms, sinusoidal positions, and ONE embedding matrix shared by the encoder input, the
decoder input and the pre-softmax projection (scaled by sqrt(d) on the way in).

Rows may be packed: several sentence pairs share a row, told apart by segment ids (1, 2, ...; 0 is
padding) and per-segment positions, and attention never crosses segments. An unpacked row is one segment.
Named dimensions (heads, ff, vocab) let a mesh split attention heads, the feed-forward hidden units and
the shared vocabulary, as Google's v0.7 submission did; a data-parallel runtime ignores them.
"""
from __future__ import annotations

import math

import tensorflow as tf

from harness.nn.layers import NEG_INF, Block, Dense, LayerNorm, MultiHeadAttention, dropout, glorot_uniform, normal, \
    vocab_parallel_lookup
from harness.runtime.base import Runtime

from benchmarks.transformer.beam_search import beam_search
from benchmarks.transformer.config import ModelConfig


def site_seed(seed: tf.Tensor | None, index: int) -> tf.Tensor | None:
    """A distinct stateless seed for dropout site `index` (every mask independent, as in the reference)."""
    return None if seed is None else tf.random.experimental.stateless_fold_in(tf.cast(seed, tf.int64), index)


def position_encoding(positions: tf.Tensor, hidden: int) -> tf.Tensor:
    """The reference's position encoding: timescales 1..1e4, [sin, cos] concatenated (not interleaved).

    Computed in the graph from the position ids: a captured table would be a tensor a DTensor mesh
    refuses as a function input.
    """
    half = hidden // 2
    increment = math.log(1.0e4) / max(half - 1, 1)
    inv = tf.exp(tf.range(half, dtype=tf.float32) * -increment)
    scaled = tf.expand_dims(tf.cast(positions, tf.float32), -1) * inv
    return tf.concat([tf.sin(scaled), tf.cos(scaled)], axis=-1)


def segment_bias(q_seg: tf.Tensor, k_seg: tf.Tensor, causal: bool = False) -> tf.Tensor:
    """Additive bias (batch, 1, q, k): a query sees keys of its own segment (never padding), and with
    `causal` only keys at or before it. Written with expand_dims and products: DTensor's SPMD pass
    crashes on new-axis slices and scalar-broadcast selects here."""
    same = tf.cast(tf.equal(tf.expand_dims(q_seg, 2), tf.expand_dims(k_seg, 1)), tf.float32)
    allowed = same * tf.expand_dims(tf.cast(k_seg > 0, tf.float32), 1)
    if causal:
        n = tf.shape(q_seg)[1]
        allowed = allowed * tf.expand_dims(tf.linalg.band_part(tf.ones([n, n]), -1, 0), 0)
    return tf.expand_dims((1.0 - allowed) * NEG_INF, 1)


class FeedForward(Block):
    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig) -> None:
        super().__init__(runtime, path, seed)
        h, f = cfg.hidden_size, cfg.filter_size
        self.rate = cfg.relu_dropout
        self.filter = Dense(runtime, f"{path}/filter_layer", seed, h, f, (None, "ff"),
                            init=glorot_uniform(h, f, f"{path}/filter_layer/kernel", seed))
        self.output = Dense(runtime, f"{path}/output_layer", seed, f, h, ("ff", None),
                            init=glorot_uniform(f, h, f"{path}/output_layer/kernel", seed))

    def __call__(self, x: tf.Tensor, seed: tf.Tensor | None) -> tf.Tensor:
        return self.output(dropout(tf.nn.relu(self.filter(x)), self.rate, seed))


class Sublayers(Block):
    """One encoder or decoder layer: y = x + Dropout(Sublayer(LayerNorm(x))) for each sublayer."""

    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig, decoder: bool) -> None:
        super().__init__(runtime, path, seed)
        h, n, eps = cfg.hidden_size, cfg.num_heads, cfg.layer_norm_epsilon
        self.cfg = cfg
        self.self_norm = LayerNorm(runtime, f"{path}/self_attention/layer_norm", seed, h, eps)
        self.self_attention = MultiHeadAttention(runtime, f"{path}/self_attention", seed, h, n,
                                                 dropout_rate=cfg.attention_dropout, use_bias=False, glorot=True)
        self.cross_norm = self.cross_attention = None
        if decoder:
            self.cross_norm = LayerNorm(runtime, f"{path}/encdec_attention/layer_norm", seed, h, eps)
            self.cross_attention = MultiHeadAttention(runtime, f"{path}/encdec_attention", seed, h, n,
                                                      dropout_rate=cfg.attention_dropout, use_bias=False,
                                                      glorot=True)
        self.ffn_norm = LayerNorm(runtime, f"{path}/ffn/layer_norm", seed, h, eps)
        self.ffn = FeedForward(runtime, f"{path}/ffn", seed, cfg)

    def residual(self, x: tf.Tensor, y: tf.Tensor, seed: tf.Tensor | None) -> tf.Tensor:
        return x + dropout(y, self.cfg.layer_postprocess_dropout, seed)

    def __call__(self, x: tf.Tensor, self_bias: tf.Tensor, seed: tf.Tensor | None = None,
                 memory_kv: tuple[tf.Tensor, tf.Tensor] | None = None,
                 cross_bias: tf.Tensor | None = None,
                 self_kv: tuple[tf.Tensor, tf.Tensor] | None = None) -> tf.Tensor:
        """`self_kv`: keys/values to attend to instead of this layer's own (a decode cache)."""
        s = [site_seed(seed, k) for k in range(6)]
        y = self.self_norm(x)
        k, v = self_kv if self_kv is not None else self.self_attention.project_kv(y)
        x = self.residual(x, self.self_attention.attend(y, k, v, self_bias, s[0]), s[1])
        if self.cross_attention is not None:
            y = self.cross_norm(x)
            x = self.residual(x, self.cross_attention.attend(y, *memory_kv, cross_bias, s[2]), s[3])
        return self.residual(x, self.ffn(self.ffn_norm(x), s[4]), s[5])


class Transformer(Block):
    def __init__(self, runtime: Runtime, seed: int, cfg: ModelConfig, vocab_size: int) -> None:
        super().__init__(runtime, "transformer", seed)
        self.cfg = cfg
        h = cfg.hidden_size
        self.vocab_size = vocab_size
        # Reference init: N(0, d^-0.5); rows of the pad id are zeroed at lookup, as there.
        self.embeddings = self.var("shared_embedding/embeddings", (vocab_size, h), ("vocab", None),
                                   normal(h ** -0.5, "transformer/shared_embedding/embeddings", seed))
        self.encoder = [Sublayers(runtime, f"transformer/encoder/layer_{i}", seed, cfg, False)
                        for i in range(cfg.num_layers)]
        self.decoder = [Sublayers(runtime, f"transformer/decoder/layer_{i}", seed, cfg, True)
                        for i in range(cfg.num_layers)]
        self.encoder_norm = LayerNorm(runtime, "transformer/encoder/layer_norm", seed, h, cfg.layer_norm_epsilon)
        self.decoder_norm = LayerNorm(runtime, "transformer/decoder/layer_norm", seed, h, cfg.layer_norm_epsilon)

    # ------------------------------------------------------------------------------- pieces
    def embed(self, ids: tf.Tensor, positions: tf.Tensor) -> tf.Tensor:
        x = vocab_parallel_lookup(self.runtime, self.embeddings, ids) * (self.cfg.hidden_size ** 0.5)
        x = x * tf.expand_dims(tf.cast(tf.not_equal(ids, 0), x.dtype), -1)
        return tf.cast(x + position_encoding(positions, self.cfg.hidden_size), self.dtype)

    def logits(self, x: tf.Tensor) -> tf.Tensor:
        """Pre-softmax projection through the shared embedding (logits = x E^T), float32."""
        # Explicit ranks: DTensor's einsum has no broadcasting ("...").
        equation = "bsh,vh->bsv" if x.shape.rank == 3 else "bh,vh->bv"
        return tf.cast(tf.einsum(equation, tf.cast(x, self.dtype), tf.cast(self.embeddings, self.dtype)), tf.float32)

    def encode(self, inputs: tf.Tensor, segments: tf.Tensor, positions: tf.Tensor,
               seed: tf.Tensor | None = None) -> tf.Tensor:
        x = dropout(self.embed(inputs, positions), self.cfg.layer_postprocess_dropout, site_seed(seed, 0))
        bias = segment_bias(segments, segments)
        for i, layer in enumerate(self.encoder):
            x = layer(x, bias, site_seed(seed, i + 1))
        return self.encoder_norm(x)

    def cross_kv(self, memory: tf.Tensor) -> list[tuple[tf.Tensor, tf.Tensor]]:
        """Each decoder layer's keys/values of the encoder output (computed once per decode)."""
        return [layer.cross_attention.project_kv(memory) for layer in self.decoder]

    # ---------------------------------------------------------------------------- training
    def __call__(self, batch: dict[str, tf.Tensor], seed: tf.Tensor | None = None) -> tf.Tensor:
        """Logits (batch, row, vocab) for a batch of (packed) rows; `seed` turns dropout on."""
        in_seg, tgt_seg = batch["inputs_segmentation"], batch["targets_segmentation"]
        tgt_pos = batch["targets_position"]
        memory = self.encode(batch["inputs"], in_seg, batch["inputs_position"], seed)
        # Decoder input: the targets shifted right within each segment, id 0 starting every segment.
        targets = batch["targets"]
        shifted = tf.pad(targets, [[0, 0], [1, 0]])[:, :-1] * tf.cast(tgt_pos > 0, targets.dtype)
        dseed = site_seed(seed, 100)
        x = dropout(self.embed(shifted, tgt_pos), self.cfg.layer_postprocess_dropout, site_seed(dseed, 0))
        self_bias = segment_bias(tgt_seg, tgt_seg, causal=True)
        cross_bias = segment_bias(tgt_seg, in_seg)
        for i, (layer, kv) in enumerate(zip(self.decoder, self.cross_kv(memory))):
            x = layer(x, self_bias, site_seed(dseed, i + 1), memory_kv=kv, cross_bias=cross_bias)
        return self.logits(self.decoder_norm(x))

    # ---------------------------------------------------------------------------- decoding
    def decode_cache(self, batch: int, length: int) -> list[dict[str, tf.Tensor]]:
        """Empty self-attention key/value buffers, one pair per decoder layer: (batch, length, heads, dim)."""
        n = self.cfg.num_heads
        shape = [batch, length, n, self.cfg.hidden_size // n]
        return [{"k": tf.zeros(shape, self.dtype), "v": tf.zeros(shape, self.dtype)} for _ in self.decoder]

    def decode_step(self, ids: tf.Tensor, i: tf.Tensor, cache: list[dict[str, tf.Tensor]],
                    cross: list[tuple[tf.Tensor, tf.Tensor]], cross_bias: tf.Tensor
                    ) -> tuple[tf.Tensor, list[dict[str, tf.Tensor]]]:
        """Logits (batch, vocab) for position `i` given the token at i-1 (`ids`, 0 at i = 0), writing this
        position's keys/values into fixed-size buffers, so shapes never change during the decode."""
        length = cache[0]["k"].shape[1]
        column = tf.expand_dims(ids, 1)
        x = self.embed(column, tf.fill(tf.shape(column), i))
        here = tf.reshape(tf.equal(tf.range(length), i), [1, length, 1, 1])
        self_bias = tf.reshape(tf.where(tf.range(length) <= i, 0.0, NEG_INF), [1, 1, 1, length])
        new_cache = []
        for layer, layer_cache, kv in zip(self.decoder, cache, cross):
            k_new, v_new = layer.self_attention.project_kv(layer.self_norm(x))
            k = tf.where(here, k_new, layer_cache["k"])
            v = tf.where(here, v_new, layer_cache["v"])
            new_cache.append({"k": k, "v": v})
            x = layer(x, self_bias, memory_kv=kv, cross_bias=cross_bias, self_kv=(k, v))
        return tf.squeeze(self.logits(self.decoder_norm(x)), 1), new_cache

    def decode_step_uncached(self, prefix: tf.Tensor, i: tf.Tensor, cross: list[tuple[tf.Tensor, tf.Tensor]],
                             cross_bias: tf.Tensor) -> tf.Tensor:
        """The same logits recomputed from the whole prefix (batch, length) of decoder inputs: the check on
        the cache, and the baseline the decode benchmark compares it with."""
        length = prefix.shape[1]
        positions = tf.broadcast_to(tf.expand_dims(tf.range(length), 0), tf.shape(prefix))
        x = self.embed(prefix, positions)
        causal = tf.linalg.band_part(tf.ones([length, length], tf.bool), -1, 0)
        self_bias = tf.reshape(tf.where(causal, 0.0, NEG_INF), [1, 1, length, length])
        for layer, kv in zip(self.decoder, cross):
            x = layer(x, self_bias, memory_kv=kv, cross_bias=cross_bias)
        return tf.gather(self.logits(self.decoder_norm(x)), i, axis=1)

    def translate(self, inputs: tf.Tensor, beam_size: int, alpha: float, extra_length: int, decode_length: int,
                  cached: bool = True) -> tf.Tensor:
        """Beam-search hypotheses (batch, decode_length) for source ids (batch, length), 0-padded.

        Each sentence may grow to its own input length + `extra_length` tokens (the reference's limit is
        the padded batch's length + 50, which would make a result depend on its batch-mates).
        """
        batch, k = inputs.shape[0], beam_size
        segments = tf.cast(inputs > 0, tf.int32)
        positions = tf.broadcast_to(tf.expand_dims(tf.range(inputs.shape[1]), 0), tf.shape(inputs))
        memory = self.encode(inputs, segments, positions)
        tile = lambda t: tf.repeat(t, k, axis=0)  # noqa: E731 - beam-major rows within a sentence
        cross = [(tile(kk), tile(vv)) for kk, vv in self.cross_kv(memory)]
        cross_bias = tile(tf.reshape(tf.where(segments > 0, 0.0, NEG_INF), [batch, 1, 1, -1]))
        max_lengths = tf.reduce_sum(segments, 1) + extra_length

        if cached:
            def step(ids, i, cache, sequences):
                return self.decode_step(ids, i, cache, cross, cross_bias)
            cache = self.decode_cache(batch * k, decode_length)
        else:
            def step(ids, i, cache, sequences):
                prefix = tf.pad(sequences, [[0, 0], [1, 0]])[:, :-1]
                return self.decode_step_uncached(prefix, i, cross, cross_bias), cache
            cache = ()
        hyps, _ = beam_search(step, cache, batch, k, decode_length, max_lengths, alpha,
                              take=self.runtime.take_along_axis1)
        return hyps
