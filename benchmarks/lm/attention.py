"""Causal grouped-query self-attention with RoPE, dense or blockwise within a window: the decoder LMs' attention.

Named dimensions: `heads` (key/value heads, their query groups with them) so a mesh runtime can split
them. The config passed in needs hidden_size, num_heads, num_kv_heads, head_dim, rope_base and
init_stddev, and attention_block unless the caller gives `block`. Every shape is static and no op leaves the device.
"""
from __future__ import annotations

import math

import numpy as np
import tensorflow as tf

from harness.nn.layers import NEG_INF, Block, RopeScaling, normal, rotary
from harness.runtime.base import Runtime


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


QUERY_CHUNK = 1024  # full causal attention: queries in chunks of this many, each against its key prefix


def causal_attention(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, like: tf.Tensor,
                     chunk: int = QUERY_CHUNK) -> tf.Tensor:
    """Full causal attention over the row; the same function as `windowed_attention` with a window of the
    whole row and no segments.

    Queries go in chunks of `chunk` (when it divides the row), each against only the keys up to its own end:
    the scores a step holds (and the backward keeps) are the causal lower triangle in strips, about
    (n + 1) / 2n of the dense [seq, seq] (0.56 at 8192 tokens in chunks of 1024), and the multiply-adds shrink
    with them. Masked keys give exactly zero weight, so the chunks compute what the dense block computes.
    The mask is computed per row from positions made from the data (`like` [b, seq], any float tensor of
    the row, e.g. one hidden unit of the layer input): x * 0 + 1 summed along the row,
    which XLA cannot fold (a float multiply by zero keeps NaN), where a constant [seq, seq] mask and its tiled
    bias (1 GiB at 8192 tokens) would be folded and copied by the compiler. Exact up to 2^24 tokens; a
    non-finite row unmasks only itself."""
    seq = q.shape[1]
    like = tf.cast(like, tf.float32)
    pos = tf.cumsum(like * 0.0 + 1.0, axis=1) - 1.0                                  # [b, seq]: 0..seq-1
    if chunk >= seq or seq % chunk:
        return _causal_strip(q, k, v, pos, pos)
    return tf.concat([_causal_strip(q[:, i:i + chunk], k[:, :i + chunk], v[:, :i + chunk], pos[:, i:i + chunk],
                                    pos[:, :i + chunk]) for i in range(0, seq, chunk)], axis=1)


def _causal_strip(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, qpos: tf.Tensor, kpos: tf.Tensor) -> tf.Tensor:
    """Queries q [b, c, kv, g, d] at positions qpos [b, c] against keys k/v [b, keys, kv, d] at kpos [b, keys]."""
    b, c, kv, g, d = q.shape
    keys = k.shape[1]
    bias = tf.where(tf.expand_dims(qpos, 2) >= tf.expand_dims(kpos, 1), 0.0, NEG_INF)  # [b, c (q), keys]
    bias = tf.reshape(tf.tile(tf.expand_dims(bias, 1), [1, g, 1, 1]), [b, 1, g * c, keys])
    scores = tf.reshape(tf.einsum("bqhgd,bkhd->bhgqk", q, k), [b, kv, g * c, keys])
    probs = tf.nn.softmax(tf.cast(scores, tf.float32) * (d ** -0.5) + bias, axis=-1)
    probs = tf.reshape(tf.cast(probs, v.dtype), [b, kv, g, c, keys])
    return tf.einsum("bhgqk,bkhd->bqhgd", probs, v)


class Attention(Block):
    """Grouped-query self-attention with RoPE; query kernel [hidden, kv, g, d], so a key/value head and
    its query group live on one device when `heads` is split. `block`: the query block of the blockwise
    attention (default cfg.attention_block); `rope_scaling`: Llama 3.1's frequency scaling (None: plain RoPE)."""

    def __init__(self, runtime: Runtime, path: str, seed: int, cfg, window: int, block: int | None = None,
                 rope_scaling: RopeScaling | None = None, output_stddev: float | None = None) -> None:
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

    def __call__(self, x: tf.Tensor, segments: tf.Tensor | None) -> tf.Tensor:
        dt, base, scaling = self.dtype, self.cfg.rope_base, self.rope_scaling
        q = rotary(tf.einsum("bsm,mhgd->bshgd", x, tf.cast(self.wq, dt)), base, scaling)
        k = rotary(tf.einsum("bsm,mhd->bshd", x, tf.cast(self.wk, dt)), base, scaling)
        v = tf.einsum("bsm,mhd->bshd", x, tf.cast(self.wv, dt))
        if segments is None and self.window >= x.shape[1]:
            ctx = causal_attention(q, k, v, like=x[:, :, 0])  # the hidden stream is whole on every device
        else:
            ctx = windowed_attention(q, k, v, segments, self.window, self.block)
        return tf.einsum("bshgd,hgdm->bsm", ctx, tf.cast(self.wo, dt))
