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

import dataclasses
import math

import numpy as np
import tensorflow as tf

from harness.nn.layers import NEG_INF, Block, RMSNorm, normal, rotary, vocab_parallel_lookup
from harness.runtime.base import Runtime

from benchmarks.gpt_oss.config import ModelConfig


# ------------------------------------------------------------------------------------- attention

def block_plan(seq: int, window: int, block: int) -> tuple[int, int]:
    """(query block, look-back blocks) for a causal window of `window` tokens over rows of `seq`: one
    dense block when the window covers the row, else blocks of `block` that see `ceil((window-1)/block)`
    earlier blocks, so the cost grows with seq x window instead of seq^2."""
    if window >= seq or block >= seq:
        return seq, 0
    return block, math.ceil((window - 1) / block)


def visible(seq: int, window: int, block: int) -> np.ndarray:
    """Causal window mask [blocks, block, (lookback + 1) * block]: key k is visible to query q when
    q - window < k <= q (and k >= 0)."""
    blk, back = block_plan(seq, window, block)
    nb = seq // blk
    q = np.arange(nb)[:, None, None] * blk + np.arange(blk)[None, :, None]
    k = (np.arange(nb)[:, None, None] - back) * blk + np.arange((back + 1) * blk)[None, None, :]
    return (k >= 0) & (k <= q) & (q - k < window)


def _lookback(t: tf.Tensor, back: int, fill) -> tf.Tensor:
    """t [batch, blocks, block, ...] -> [batch, blocks, (back + 1) * block, ...]: each block preceded by
    its `back` predecessors (padded with `fill` before the row's start)."""
    if back == 0:
        return t
    pad = [[0, 0], [back, 0]] + [[0, 0]] * (len(t.shape) - 2)
    padded = tf.pad(t, pad, constant_values=fill)
    nb = t.shape[1]
    return tf.concat([padded[:, j:j + nb] for j in range(back + 1)], axis=2)


def windowed_attention(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, segments: tf.Tensor | None, window: int,
                       block: int) -> tf.Tensor:
    """Causal attention within `window` tokens, blockwise; q [b, s, kv, g, d] (g query heads per key/value
    head), k/v [b, s, kv, d]; `segments` [b, s] (None: attention crosses documents). Returns q's shape."""
    b, seq, kv, g, d = q.shape
    blk, back = block_plan(seq, window, block)
    nb = seq // blk
    qb = tf.reshape(q, [b, nb, blk, kv, g, d])
    kb = _lookback(tf.reshape(k, [b, nb, blk, kv, d]), back, 0)
    vb = _lookback(tf.reshape(v, [b, nb, blk, kv, d]), back, 0)
    # Reshapes and expand_dims, not [None] indexing: a new-axis strided slice crashes DTensor's SPMD pass.
    mask = visible(seq, window, block)
    allowed = tf.constant(mask.reshape((1,) + mask.shape))                       # [1, nb, blk, keys]
    if segments is not None:
        sq = tf.reshape(segments, [b, nb, blk])
        sk = _lookback(sq, back, -1)
        allowed = tf.logical_and(allowed, tf.equal(tf.expand_dims(sq, 3), tf.expand_dims(sk, 2)))
    # The softmax runs over [b, nb, kv, g * blk, keys], rank 5: oneDNN's softmax (on by default on AVX-512
    # CPUs) refuses rank 6, and accelerators tile rank-5 tensors as well. The bias repeats over the g query
    # heads of a group (g-major, as the reshape of [g, blk] orders them) and broadcasts over kv.
    bias = tf.tile(tf.expand_dims(tf.where(allowed, 0.0, NEG_INF), 2), [1, 1, 1, g, 1])  # [b, nb, 1, g*blk, keys]
    scores = tf.einsum("bnqhgd,bnkhd->bnhgqk", qb, kb)
    keys = scores.shape[-1]
    scores = tf.reshape(scores, [b, nb, kv, g * blk, keys])
    probs = tf.nn.softmax(tf.cast(scores, tf.float32) * (d ** -0.5) + bias, axis=-1)
    probs = tf.reshape(tf.cast(probs, v.dtype), [b, nb, kv, g, blk, keys])
    out = tf.einsum("bnhgqk,bnkhd->bnqhgd", probs, vb)
    return tf.reshape(out, [b, seq, kv, g, d])


class Attention(Block):
    """Grouped-query self-attention with RoPE; query kernel [hidden, kv, g, d], so a key/value head and
    its query group live on one device when `heads` is split."""

    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig, window: int) -> None:
        super().__init__(runtime, path, seed)
        m, kv, d = cfg.hidden_size, cfg.num_kv_heads, cfg.head_dim
        g = cfg.num_heads // kv
        self.cfg, self.window, self.groups = cfg, window, g
        init = lambda name: normal(cfg.init_stddev, f"{path}/{name}/kernel", seed)  # noqa: E731
        self.wq = self.var("query/kernel", (m, kv, g, d), (None, "heads", None, None), init("query"))
        self.wk = self.var("key/kernel", (m, kv, d), (None, "heads", None), init("key"))
        self.wv = self.var("value/kernel", (m, kv, d), (None, "heads", None), init("value"))
        self.wo = self.var("output/kernel", (kv, g, d, m), ("heads", None, None, None), init("output"))

    def __call__(self, x: tf.Tensor, segments: tf.Tensor | None) -> tf.Tensor:
        dt, base = self.dtype, self.cfg.rope_base
        q = rotary(tf.einsum("bsm,mhgd->bshgd", x, tf.cast(self.wq, dt)), base)
        k = rotary(tf.einsum("bsm,mhd->bshd", x, tf.cast(self.wk, dt)), base)
        v = tf.einsum("bsm,mhd->bshd", x, tf.cast(self.wv, dt))
        ctx = windowed_attention(q, k, v, segments, self.window, self.cfg.attention_block)
        return tf.einsum("bshgd,hgdm->bsm", ctx, tf.cast(self.wo, dt))


# ------------------------------------------------------------------------------ mixture of experts

@dataclasses.dataclass
class Routing:
    """One MoE layer's routing of a batch: dispatch/combine [b, groups, s, experts, capacity] and the
    sums the auxiliary losses and health metrics need."""
    dispatch: tf.Tensor
    combine: tf.Tensor
    balance_sum: tf.Tensor   # sum over groups of E * sum_i f_i P_i (Switch/GShard load-balancing loss)
    z_sum: tf.Tensor         # sum over tokens of logsumexp(router logits)^2 (ST-MoE z-loss)
    dropped: tf.Tensor       # [b]: each row's assignments dropped for capacity
    groups: int
    tokens: int


def expert_capacity(group: int, experts: int, k: int, capacity_factor: float) -> int:
    """Slots per expert per group: the whole group when dropless (no expert can receive a token twice, so
    nothing overflows), else ceil(cf * group * k / experts) (Switch eq. 3 for top-k), at most the group."""
    if capacity_factor <= 0:
        return group
    return max(1, min(group, math.ceil(capacity_factor * group * k / experts)))


def route(logits: tf.Tensor, k: int, capacity: int) -> Routing:
    """Token-choice top-k routing of logits [b, groups, s, experts] (float32).

    The k experts are the top-k logits; their weights are a softmax over those k logits (gpt-oss). The
    top-k only picks indices (no gradient through TopKV2, which DTensor cannot partition); weights come
    from a one-hot product with the logits. Slots are assigned in priority order, every token's first
    choice before any second choice, earlier tokens first (causal-safe); assignments past `capacity` are
    dropped and the token keeps its residual only.
    """
    b, ng, s, e = logits.shape
    index = tf.math.top_k(tf.stop_gradient(logits), k).indices                  # [b, g, s, k]
    choice = tf.one_hot(index, e, dtype=tf.float32)                               # [b, g, s, k, e]
    gates = tf.nn.softmax(tf.reduce_sum(choice * tf.expand_dims(logits, 3), -1), -1)  # [b, g, s, k]
    priority = tf.reshape(tf.transpose(choice, [0, 1, 3, 2, 4]), [b, ng, k * s, e])
    position = tf.reduce_sum(tf.cumsum(priority, axis=2, exclusive=True) * priority, -1)
    position = tf.transpose(tf.reshape(position, [b, ng, k, s]), [0, 1, 3, 2])    # [b, g, s, k]
    kept = tf.cast(position < capacity, tf.float32)
    slot = tf.one_hot(tf.cast(position, tf.int32), capacity, dtype=tf.float32) * tf.expand_dims(kept, -1)
    dispatch = tf.einsum("bgske,bgskc->bgsec", choice, slot)
    combine = tf.einsum("bgske,bgskc,bgsk->bgsec", choice, slot, gates)
    fraction = tf.reduce_mean(choice, [2, 3])                                     # f_i: sums to 1
    # Softmax and logsumexp spelled out: the gradients of tf.nn.softmax and tf.reduce_logsumexp sum with
    # keep_dims, which DTensor's reduce expander rejects on these batch-split logits.
    # Partial reductions are einsums with ones (their gradients are einsums too, not Tile).
    top = tf.stop_gradient(tf.reduce_max(logits, -1))
    exp = tf.exp(logits - tf.expand_dims(top, -1))
    total = tf.einsum("bgse,e->bgs", exp, tf.ones([e]))
    prob = tf.einsum("bgse,s->bge", exp / tf.expand_dims(total, -1), tf.fill([s], 1.0 / s))  # P_i
    lse = top + tf.math.log(total)
    return Routing(dispatch, combine, balance_sum=float(e) * tf.reduce_sum(fraction * prob),
                   z_sum=tf.reduce_sum(tf.square(lse)), dropped=tf.reduce_sum(1.0 - kept, [1, 2, 3]),
                   groups=b * ng, tokens=b * ng * s)


class MoE(Block):
    """Experts [experts, hidden, ff] SwiGLU feed-forwards behind a float32 router.

    Tokens [b, s, m] are cut into groups; each group's tokens go to their experts' slots by a one-hot
    dispatch einsum, giving [experts, b, groups, capacity, m] with the batch split; `place` then splits
    the experts instead (on a mesh with experts and batch on one axis: an all-to-all), each device runs its
    experts (with `ff` split too: tensor parallelism inside an expert), and the reverse trip brings the
    outputs home to be combined with the gate weights.
    """

    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig) -> None:
        super().__init__(runtime, path, seed)
        m, e, h = cfg.hidden_size, cfg.num_experts, cfg.expert_hidden
        self.cfg = cfg
        init = lambda name: normal(cfg.init_stddev, f"{path}/{name}", seed)  # noqa: E731
        self.router = self.var("router/kernel", (m, e), (None, None), init("router/kernel"))
        self.w_gate = self.var("experts/gate/kernel", (e, m, h), ("experts", None, "ff"), init("experts/gate"))
        self.w_up = self.var("experts/up/kernel", (e, m, h), ("experts", None, "ff"), init("experts/up"))
        self.w_down = self.var("experts/down/kernel", (e, h, m), ("experts", "ff", None), init("experts/down"))

    def __call__(self, x: tf.Tensor) -> tuple[tf.Tensor, Routing]:
        c, dt = self.cfg, self.dtype
        b, seq, m = x.shape
        s = min(c.moe_group_size, seq)
        xg = tf.reshape(x, [b, seq // s, s, m])
        logits = tf.einsum("bgsm,me->bgse", tf.cast(xg, tf.float32), self.router)
        r = route(logits, c.experts_per_token, expert_capacity(s, c.num_experts, c.experts_per_token,
                                                                c.capacity_factor))
        xe = tf.einsum("bgsec,bgsm->ebgcm", tf.cast(r.dispatch, dt), xg)
        xe = self.runtime.place(xe, ("experts", None, None, None, None))
        gate = tf.einsum("ebgcm,emh->ebgch", xe, tf.cast(self.w_gate, dt))
        up = tf.einsum("ebgcm,emh->ebgch", xe, tf.cast(self.w_up, dt))
        ye = tf.einsum("ebgch,ehm->ebgcm", tf.nn.silu(gate) * up, tf.cast(self.w_down, dt))
        ye = self.runtime.place(ye, (None, "batch", None, None, None))
        y = tf.einsum("bgsec,ebgcm->bgsm", tf.cast(r.combine, dt), ye)
        return tf.reshape(y, [b, seq, m]), r


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
            x, r = layer(x, segments)
            routings.append(r)
        x = self.final_norm(x)
        logits = tf.einsum("bsm,mv->bsv", x, tf.cast(self.output, self.dtype))
        return tf.cast(logits, tf.float32), routings
