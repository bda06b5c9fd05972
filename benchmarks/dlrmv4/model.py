"""The dlrmv4 HSTU ranker as the MLPerf reference computes it, on padded histories with static shapes.

Reference: mlcommons/training@a67b8459467c551c08f8566d68a8e4e1659e6bd7 (PR #889 head),
recommendation_v4/generative_recommenders/: modules/dlrm_hstu.py (lookups, item MLP, loss),
modules/preprocessors.py + action_encoder.py (ContextualPreprocessor), ops/pytorch/pt_position.py and
ops/triton/triton_position.py (absolute position and time-bucket embeddings), modules/stu.py +
ops/pytorch/pt_hstu_attention.py + pt_hstu_linear.py (the STU layer), modules/postprocessors.py
(TimestampLayerNormPostprocessor), modules/multitask_module.py (head).

One sample is the jagged sequence [8 contextual tokens][n history events][1 candidate], L = n + 9. Here each
sample is padded at the end to S = history_length + 9 positions; every padded key is masked, so a valid
position computes what the jagged reference computes. The attention divides by N, the longest L in the
replica's own batch (the reference passes `max_seq_len` = that batch's max to its kernel): N is a runtime
scalar per replica, never the padded width.
"""
from __future__ import annotations

import math
import zlib
from typing import Sequence

import tensorflow as tf

from harness.nn.layers import Block, Dense, LayerNorm, constant, dropout, glorot_uniform, normal, silu, \
    vocab_parallel_lookup
from harness.runtime.base import Runtime

from benchmarks.dlrmv4.config import CONTEXT_TABLES, ITEM_TABLES, NUM_ACTION_BITS, ModelConfig
from benchmarks.dlrmv4.owner_lookup import owner_lookup, routed, routed_lookup

NUM_CONTEXT = len(CONTEXT_TABLES)
# TimestampLayerNormPostprocessor's periods: (seconds per unit, units per period), hour of day, day of week;
# the reference multiplies by 3.14, not pi.
TIME_FEATURES = ((3600, 24), (86400, 7))
TWO_PI_REFERENCE = 2 * 3.14


def xavier_normal(fan_in: int, fan_out: int, path: str, seed: int):
    """torch.nn.init.xavier_normal_: normal(0, sqrt(2 / (fan_in + fan_out)))."""
    return normal(math.sqrt(2.0 / (fan_in + fan_out)), path, seed)


def uniform(limit: float, path: str, seed: int):
    """uniform(-limit, limit), stateless, seeded by (run seed, variable path)."""
    key = tf.constant([seed, zlib.crc32(path.encode()) & 0x7FFFFFFF], tf.int64)
    return lambda shape, dtype: tf.random.stateless_uniform(shape, key, -limit, limit, dtype=dtype)


class Float32Dense(Dense):
    """A Dense that computes in float32 whatever the runtime's precision (the reference's item MLP and
    head run outside its bfloat16 autocast)."""

    @property
    def dtype(self) -> tf.DType:
        return tf.float32


def lookup(runtime: Runtime, table: tf.Variable, ids: tf.Tensor) -> tf.Tensor:
    """Rows `ids` of `table`, each distinct id gathered once (the reference's in-batch dedup), so the gradient
    reaching the table holds one summed row per distinct id and row-wise Adagrad updates each row once.

    The tables' rows are the `vocab` dimension: a mesh whose layout splits it keeps each table in row shards,
    and the ids are looked up by `owner_lookup` (each distinct id read on the device owning its row, one sum
    over the split), whose gradient reaches each device for its own rows only, repeats summed: no device
    holds a tensor of (its rows) x (the step's ids), which the reference's tables could not afford. A layout
    splitting the batch over the same devices (`routed`) sends each device's own ids to their owners instead
    (`routed_lookup`, two all-to-alls), so a device handles its batch share's ids only.
    """
    size = ids.shape.num_elements()
    if routed(runtime):
        return routed_lookup(runtime, table, ids)
    if runtime.shards("vocab") > 1:
        return owner_lookup(runtime, table, ids)
    if runtime.jit_compile:
        # XLA compiles static shapes only (no tf.unique): a plain gather, whose gradient's repeats of a row are
        # summed before row-wise Adagrad reads it (the same update: one summed gradient per distinct row).
        return tf.gather(runtime.read(table), ids)
    flat = tf.reshape(ids, [size])
    unique, index = tf.unique(flat)
    # Padded to the static count of ids (DTensor lays out static shapes only); the padding looks up row 0,
    # and no id's index points at it, so it adds nothing to any gradient.
    unique = tf.reshape(tf.pad(unique, [[0, size - tf.shape(unique)[0]]]), [1, size])
    rows = tf.reshape(vocab_parallel_lookup(runtime, table, unique), [size, table.shape[-1]])
    return tf.reshape(tf.gather(rows, index), ids.shape.as_list() + [table.shape[-1]])


def swish_layer_norm(x: tf.Tensor, norm: LayerNorm) -> tf.Tensor:
    """SwishLayerNorm (ops/pytorch/pt_layer_norm.py): x * sigmoid(LayerNorm(x)), in float32."""
    xf = tf.cast(x, tf.float32)
    return tf.cast(xf * tf.sigmoid(tf.cast(norm(xf), tf.float32)), x.dtype)


def replica_max(lengths: tf.Tensor, groups: int) -> tf.Tensor:
    """The longest sequence of each replica's batch, repeated for its rows ([B]): `groups` replicas hold
    consecutive equal slices of the batch (1 on a per-replica runtime, where the batch is the replica's)."""
    per = tf.reduce_max(tf.reshape(lengths, [groups, -1]), axis=1, keepdims=True)
    return tf.reshape(tf.broadcast_to(per, [groups, tf.shape(lengths)[0] // groups]), [-1])


class MLP(Block):
    """LN(W2 SwishLN(W1 x + b1) + b2): the reference's content, action and item MLPs."""

    def __init__(self, runtime: Runtime, path: str, seed: int, dims: Sequence[int], init: str,
                 float32: bool = False) -> None:
        super().__init__(runtime, path, seed)
        d_in, d_hid, d_out = dims
        make = xavier_normal if init == "normal" else glorot_uniform
        dense = Float32Dense if float32 else Dense
        self.w1 = dense(runtime, f"{path}/w1", seed, d_in, d_hid, init=make(d_in, d_hid, f"{path}/w1/kernel", seed))
        self.swish = LayerNorm(runtime, f"{path}/swish_layer_norm", seed, d_hid, epsilon=1e-5)
        self.w2 = dense(runtime, f"{path}/w2", seed, d_hid, d_out,
                        init=make(d_hid, d_out, f"{path}/w2/kernel", seed))
        self.norm = LayerNorm(runtime, f"{path}/layer_norm", seed, d_out, epsilon=1e-5)

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        return self.norm(self.w2(swish_layer_norm(self.w1(x), self.swish)))


class STULayer(Block):
    """One STU layer (modules/stu.py STULayer with the PyTorch ops of ops/pytorch/):

    n = LN(x); [U, V, Q, K] = n W_uvqk + b; U = SiLU(U);
    A = SiLU(alpha Q K^T) / N, causal (j <= i) within the sample, no softmax;
    y = [U, A V, U * LN(A V)]; x' = x + dropout(y) W_out.
    """

    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig) -> None:
        super().__init__(runtime, path, seed)
        d, h = cfg.embedding_dim, cfg.num_heads
        self.heads, self.qk, self.uv = h, cfg.attention_dim, cfg.linear_dim
        self.rate = cfg.linear_dropout
        width = h * (2 * self.uv + 2 * self.qk)
        self.input_norm = LayerNorm(runtime, f"{path}/input_layer_norm", seed, d, epsilon=1e-6)
        self.uvqk = self.var("uvqk_kernel", (d, width), (None, None),
                             glorot_uniform(d, width, f"{path}/uvqk_kernel", seed))
        self.uvqk_bias = self.var("uvqk_bias", (width,), (None,), constant(0.0))
        self.output_norm = LayerNorm(runtime, f"{path}/output_layer_norm", seed, h * self.uv, epsilon=1e-6)
        self.out = self.var("output_kernel", (3 * h * self.uv, d), (None, None),
                            glorot_uniform(3 * h * self.uv, d, f"{path}/output_kernel", seed))

    def __call__(self, x: tf.Tensor, valid: tf.Tensor, n_max: tf.Tensor, seed: tf.Tensor | None) -> tf.Tensor:
        """x [B, S, D]; valid [B, S] 1 for real positions; n_max [B] the replica's longest length."""
        b, s = tf.shape(x)[0], tf.shape(x)[1]
        h, qk, uv = self.heads, self.qk, self.uv
        normed = self.input_norm(x)
        proj = tf.matmul(normed, tf.cast(self.uvqk, x.dtype)) + tf.cast(self.uvqk_bias, x.dtype)
        u, v, q, k = tf.split(proj, [h * uv, h * uv, h * qk, h * qk], axis=-1)
        u = silu(u)
        q = tf.reshape(q, [b, s, h, qk])
        k = tf.reshape(k, [b, s, h, qk])
        v = tf.reshape(v, [b, s, h, uv])
        scores = tf.einsum("bihd,bjhd->bhij", tf.cast(q, tf.float32), tf.cast(k, tf.float32)) / math.sqrt(qk)
        causal = tf.linalg.band_part(tf.ones([s, s], tf.float32), -1, 0)
        mask = causal[None, None] * tf.cast(valid, tf.float32)[:, None, None, :]
        scale = 1.0 / tf.cast(n_max, tf.float32)[:, None, None, None]
        attn = tf.cast(silu(scores) * scale * mask, x.dtype)
        a = tf.reshape(tf.einsum("bhij,bjhd->bihd", attn, v), [b, s, h * uv])
        uf, af = tf.cast(u, tf.float32), tf.cast(a, tf.float32)
        y = tf.concat([uf, af, uf * tf.cast(self.output_norm(af), tf.float32)], axis=-1)
        # Drawn on y laid out whole but for the batch (a mesh draws a split tensor's mask per shard).
        y = dropout(self.runtime.place(tf.cast(y, x.dtype), ("batch", None, None)), self.rate, seed)
        return x + tf.matmul(y, tf.cast(self.out, x.dtype))


class HSTURanker(Block):
    """The whole ranker: table lookups, ContextualPreprocessor, positional encoder, STU stack,
    timestamp postprocessor, item MLP and the dot-product head; `logits(batch)` gives [B] float32.

    Batch features (B rows, H = history_length): `uih_{item,artist,album}_id`, `uih_action` (bits 1/2/4)
    and `uih_timestamp` [B, H] zero-padded past `uih_length` [B]; `cand_{item,artist,album}_id` [B];
    `context_ids` [B, 8] (the CONTEXT_TABLES' ids in order); `label` [B].
    """

    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig) -> None:
        super().__init__(runtime, path, seed)
        problems = cfg.check()
        if problems:
            raise ValueError(problems[0])
        self.cfg = cfg
        d, hid, a = cfg.embedding_dim, cfg.preprocessor_hidden_dim, cfg.action_embedding_dim
        # A table's rows are padded to a multiple of the devices splitting them (1,293,395 artists do not divide
        # by 8); the padded rows are never looked up, so they neither train nor change a result.
        shards = runtime.shards("vocab")
        self.tables = {
            name: self.var(f"tables/{name}", (-(-rows // shards) * shards, d), ("vocab", None),
                           uniform(1.0 / math.sqrt(rows), f"{path}/tables/{name}", seed))
            for name, rows in cfg.tables.items()}
        # ContextualPreprocessor: content, additional (artist, album) and action MLPs, contextual linears.
        self.content = MLP(runtime, f"{path}/content_mlp", seed, (d, hid, d), "normal")
        self.additional = MLP(runtime, f"{path}/additional_mlp", seed, (2 * d, hid, d), "normal")
        self.action_table = self.var("action_embeddings", (NUM_ACTION_BITS, a), (None, None),
                                     normal(0.1, f"{path}/action_embeddings", seed))
        self.target_action = self.var("target_action_embedding", (1, NUM_ACTION_BITS * a), (None, None),
                                      normal(0.1, f"{path}/target_action_embedding", seed))
        self.action = MLP(runtime, f"{path}/action_mlp", seed, (NUM_ACTION_BITS * a, hid, d), "normal")
        self.context_kernel = self.var("context_kernel", (NUM_CONTEXT, d, d), (None, None, None),
                                       normal(math.sqrt(2.0 / (2 * d)), f"{path}/context_kernel", seed))
        self.context_bias = self.var("context_bias", (NUM_CONTEXT, d), (None, None), constant(0.0))
        # HSTUPositionalEncoder.
        p, t = cfg.num_position_buckets, cfg.num_time_buckets
        self.position = self.var("position_embeddings", (p, d), (None, None),
                                 uniform(math.sqrt(1.0 / p), f"{path}/position_embeddings", seed))
        self.time = self.var("time_embeddings", (t + 1, d), (None, None),
                             uniform(math.sqrt(1.0 / t), f"{path}/time_embeddings", seed))
        self.layers = [STULayer(runtime, f"{path}/stu_{i}", seed, cfg) for i in range(cfg.num_layers)]
        # TimestampLayerNormPostprocessor.
        self.combiner = Dense(runtime, f"{path}/time_combiner", seed, d + 2 * len(TIME_FEATURES), d,
                              init=xavier_normal(d + 2 * len(TIME_FEATURES), d, f"{path}/time_combiner/kernel",
                                                 seed))
        self.post_norm = LayerNorm(runtime, f"{path}/post_layer_norm", seed, d, epsilon=1e-5)
        # Item MLP and head, in float32 in the reference.
        self.item = MLP(runtime, f"{path}/item_mlp", seed, (3 * d, cfg.item_hidden_dim, d), "uniform",
                        float32=True)
        hh = cfg.head_hidden_dim
        self.head_hidden = Float32Dense(runtime, f"{path}/head/hidden", seed, d, hh,
                                        init=glorot_uniform(d, hh, f"{path}/head/hidden/kernel", seed))
        self.head_norm = LayerNorm(runtime, f"{path}/head/swish_layer_norm", seed, hh, epsilon=1e-5)
        self.head_out = Float32Dense(runtime, f"{path}/head/out", seed, hh, 1,
                                     init=glorot_uniform(hh, 1, f"{path}/head/out/kernel", seed))

    # ---------------------------------------------------------------------------------- pieces
    def sequence_ids(self, batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """Per item position [B, H + 1]: history events, the candidate at index n, zeros after it."""
        n = tf.cast(batch["uih_length"], tf.int32)
        width = self.cfg.history_length + 1
        j = tf.range(width)[None, :]
        is_hist, is_cand = j < n[:, None], tf.equal(j, n[:, None])
        out = {}
        for name in ITEM_TABLES:
            hist = tf.pad(tf.cast(batch[f"uih_{name}"], tf.int64), [[0, 0], [0, 1]])
            cand = tf.cast(batch[f"cand_{name}"], tf.int64)[:, None]
            out[name] = tf.where(is_hist, hist, tf.where(is_cand, cand, tf.zeros_like(hist)))
        ts = tf.pad(tf.cast(batch["uih_timestamp"], tf.int64), [[0, 0], [0, 1]])
        # The candidate's query time is the last history event's timestamp (yambda.py `_build_sample`).
        query = tf.gather(ts, tf.maximum(n - 1, 0), batch_dims=1)
        out["timestamp"] = tf.where(is_hist, ts, tf.where(is_cand, query[:, None], tf.zeros_like(ts)))
        out["action"] = tf.where(is_hist, tf.pad(tf.cast(batch["uih_action"], tf.int32), [[0, 0], [0, 1]]), 0)
        out["is_hist"], out["is_cand"], out["query_time"] = is_hist, is_cand, query
        return out

    def preprocess(self, ids: dict[str, tf.Tensor], emb: dict[str, tf.Tensor],
                   ctx: tf.Tensor) -> tf.Tensor:
        """ContextualPreprocessor: [B, 8 + H + 1, D] in the compute dtype."""
        dt = self.dtype
        content = self.content(tf.cast(emb["item_id"], dt))
        additional = self.additional(tf.cast(tf.concat([emb["artist_id"], emb["album_id"]], -1), dt))
        bits = tf.stack([tf.cast(tf.bitwise.bitwise_and(ids["action"], 1 << i) > 0, tf.float32)
                         for i in range(NUM_ACTION_BITS)], axis=-1)
        hist_action = tf.reshape(bits[..., None] * self.action_table,
                                 tf.concat([tf.shape(bits)[:2], [-1]], 0))
        cand = tf.cast(ids["is_cand"], tf.float32)[..., None]
        act = hist_action * (1.0 - cand) + cand * self.target_action
        items = content + additional + self.action(tf.cast(act, dt))
        context = tf.einsum("bkd,kde->bke", tf.cast(ctx, dt), tf.cast(self.context_kernel, dt))
        context = context + tf.cast(self.context_bias, dt)
        return tf.concat([context, items], axis=1)

    def positions(self, lengths: tf.Tensor, width: int) -> tf.Tensor:
        """Position buckets [B, S]: 0..7 for the contextual tokens, then (L - 1 - j) + 8 (the candidate 8,
        the newest event 9, ...), clamped to the table (pt_position.py `_get_col_indices`, one target)."""
        j = tf.range(width)[None, :]
        high = lengths[:, None] - 1
        pos = high - tf.minimum(j, high) + NUM_CONTEXT
        pos = tf.minimum(pos, self.cfg.num_position_buckets - 1)
        return tf.where(j < NUM_CONTEXT, j, pos)

    def time_buckets(self, timestamps: tf.Tensor, query: tf.Tensor) -> tf.Tensor:
        """floor(sqrt(max(q - t, 1e-6) / 60)) clamped to [0, num_time_buckets], in float32 as the reference."""
        delta = tf.cast(query[:, None] - timestamps, tf.float32)
        buckets = tf.cast(tf.sqrt(tf.maximum(delta, 1e-6) / 60.0), tf.int32)
        return tf.clip_by_value(buckets, 0, self.cfg.num_time_buckets)

    def postprocess(self, h: tf.Tensor, query: tf.Tensor) -> tf.Tensor:
        # The reference's float32 floor(q / unit), its quotient formed in float64 and rounded to float32 once (the
        # same value): XLA divides a float32 by a constant as a multiply by its reciprocal, which floors differently
        # at hour boundaries (896 of 200,000 timestamps near 1.6e9).
        q = tf.cast(tf.cast(query, tf.float32), tf.float64)[:, None]
        feats = []
        for unit, per in TIME_FEATURES:
            whole = tf.floor(tf.cast(q / float(unit), tf.float32))
            elapsed = tf.math.floormod(whole, float(per)) / float(per) * TWO_PI_REFERENCE
            feats += [tf.cos(elapsed), tf.sin(elapsed)]
        x = tf.concat([tf.cast(h, tf.float32)] + feats, axis=-1)
        return tf.cast(self.post_norm(tf.cast(self.combiner(tf.cast(x, self.dtype)), tf.float32)), tf.float32)

    # ---------------------------------------------------------------------------------- forward
    def logits(self, batch: dict[str, tf.Tensor], seed: tf.Tensor | None = None, groups: int = 1) -> tf.Tensor:
        """Logits [B] (float32). `seed` enables dropout (training); `groups` replicas share this batch."""
        cfg = self.cfg
        ids = self.sequence_ids(batch)
        emb = {name: lookup(self.runtime, self.tables[name], ids[name]) for name in ITEM_TABLES}
        ctx_ids = tf.cast(batch["context_ids"], tf.int64)
        ctx = tf.stack([lookup(self.runtime, self.tables[name], ctx_ids[:, k])
                        for k, name in enumerate(CONTEXT_TABLES)], 1)
        x = self.preprocess(ids, emb, ctx)
        n = tf.cast(batch["uih_length"], tf.int32)
        lengths = n + 1 + NUM_CONTEXT
        width = cfg.history_length + 1 + NUM_CONTEXT
        ts = tf.concat([tf.zeros([tf.shape(n)[0], NUM_CONTEXT], tf.int64), ids["timestamp"]], axis=1)
        pos = tf.gather(self.position, self.positions(lengths, width))
        tim = tf.gather(self.time, self.time_buckets(ts, ids["query_time"]))
        valid = tf.cast(tf.range(width)[None, :] < lengths[:, None], x.dtype)
        x = (x * math.sqrt(cfg.embedding_dim) + tf.cast(pos + tim, x.dtype)) * valid[..., None]
        site = 0
        if seed is not None:
            x = dropout(self.runtime.place(x, ("batch", None, None)), cfg.input_dropout,
                        tf.random.experimental.stateless_fold_in(seed, site))
        n_max = replica_max(lengths, groups)
        for i, layer in enumerate(self.layers):
            layer_seed = None if seed is None else tf.random.experimental.stateless_fold_in(seed, i + 1)
            x = layer(x, valid, n_max, layer_seed)
        h = tf.gather(x, lengths - 1, batch_dims=1)
        user = self.postprocess(h, ids["query_time"])
        cand = tf.concat([lookup(self.runtime, self.tables[name], tf.cast(batch[f"cand_{name}"], tf.int64))
                          for name in ITEM_TABLES], axis=-1)
        item = tf.cast(self.item(tf.cast(cand, tf.float32)), tf.float32)
        hidden = self.head_hidden(user * item)
        hidden = tf.cast(hidden, tf.float32) * tf.sigmoid(tf.cast(self.head_norm(hidden), tf.float32))
        return tf.reshape(tf.cast(self.head_out(hidden), tf.float32), [-1])

    def loss_sum(self, logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """loss_weight x the summed BCE-with-logits (divided by the global batch by the loop)."""
        bce = tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.cast(labels, tf.float32), logits=logits)
        return self.cfg.loss_weight * tf.reduce_sum(bce)
