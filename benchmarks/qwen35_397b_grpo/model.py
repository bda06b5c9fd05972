"""Qwen3.5 MoE's text model (Qwen3.5-397B-A17B at the defaults, any size from the config) on the decoder LMs'
shared stack (benchmarks/lm/decoder.py).

Definition: transformers (v5, src/transformers/models/qwen3_5_moe/modeling_qwen3_5_moe.py:
`Qwen3_5MoeTextModel`, `Qwen3_5MoeDecoderLayer`, `Qwen3_5MoeAttention`, `Qwen3_5MoeSparseMoeBlock`,
`Qwen3_5MoeRMSNorm`). Layer i's sequence mixer is gated attention when (i + 1) % full_attention_interval == 0,
else a Gated DeltaNet (deltanet.py); every layer's feed-forward is the sparse MoE. Every norm but the DeltaNet's
gated one is the zero-centred RMSNorm x * rsqrt(mean x^2 + eps) * (1 + w) (`RMSNorm(offset=1)`).

Gated attention: q_proj gives each query head a query and an output gate of head_dim each; q and k get the (1 + w)
RMSNorm over head_dim, then RoPE on their first `rotary_dim` dims (rotate-half within those), the rest passing;
causal GQA softmax at head_dim^-0.5; the output times sigmoid(gate), then o_proj. No biases.

Sparse MoE: p = softmax(x W_r) over all experts in float32, the top k, renormalised over them (= a softmax over
the k chosen logits, as gpt_oss_20b routes); SwiGLU experts through the shared dispatch
(benchmarks/lm/moe_dispatch.py) or densely; plus sigmoid(x . w_sg) * SharedExpert(x). The router is frozen
(a non-trainable variable; the reference's freeze_moe_router) and has no load-balancing loss.

Embeddings untied (the 397B's tie_word_embeddings false). Named dimensions: `heads`, `experts`, `ff`, `vocab`.

Decoding (`Qwen35.step`, from `empty_cache`): gated attention keeps a static key/value cache, Gated DeltaNet its
conv inputs and recurrent state; a prefill then one-token steps give the full forward's logits.
"""
from __future__ import annotations

import tensorflow as tf

from harness.nn.layers import NEG_INF, Block, RMSNorm, normal, rope_frequencies, rotary, vocab_parallel_lookup
from harness.runtime.base import Runtime

from benchmarks.lm.attention import Attention, _attend, causal_attention, windowed_attention
from benchmarks.lm.decoder import Decoder
from benchmarks.lm.ffn import SwiGLU, swiglu
from benchmarks.lm.moe_capacity import expert_capacity
from benchmarks.lm.moe_dispatch import alltoall_experts, slot_positions
from benchmarks.qwen35_397b_grpo.config import FULL_ATTENTION, ModelConfig
from benchmarks.qwen35_397b_grpo.deltanet import GatedDeltaNet

NAME = "qwen35"  # the decoder's variable path prefix


def partial_rotary(x: tf.Tensor, dims: int, base: float, start: tf.Tensor | int = 0,
                   pads: tf.Tensor | None = None) -> tf.Tensor:
    """RoPE (rotate-half) on the first `dims` of x's last axis at positions start..start+seq-1, less each row's
    left padding `pads` [b] when given (a row's first token at position 0, as transformers' position_ids
    from the attention mask); the rest unchanged (apply_rotary_pos_emb with a partial_rotary_factor)."""
    turn = (lambda t: rotary(t, base, start=start)) if pads is None else (lambda t: rotary_rows(t, base, start, pads))
    if dims >= x.shape[-1]:
        return turn(x)
    return tf.concat([turn(x[..., :dims]), x[..., dims:]], -1)


def rotary_rows(x: tf.Tensor, base: float, start: tf.Tensor | int, pads: tf.Tensor) -> tf.Tensor:
    """harness.nn.layers.rotary with a position per row: start + i - pads[row] for x [b, t, ..., dim]."""
    b, t, dim = x.shape[0], x.shape[1], x.shape[-1]
    half = dim // 2
    position = tf.cast(tf.cast(start, tf.int32) + tf.range(t)[None, :] - tf.cast(pads, tf.int32)[:, None],
                       tf.float32)                                                          # [b, t]
    angle = position[:, :, None] * rope_frequencies(dim, base)[None, None, :]               # [b, t, half]
    shape = [b, t] + [1] * (len(x.shape) - 3) + [half]
    cos, sin = (tf.cast(tf.reshape(f(angle), shape), x.dtype) for f in (tf.cos, tf.sin))
    x1, x2 = x[..., :half], x[..., half:]
    return tf.concat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


def write_cache(cache: tf.Tensor, new: tf.Tensor, start: tf.Tensor | int) -> tf.Tensor:
    """cache [b, length, ...] with new [b, t, ...] written at positions start..start+t-1 (static shapes)."""
    b, t = new.shape[0], new.shape[1]
    rows = tf.tile(tf.range(b)[:, None], [1, t])
    cols = tf.tile(tf.cast(start, tf.int32) + tf.range(t)[None, :], [b, 1])
    return tf.tensor_scatter_nd_update(cache, tf.stack([rows, cols], -1), tf.cast(new, cache.dtype))


class GatedAttention(Attention):
    """The shared grouped-query attention (benchmarks/lm/attention.py: its q/k/v/o kernels and its causal or
    document-windowed kernel) with Qwen3.5's output gate `gate/kernel` [hidden, kv, g, d], (1 + w) q/k norms
    and partial RoPE."""

    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig, seq: int) -> None:
        super().__init__(runtime, path, seed, cfg, window=seq, block=seq, output_stddev=cfg.output_stddev())
        m, kv, d = cfg.hidden_size, cfg.num_kv_heads, cfg.head_dim
        self.wg = self.var("gate/kernel", (m, kv, self.groups, d), (None, "heads", None, None),
                           normal(cfg.init_stddev, f"{path}/gate/kernel", seed))
        self.q_norm = RMSNorm(runtime, f"{path}/query_norm", seed, d, cfg.norm_epsilon, offset=1.0)
        self.k_norm = RMSNorm(runtime, f"{path}/key_norm", seed, d, cfg.norm_epsilon, offset=1.0)

    def _heads(self, x: tf.Tensor, start: tf.Tensor | int, pads: tf.Tensor | None = None) -> tuple[tf.Tensor, ...]:
        """q, gate [b, s, kv, g, d] and k, v [b, s, kv, d] of x at positions start..start+s-1 (less `pads`)."""
        c = self.cfg
        q = self.q_norm(self._project(x, "bsm,mhgd->bshgd", self.wq, None))
        k = self.k_norm(self._project(x, "bsm,mhd->bshd", self.wk, None))
        v = self._project(x, "bsm,mhd->bshd", self.wv, None)
        gate = self._project(x, "bsm,mhgd->bshgd", self.wg, None)
        q, k = (partial_rotary(t, c.rotary_dim, c.rope_base, start, pads) for t in (q, k))
        return q, gate, k, v

    def __call__(self, x: tf.Tensor, segments: tf.Tensor | None) -> tf.Tensor:
        q, gate, k, v = self._heads(x, 0)
        xla = self.runtime.jit_compile
        if segments is None:
            ctx = causal_attention(q, k, v, xla=xla)
        else:
            ctx = windowed_attention(q, k, v, segments, x.shape[1], self.block, like=x[:, :, 0], xla=xla)
        return self._project(ctx * tf.sigmoid(gate), "bshgd,hgdm->bsm", self.wo, None)

    def step(self, x: tf.Tensor, cache: tuple[tf.Tensor, tf.Tensor], start: tf.Tensor | int,
             pads: tf.Tensor | None = None) -> tuple[tf.Tensor, tuple[tf.Tensor, tf.Tensor]]:
        """Cached attention: x [b, t, hidden] at cache columns start..start+t-1 and the cache (keys, values
        [b, length, kv, d], columns < start filled) -> (output, the cache with these t columns written).
        Each query sees the cached columns up to its own; static shapes (the cache's length). `pads` [b]: row
        r's first pads[r] columns are left padding, never seen, and its positions count from the first
        column after them."""
        q, gate, k, v = self._heads(x, start, pads)
        keys, values = write_cache(cache[0], k, start), write_cache(cache[1], v, start)
        query_pos = tf.cast(start, tf.int32) + tf.range(x.shape[1])
        column = tf.range(keys.shape[1])[None, :]
        bias = tf.where(column <= query_pos[:, None], 0.0, NEG_INF)                               # [t, length]
        if pads is not None:
            seen = column >= tf.cast(pads, tf.int32)[:, None]                                      # [b, length]
            bias = tf.where(seen[:, None, :], bias[None], NEG_INF)                             # [b, t, length]
        ctx = _attend(q, tf.cast(keys, q.dtype), tf.cast(values, q.dtype), bias, self.runtime.jit_compile)
        return self._project(ctx * tf.sigmoid(gate), "bshgd,hgdm->bsm", self.wo, None), (keys, values)


class SparseMoE(Block):
    """Routed SwiGLU experts [experts, hidden, expert_hidden] behind a float32 softmax top-k router, and the
    gated shared expert. Returns the output alone: the reference has no routing loss."""

    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig) -> None:
        super().__init__(runtime, path, seed)
        m, e, h = cfg.hidden_size, cfg.num_experts, cfg.expert_hidden
        self.cfg = cfg
        init = lambda name, sd=cfg.init_stddev: normal(sd, f"{path}/{name}", seed)  # noqa: E731
        self.router = self.var("router/kernel", (m, e), (None, None), init("router/kernel"),
                               trainable=not cfg.freeze_router)
        self.w_gate = self.var("experts/gate/kernel", (e, m, h), ("experts", None, "ff"), init("experts/gate"))
        self.w_up = self.var("experts/up/kernel", (e, m, h), ("experts", None, "ff"), init("experts/up"))
        self.w_down = self.var("experts/down/kernel", (e, h, m), ("experts", "ff", None),
                               init("experts/down", cfg.output_stddev()))
        self.shared = self.shared_gate = None
        if cfg.shared_expert_hidden:
            self.shared = SwiGLU(runtime, f"{path}/shared_expert", seed, m, cfg.shared_expert_hidden,
                                 cfg.init_stddev, cfg.output_stddev())
            self.shared_gate = self.var("shared_expert_gate/kernel", (m, 1), (None, None),
                                        init("shared_expert_gate/kernel"))

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        c, dt = self.cfg, self.dtype
        b, seq, m = x.shape
        e, k = c.num_experts, c.experts_per_token
        logits = tf.einsum("bsm,me->bse", tf.cast(x, tf.float32), tf.cast(self.router, tf.float32))
        alltoall = c.moe_dispatch == "alltoall"
        capacity = expert_capacity(seq, e, k, c.capacity_factor) if alltoall else seq
        # The top-k picks indices only (no gradient through TopKV2); the weights are a softmax over the k
        # chosen logits, exp(z_i) / sum_chosen exp(z_j), which is transformers' softmax over all experts
        # renormalised over the top k. The gradient reaches x through the chosen logits.
        index = tf.math.top_k(tf.stop_gradient(logits), k).indices                       # [b, s, k]
        choice = tf.one_hot(index, e, dtype=tf.float32)                                   # [b, s, k, e]
        gates = tf.nn.softmax(tf.einsum("bske,bse->bsk", choice, logits), -1)
        w_gate, w_up, w_down = (tf.cast(w, dt) for w in (self.w_gate, self.w_up, self.w_down))
        if alltoall:
            def experts(xe: tf.Tensor) -> tf.Tensor:  # [b, experts, slots, m], split over `experts`
                return swiglu(xe, w_gate, w_up, w_down, "becm,emh->bech", "bech,ehm->becm")

            # one routing group per row (reshapes, not [:, None]: DTensor and batch-split slices)
            position = slot_positions(tf.reshape(choice, [b, 1, seq, k, e]))
            kept = tf.cast(position < capacity, tf.float32)
            ya = alltoall_experts(self.runtime, x, tf.reshape(index, [b, 1, seq, k]), kept, position, e, capacity,
                                  experts)
            y = tf.einsum("bskm,bsk->bsm", ya, tf.cast(gates * tf.reshape(kept, [b, seq, k]), dt))
        else:
            weights = tf.einsum("bske,bsk->bse", choice, gates)
            hidden = swiglu(x, w_gate, w_up, w_down, "bsm,emh->bseh", "bseh,ehm->bsem")
            y = tf.einsum("bsem,bse->bsm", hidden, tf.cast(weights, dt))
        if self.shared is not None:
            y += tf.sigmoid(tf.einsum("bsm,mo->bso", x, tf.cast(self.shared_gate, dt))) * self.shared(x)
        return y


class Qwen35(Decoder):
    """The text model; no layer has extras (no routing loss)."""

    FFN_NAME = "moe"

    def __init__(self, runtime: Runtime, seed: int, cfg: ModelConfig, seq: int) -> None:
        super().__init__(runtime, NAME, seed, cfg, seq)

    def norm(self, path: str) -> RMSNorm:
        return RMSNorm(self.runtime, path, self.seed, self.cfg.hidden_size, self.cfg.norm_epsilon, offset=1.0)

    def attention(self, path: str, layer: int) -> GatedAttention | GatedDeltaNet:
        c = self.cfg
        if c.layer_type(layer) == FULL_ATTENTION:
            return GatedAttention(self.runtime, path, self.seed, c, self.seq)
        return GatedDeltaNet(self.runtime, path, self.seed, c.deltanet(), c.init_stddev, c.output_stddev(),
                             c.deltanet_form)

    def ffn(self, path: str, layer: int) -> SparseMoE:
        return SparseMoE(self.runtime, path, self.seed, self.cfg)

    def empty_cache(self, batch: int, length: int) -> list[tuple[tf.Tensor, tf.Tensor]]:
        """Each layer's decoding state before any token: gated attention's keys and values [batch, length, kv,
        d] (compute dtype), Gated DeltaNet's conv inputs [batch, K - 1, conv_dim] and recurrent state
        [batch, Hv, dk, dv] (float32), all zero (a zero DeltaNet state is a fresh one). Laid out as the
        runtime places them (on a mesh: rows over the batch mesh dimension, the key/value heads as the
        attention weights split them; the DeltaNet's weights are whole, so are its state's heads)."""
        c, cache = self.cfg, []
        for layer in self.layers:
            if isinstance(layer.attention, GatedAttention):
                kv = tf.zeros([batch, length, c.num_kv_heads, c.head_dim], self.dtype)
                cache.append(self._laid_out(layer.attention, (kv, kv)))
            else:
                s = c.deltanet()
                cache.append(self._laid_out(layer.attention, (
                    tf.zeros([batch, s.linear_conv_kernel_dim - 1, s.conv_dim], self.dtype),
                    tf.zeros([batch, s.linear_num_value_heads, s.linear_key_head_dim, s.linear_value_head_dim],
                             tf.float32))))
        return cache

    def _laid_out(self, mixer: GatedAttention | GatedDeltaNet, state: tuple[tf.Tensor, tf.Tensor]
                  ) -> tuple[tf.Tensor, tf.Tensor]:
        """A layer's decoding state in the cache's layout. `step` puts its new state back in it too: on a
        DTensor mesh the layout DTensor propagates to a returned key cache otherwise needs a transpose it
        cannot expand ("TransposeOp SPMD needs communication is not supported yet"; measured, TensorFlow
        2.21 CPU, the generator's prefill on a 2x2 mesh)."""
        if isinstance(mixer, GatedAttention):
            dims = (("batch", None, "heads", None),) * 2
        else:
            dims = (("batch", None, None), ("batch", None, None, None))
        return tuple(self.runtime.place(t, d) for t, d in zip(state, dims))

    def step(self, tokens: tf.Tensor, cache: list, start: tf.Tensor | int, pads: tf.Tensor | None = None
             ) -> tuple[tf.Tensor, list]:
        """Prefill (t > 1) or decode (t = 1): float32 logits [b, t, vocab] of tokens [b, t] at cache columns
        start..start+t-1 after the columns `cache` holds, and the cache after them. Gated attention reads and
        writes its key/value cache; Gated DeltaNet carries its state, in the chunked form over several tokens
        and the recurrent one over one. The same numbers as the whole row's forward, to float32 rounding.
        `pads` [b]: a left-padded batch, row r's real tokens starting at column pads[r]; the padding is masked
        (zeroed DeltaNet inputs leave its state and conv inputs those of a fresh start; attention never sees
        it) and positions count from each row's first real token."""
        x = tf.cast(vocab_parallel_lookup(self.runtime, self.embeddings, tokens), self.dtype)
        form = "chunked" if tokens.shape[1] > 1 else "recurrent"
        mask = None
        if pads is not None:
            column = tf.cast(start, tf.int32) + tf.range(tokens.shape[1])
            mask = tf.cast(column[None, :] >= tf.cast(pads, tf.int32)[:, None], tf.float32)
        after = []
        for layer, state in zip(self.layers, cache):
            h = layer.attention_norm(x)
            if isinstance(layer.attention, GatedAttention):
                y, state = layer.attention.step(h, state, start, pads)
            else:
                y, state = layer.attention.forward(h, state, form=form, mask=mask)
            x = x + y
            x = x + layer.ffn(layer.mlp_norm(x))
            after.append(self._laid_out(layer.attention, state))
        return self.logits(self.final_norm(x)), after
