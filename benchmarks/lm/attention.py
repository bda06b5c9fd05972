"""Causal grouped-query self-attention with RoPE, dense or blockwise within a window: the decoder LMs' attention.

Named dimensions: `heads` (key/value heads, their query groups with them) so a mesh runtime can split
them. The config passed in needs hidden_size, num_heads, num_kv_heads, head_dim, rope_base and
init_stddev, and attention_block unless the caller gives `block`. Every shape is static and no op leaves the device.
Options of the block (gpt-oss's, off for Llama): q/k/v/o biases, per-head attention sinks, q/k RMSNorm;
and LoRA adapters on the fused q/k/v and the output projections (`Lora`: llama2_70b_lora's fine-tune).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Callable, Iterator

import tensorflow as tf

from harness.nn.layers import (NEG_INF, Block, RMSNorm, RopeScaling, YarnScaling, _seed, constant, dropout,
                               normal, rotary)
from harness.runtime.base import Runtime, after_zero


# ------------------------------------------------------------------------------------- attention

def block_plan(seq: int, window: int, block: int) -> tuple[int, int]:
    """(query block, look-back blocks) for a causal window of `window` tokens over rows of `seq`: one
    dense block when the window covers the row, else blocks of `block` that see `ceil((window-1)/block)`
    earlier blocks, so the cost grows with seq x window instead of seq^2."""
    if window >= seq or block >= seq:
        return seq, 0
    return block, math.ceil((window - 1) / block)


def _lookback(t: tf.Tensor, back: int, fill) -> tf.Tensor:
    """t [batch, blocks, block, ...] -> [batch, blocks, (back + 1) * block, ...]: each block preceded by
    its `back` predecessors (padded with `fill` before the row's start)."""
    if back == 0:
        return t
    pad = [[0, 0], [back, 0]] + [[0, 0]] * (len(t.shape) - 2)
    padded = tf.pad(t, pad, constant_values=fill)
    nb = t.shape[1]
    return tf.concat([padded[:, j:j + nb] for j in range(back + 1)], axis=2)


def positions(like: tf.Tensor) -> tf.Tensor:
    """Each token's position [b, seq] as float32 (exact up to 2^24), made from the data: `like` [b, seq] is
    any float tensor of the row (e.g. one hidden unit of the layer input), and like * 0 + range is not
    something XLA may fold (a float multiply by zero keeps NaN), where a window mask compared from
    constant positions is folded into a constant as large as the mask."""
    seq = like.shape[1]
    return tf.cast(like, tf.float32) * 0.0 + tf.range(seq, dtype=tf.float32)


def windowed_attention(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, segments: tf.Tensor | None, window: int,
                       block: int, like: tf.Tensor, xla: bool = False, sinks: tf.Tensor | None = None) -> tf.Tensor:
    """Causal attention within `window` tokens, blockwise; q [b, s, kv, g, d] (g query heads per key/value
    head), k/v [b, s, kv, d]; `segments` [b, s] (None: attention crosses documents); `like` [b, s]: see
    `positions`; `xla`: the formulation for XLA and `sinks` the heads' sink logits (`_attend`). Returns q's shape.

    Each query block attends to its own and `lookback` earlier key blocks; the blocks join the batch
    ([b * blocks, ...], b outer, so a `batch` split stays on the outer dimension) and go through the
    same kernel as full causal attention, the window and the documents as an additive bias."""
    b, seq, kv, g, d = q.shape
    blk, back = block_plan(seq, window, block)
    nb = seq // blk
    keys = (back + 1) * blk
    qb = tf.reshape(q, [b * nb, blk, kv, g, d])
    kb = tf.reshape(_lookback(tf.reshape(k, [b, nb, blk, kv, d]), back, 0), [b * nb, keys, kv, d])
    vb = tf.reshape(_lookback(tf.reshape(v, [b, nb, blk, kv, d]), back, 0), [b * nb, keys, kv, d])
    # Reshapes and expand_dims, not [None] indexing: a new-axis strided slice crashes DTensor's SPMD pass.
    pq = tf.reshape(positions(like), [b, nb, blk])
    pk = tf.expand_dims(_lookback(pq, back, -float(seq + window)), 2)                # padding: never visible
    pq = tf.expand_dims(pq, 3)
    allowed = (pk <= pq) & (pq - pk < window)                                          # [b, nb, blk, keys]
    if segments is not None:
        sq = tf.reshape(segments, [b, nb, blk])
        allowed &= tf.equal(tf.expand_dims(sq, 3), tf.expand_dims(_lookback(sq, back, -1), 2))
    bias = tf.reshape(tf.where(allowed, 0.0, NEG_INF), [b * nb, blk, keys])
    return tf.reshape(_attend(qb, kb, vb, bias, xla, sinks), [b, seq, kv, g, d])


QUERY_CHUNK = 1024  # full causal attention over longer rows: queries in strips of this many
HALVED_FROM = 512   # rows from this many tokens up to 2 * QUERY_CHUNK: two strips


def query_chunk(seq: int) -> int:
    """The strip of queries `causal_attention` takes by default for rows of `seq` tokens: QUERY_CHUNK for
    rows longer than 2 * QUERY_CHUNK; half the row from HALVED_FROM tokens (the scores' upper right quarter,
    all masked, is never computed: one layer's attention forward and backward at scripts/bench_lm_step.py's
    wide shape, 512 tokens, took 117 ms as one block and 88 in two strips under XLA, 113 and 96 without,
    process CPU time on 2 cores); shorter rows one block."""
    if seq > 2 * QUERY_CHUNK:
        return QUERY_CHUNK
    if seq >= HALVED_FROM and seq % 2 == 0:
        return seq // 2
    return seq


def causal_attention(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, chunk: int | None = None,
                     xla: bool = False, sinks: tf.Tensor | None = None, scale: float | None = None) -> tf.Tensor:
    """Full causal attention over the row; the same function as `windowed_attention` with a window of the
    whole row and no segments. q [b, s, kv, g, d], k/v [b, s, kv, d]; returns q's shape. `xla`: the
    formulation for XLA, `sinks` the heads' sink logits, `scale` the score scale (`_attend`).

    Queries in strips of `chunk` (default `query_chunk`; when it divides the row), each against only the keys
    up to its own end, so the scores a step holds (and the backward keeps) are the causal lower triangle in
    strips, about (n + 1) / 2n of the dense [seq, seq] (0.56 at 8192 tokens in strips of 1024, 0.75 in two),
    and the multiply-adds shrink with them; a chunk as long as the row is one dense block. Masked keys give
    exactly zero weight, so the strips compute what the dense block computes."""
    chunk = query_chunk(q.shape[1]) if chunk is None else chunk
    seq = q.shape[1]
    if chunk >= seq or seq % chunk:
        return _attend(q, k, v, causal_bias(0, seq, seq), xla, sinks, scale)
    return tf.concat([_attend(q[:, i:i + chunk], k[:, :i + chunk], v[:, :i + chunk],
                              causal_bias(i, chunk, i + chunk), xla, sinks, scale)
                      for i in range(0, seq, chunk)], axis=1)


def causal_bias(start: int, queries: int, keys: int) -> tf.Tensor:
    """Additive mask [queries, keys]: 0 where key <= start + query, NEG_INF after. A band of ones: XLA lowers
    band_part to an iota compare it neither folds nor stores, where masks compared from constant positions
    are folded into constants as large as the masks (36M floats for one layer's strips at 8192 tokens, and
    a bias tiled over batch and heads far more), and masks from positions made from the data cost a
    [b, queries, keys] bias and 30% more attention time under XLA. TensorFlow's own constant folding (10 MiB
    per tensor at most) still folds the small strips' bands: at 8192 tokens the first two (12 MiB; tested)."""
    return (tf.linalg.band_part(tf.ones([queries, keys]), -1, start) - 1.0) * -NEG_INF


def _with_sink(scores: tf.Tensor, sink: tf.Tensor | None) -> tf.Tensor:
    """Softmax over the last axis of float32 `scores`, with `sink` (broadcast to scores[..., :1]; None: no
    sink) as one more logit in the denominator that takes no value: exp(s_j) / (sum_j exp(s_j) + exp(sink))."""
    if sink is None:
        return tf.nn.softmax(scores, axis=-1)
    keys = scores.shape[-1]
    column = tf.broadcast_to(sink, scores.shape[:-1].as_list() + [1])
    return tf.nn.softmax(tf.concat([scores, column], -1), axis=-1)[..., :keys]


def _attend(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, bias: tf.Tensor, xla: bool,
            sinks: tf.Tensor | None = None, scale: float | None = None) -> tf.Tensor:
    """Softmax attention of queries q [b, c, kv, g, d] over keys k/v [b, keys, kv, d] with an additive
    float32 `bias` (0 or NEG_INF) [c, keys] or [b, c, keys], the same for every head. `sinks` [kv, g]
    (float32; None: none): each query head's attention-sink logit, which joins the softmax's denominator
    unscaled and unmasked and attends to nothing (gpt-oss; transformers eager_attention_forward), so a
    query may give its keys less than weight 1 in all. `scale` multiplies the scores (None: d^-0.5); the
    values' dimension may differ from the queries' and keys' (MLA's), the output has the values'.

    Two formulations of the same numbers, each the faster on its compiler (fwd + bwd, both shapes of
    scripts/bench_lm_step.py, by 10-25%): for TensorFlow's kernels, batched matmuls over [b, kv] (the g
    query heads of a key/value head share its keys without a copy: queries as [b, kv, g * c, d], g
    merged into the rows inside each kv, so a `heads` split stays on the outer kv); for XLA, einsums over
    [b, c, kv * g, d] with the keys broadcast over the groups, whose layouts XLA chooses itself. Either
    way the softmax runs over rank 4 (oneDNN's softmax refuses rank 6) and the bias broadcasts over the
    heads, nothing tiled."""
    b, c, kv, g, d = q.shape
    keys, dv = k.shape[1], v.shape[-1]
    scale = d ** -0.5 if scale is None else scale
    if len(bias.shape) == 3:
        bias = tf.expand_dims(bias, 1)                                                # [b, 1, c, keys]
    if xla:
        qh = tf.reshape(q, [b, c, kv * g, d])
        kh, vh = (tf.reshape(tf.broadcast_to(tf.expand_dims(t, 3), [b, keys, kv, g, t.shape[-1]]),
                             [b, keys, kv * g, t.shape[-1]]) for t in (k, v))
        scores = tf.einsum("bqhd,bkhd->bhqk", qh, kh)                                 # [b, kv * g, c, keys]
        sink = None if sinks is None else tf.reshape(sinks, [1, kv * g, 1, 1])
        probs = _with_sink(tf.cast(scores, tf.float32) * scale + bias, sink)
        return tf.reshape(tf.einsum("bhqk,bkhd->bqhd", tf.cast(probs, v.dtype), vh), [b, c, kv, g, dv])
    qh = tf.reshape(tf.transpose(q, [0, 2, 3, 1, 4]), [b, kv, g * c, d])
    kh, vh = tf.transpose(k, [0, 2, 1, 3]), tf.transpose(v, [0, 2, 1, 3])            # [b, kv, keys, d]
    scores = tf.matmul(qh, kh, transpose_b=True)                                      # [b, kv, g * c, keys]
    scores = tf.reshape(tf.cast(scores, tf.float32) * scale, [b, kv, g, c, keys])
    scores = tf.reshape(scores + tf.expand_dims(bias, -3), [b, kv, g * c, keys])
    sink = None if sinks is None else tf.reshape(tf.repeat(tf.reshape(sinks, [1, kv, g, 1]), c, 2), [1, kv, g * c, 1])
    probs = tf.cast(_with_sink(scores, sink), v.dtype)
    out = tf.reshape(tf.matmul(probs, vh), [b, kv, g, c, dv])
    return tf.transpose(out, [0, 3, 1, 2, 4])


@dataclasses.dataclass
class Lora:
    """Low-rank adapters as PEFT's LoRA on a fused qkv_proj and on o_proj: y += (alpha / rank) *
    B(A(dropout(x))), with ONE A [hidden, rank] shared by q, k and v (the fused projection's) and B split by
    rows into q, k and v parts; A ~ U(+-1/sqrt(fan_in)) (kaiming_uniform with a=sqrt(5)), B = 0, so the
    adapted model starts equal to the base. One dropout mask of the projection's input per adapter; the base
    path sees the input undropped. `seed`: the stateless seed [2] of this forward's dropout, set by the
    workload before each training forward (None: no dropout, e.g. in eval)."""
    rank: int
    alpha: float
    dropout: float
    seed: tf.Tensor | None = None

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @contextlib.contextmanager
    def seeded(self, seed: tf.Tensor | None) -> Iterator[None]:
        """Within: `seed` is the dropout seed (None: no dropout); the one before after."""
        before, self.seed = self.seed, seed
        try:
            yield
        finally:
            self.seed = before


def lora_uniform(fan_in: int, path: str, run_seed: int):
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)), seeded by path and run seed."""
    bound = 1.0 / math.sqrt(fan_in)
    return lambda shape, dtype: tf.random.stateless_uniform(shape, _seed(path, run_seed), -bound, bound, dtype)


class Attention(Block):
    """Grouped-query self-attention with RoPE; query kernel [hidden, kv, g, d], so a key/value head and
    its query group live on one device when `heads` is split. `block`: the query block of the blockwise
    attention (default cfg.attention_block); `rope_scaling`: Llama 3.1's or YaRN's frequency scaling (None:
    plain RoPE).

    Options, each off by default: `bias`, q/k/v/o biases (zero init; the projections' output dims, so the
    q/k/v biases split with `heads`); `sinks`, one learned logit per query head [kv, g] in every query's
    softmax denominator (zero init, as Transformer Engine's learnable softmax offset); `qk_norm`, an
    RMSNorm over head_dim of the queries and of the keys after their projection and before RoPE, one weight
    [head_dim] each (Megatron qk_layernorm, its epsilon `norm_epsilon`)."""

    def __init__(self, runtime: Runtime, path: str, seed: int, cfg, window: int, block: int | None = None,
                 rope_scaling: RopeScaling | YarnScaling | None = None, output_stddev: float | None = None,
                 bias: bool = False, sinks: bool = False, qk_norm: bool = False, lora: Lora | None = None,
                 layer: int = 0) -> None:
        super().__init__(runtime, path, seed)
        m, kv, d = cfg.hidden_size, cfg.num_kv_heads, cfg.head_dim
        g = cfg.num_heads // kv
        self.cfg, self.window, self.groups = cfg, window, g
        self.block = block or cfg.attention_block
        self.rope_scaling = rope_scaling
        init = lambda name: normal(cfg.init_stddev, f"{path}/{name}/kernel", seed)  # noqa: E731
        self.wq = self.var("query/kernel", (m, kv, g, d), (None, "heads", None, None), init("query"))
        self.wk = self.var("key/kernel", (m, kv, d), (None, "heads", None), init("key"))
        self.wv = self.var("value/kernel", (m, kv, d), (None, "heads", None), init("value"))
        out_sd = cfg.init_stddev if output_stddev is None else output_stddev
        self.wo = self.var("output/kernel", (kv, g, d, m), ("heads", None, None, None),
                           normal(out_sd, f"{path}/output/kernel", seed))
        self.bq = self.bk = self.bv = self.bo = self.sinks = self.q_norm = self.k_norm = None
        if bias:
            self.bq = self.var("query/bias", (kv, g, d), ("heads", None, None), constant(0.0))
            self.bk = self.var("key/bias", (kv, d), ("heads", None), constant(0.0))
            self.bv = self.var("value/bias", (kv, d), ("heads", None), constant(0.0))
            self.bo = self.var("output/bias", (m,), (None,), constant(0.0))
        if sinks:
            self.sinks = self.var("sinks", (kv, g), ("heads", None), constant(0.0))
        if qk_norm:
            self.q_norm = RMSNorm(runtime, f"{path}/query_norm", seed, d, cfg.norm_epsilon)
            self.k_norm = RMSNorm(runtime, f"{path}/key_norm", seed, d, cfg.norm_epsilon)
        self.lora, self.layer = lora, layer
        if lora is not None:
            r, hd = lora.rank, kv * g * d
            self.lora_a = self.var("lora_qkv/a", (m, r), (None, None), lora_uniform(m, f"{path}/lora_qkv/a", seed))
            self.lora_bq = self.var("lora_qkv/b_query", (r, kv, g, d), (None, "heads", None, None), constant(0.0))
            self.lora_bk = self.var("lora_qkv/b_key", (r, kv, d), (None, "heads", None), constant(0.0))
            self.lora_bv = self.var("lora_qkv/b_value", (r, kv, d), (None, "heads", None), constant(0.0))
            self.lora_oa = self.var("lora_output/a", (kv, g, d, r), ("heads", None, None, None),
                                    lora_uniform(hd, f"{path}/lora_output/a", seed))
            self.lora_ob = self.var("lora_output/b", (r, m), (None, None), constant(0.0))

    def remat_context(self) -> Callable[[tf.Tensor], contextlib.AbstractContextManager]:
        """For decoder `remat`, taken in the forward pass: a context in which a run of this block (the
        forward's or the backward's recompute, after the gradient has left the forward's training step)
        draws the adapters' dropout masks from this forward pass's seed, tied to the scalar `after` (so the
        recompute draws them anew instead of holding the forward's from the one to the other)."""
        seed = None if self.lora is None else self.lora.seed
        if seed is None:
            return lambda after: contextlib.nullcontext()
        return lambda after: self.lora.seeded(seed + tf.cast(after_zero(after, tf.float32), seed.dtype))

    def _lora_input(self, x: tf.Tensor, stream: int) -> tf.Tensor:
        """The adapter's input: x under this layer's and adapter's own dropout mask (none without a seed)."""
        seed = self.lora.seed
        if seed is None or not self.lora.dropout:
            return x
        seed = tf.random.experimental.stateless_fold_in(seed, 2 * self.layer + stream)
        if stream == 1:
            # The o adapter's input [b, s, kv, g, d] has its heads split where the layout splits them. A DTensor
            # mesh drew its dropout mask there otherwise in the recompute of `model.remat` than in the forward
            # pass (step losses on the 2x2 smoke: 4.1485 without remat, 4.1619 with); drawn on the input whole
            # over the heads, as the q/k/v adapter's is, both passes draw one mask.
            x = self.runtime.place(x, ("batch", None, None, None, None))
        return dropout(x, self.lora.dropout, seed)

    def _w(self, kernel: tf.Variable) -> tf.Tensor:
        return tf.cast(kernel, self.dtype)

    def _project(self, x: tf.Tensor, equation: str, kernel: tf.Variable, bias: tf.Variable | None) -> tf.Tensor:
        y = tf.einsum(equation, x, tf.cast(kernel, self.dtype))
        return y if bias is None else y + tf.cast(bias, self.dtype)

    def __call__(self, x: tf.Tensor, segments: tf.Tensor | None) -> tf.Tensor:
        base, scaling = self.cfg.rope_base, self.rope_scaling
        q = self._project(x, "bsm,mhgd->bshgd", self.wq, self.bq)
        k = self._project(x, "bsm,mhd->bshd", self.wk, self.bk)
        v = self._project(x, "bsm,mhd->bshd", self.wv, self.bv)
        if self.lora is not None:  # one A and one dropout mask for q, k and v (the fused qkv_proj's)
            low = tf.einsum("bsm,mr->bsr", self._lora_input(x, 0), self._w(self.lora_a)) * self.lora.scale
            q = q + tf.einsum("bsr,rhgd->bshgd", low, self._w(self.lora_bq))
            k = k + tf.einsum("bsr,rhd->bshd", low, self._w(self.lora_bk))
            v = v + tf.einsum("bsr,rhd->bshd", low, self._w(self.lora_bv))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotary(q, base, scaling), rotary(k, base, scaling)
        xla = self.runtime.jit_compile
        sinks = None if self.sinks is None else tf.cast(self.sinks, tf.float32)  # the scores' dtype
        if segments is None and self.window >= x.shape[1]:
            ctx = causal_attention(q, k, v, xla=xla, sinks=sinks)
        else:  # the hidden stream is whole on every device: positions from one of its units
            ctx = windowed_attention(q, k, v, segments, self.window, self.block, like=x[:, :, 0], xla=xla,
                                     sinks=sinks)
        out = self._project(ctx, "bshgd,hgdm->bsm", self.wo, self.bo)
        if self.lora is not None:
            low = tf.einsum("bshgd,hgdr->bsr", self._lora_input(ctx, 1), self._w(self.lora_oa)) * self.lora.scale
            out = out + tf.einsum("bsr,rm->bsm", low, self._w(self.lora_ob))
        return out
