"""Qwen3.5's Gated DeltaNet layer (45 of the 60 mixers of Qwen3.5-397B-A17B) in TensorFlow: a chunked form for
training and prefill and a recurrent form for decoding, which compute the same thing.

Definition: transformers (v5, `transformers/models/qwen3_5_moe/modeling_qwen3_5_moe.py`:
`Qwen3_5MoeGatedDeltaNet`, `torch_chunk_gated_delta_rule`, `torch_recurrent_gated_delta_rule`,
`causal_conv1d_fn` / `causal_conv1d_update`, `Qwen3_5MoeRMSNormGated`). Per token x:
    qkv = SiLU(causal depthwise conv_K(W_qkv x))       split flat into q [Hk, dk], k [Hk, dk], v [Hv, dv]
    q, k: repeat_interleave Hk -> Hv (V head j reads QK head j // (Hv/Hk)), l2norm (x rsqrt(sum x^2 + 1e-6)),
          q / sqrt(dk)
    beta = sigmoid(W_b x);  g = -exp(A_log) softplus(W_a x + dt_bias);  state S [dk, dv] per V head, 0 at start
    S <- exp(g) S;  S <- S + k ((v - S^T k) beta)^T;  o = S^T q
    y = out_proj( w_n * rmsnorm(o) * SiLU(W_z x) )      per head over dv, w_n plain (not 1 + w), eps 1e-6
The kernel runs in float32 whatever the input dtype. The chunked form is the WY / UT-transform algorithm of
`torch_chunk_gated_delta_rule` (chunks of 64, the sequence zero-padded to a multiple of it; a triangular solve
inside each chunk and a scan over chunks carrying S).

A padding mask zeroes padded inputs first (transformers' apply_mask_to_padding_states). Packed sequences
(`starts`: 1 where a packed segment begins) restart the conv's left context and S at every segment start, in
both forms; this is what the reference's packed training needs (FLA's cu_seqlens), checked here against the
segments run one by one, not against a transformers output.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

from harness.nn.layers import Block, constant, normal, take
from harness.runtime.base import Runtime

CHUNK = 64


@dataclass(frozen=True)
class DeltaNetShape:
    """The layer's sizes, named as transformers' Qwen3_5MoeTextConfig names them."""
    hidden_size: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int = 4
    rms_norm_eps: float = 1e-6

    @property
    def key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim


# transformers' parameter names under `...layers.{L}.linear_attn.` -> (this layer's variable, how to lay it out).
# Linear weights are [out, in] in transformers and [in, out] here; conv1d.weight [C, 1, K] is [K, C] here.
HF_NAMES = {
    "in_proj_qkv.weight": ("in_proj_qkv", "linear"),
    "in_proj_z.weight": ("in_proj_z", "linear"),
    "in_proj_b.weight": ("in_proj_b", "linear"),
    "in_proj_a.weight": ("in_proj_a", "linear"),
    "conv1d.weight": ("conv1d", "conv"),
    "dt_bias": ("dt_bias", "same"),
    "A_log": ("A_log", "same"),
    "norm.weight": ("norm", "same"),
    "out_proj.weight": ("out_proj", "linear"),
}
# this layer's variable -> its name under the layer's path
VARIABLE_NAMES = {"in_proj_qkv": "in_proj_qkv/kernel", "in_proj_z": "in_proj_z/kernel",
                  "in_proj_b": "in_proj_b/kernel", "in_proj_a": "in_proj_a/kernel", "conv1d": "conv1d/kernel",
                  "dt_bias": "dt_bias", "A_log": "A_log", "norm": "norm/gamma", "out_proj": "out_proj/kernel"}


def hf_to_variable(layout: str, value: np.ndarray) -> np.ndarray:
    """A transformers tensor in this layer's layout (HF_NAMES' `layout`)."""
    if layout == "linear":
        return value.T
    if layout == "conv":
        return value[:, 0, :].T
    return value


def starts_of(segments: tf.Tensor) -> tf.Tensor:
    """starts [b, s] (1 where a packed segment begins; the row's first position is no start: the incoming
    state, zero in a forward from scratch, is the first segment's) from each position's document [b, s]."""
    seg = tf.cast(segments, tf.int32)
    return tf.concat([tf.zeros_like(seg[:, :1], tf.float32),
                      tf.cast(tf.not_equal(seg[:, 1:], seg[:, :-1]), tf.float32)], axis=1)


class GatedDeltaNet(Block):
    """One Gated DeltaNet mixer. As a decoder layer's sequence mixer it is called as block(x, segments) -> y
    (the chunked form, a fresh state, each document of `segments` on its own); `forward(x, state, form)`
    returns (y, state) for prefill and decoding, state being (conv_state [B, K-1, conv_dim]: the last K-1
    projected qkv inputs, recurrent_state [B, Hv, dk, dv] float32), None at a sequence start. Weights:
    normal(stddev), out_proj normal(output_stddev), A = exp(A_log) evenly over [1, 16] (FLA draws U(0, 16)),
    dt_bias 1,
    the conv normal(0.5), the gated norm's weight 1."""

    def __init__(self, runtime: Runtime, path: str, seed: int, shape: DeltaNetShape, stddev: float = 0.02,
                 output_stddev: float | None = None, form: str = "chunked") -> None:
        super().__init__(runtime, path, seed)
        if form not in ("chunked", "recurrent"):
            raise ValueError(f"form must be 'chunked' or 'recurrent', got {form!r}")
        self.shape, self.form = shape, form
        s = shape
        init = lambda name, sd=stddev: normal(sd, f"{path}/{name}", seed)  # noqa: E731

        def log_spread(shape_, dtype):  # A = exp(A_log) spread evenly over FLA's U(0, 16) range
            return tf.cast(tf.math.log(tf.linspace(1.0, 16.0, shape_[0])), dtype)

        def var(attr: str, dims: tuple, initializer) -> tf.Variable:
            return self.var(VARIABLE_NAMES[attr], dims, (None,) * len(dims), initializer)

        self.in_proj_qkv = var("in_proj_qkv", (s.hidden_size, s.conv_dim), init("in_proj_qkv"))
        self.in_proj_z = var("in_proj_z", (s.hidden_size, s.value_dim), init("in_proj_z"))
        self.in_proj_b = var("in_proj_b", (s.hidden_size, s.linear_num_value_heads), init("in_proj_b"))
        self.in_proj_a = var("in_proj_a", (s.hidden_size, s.linear_num_value_heads), init("in_proj_a"))
        self.conv1d = var("conv1d", (s.linear_conv_kernel_dim, s.conv_dim), init("conv1d", 0.5))
        self.dt_bias = var("dt_bias", (s.linear_num_value_heads,), constant(1.0))
        self.A_log = var("A_log", (s.linear_num_value_heads,), log_spread)
        self.norm = var("norm", (s.linear_value_head_dim,), constant(1.0))
        self.out_proj = var("out_proj", (s.value_dim, s.hidden_size),
                            init("out_proj", stddev if output_stddev is None else output_stddev))

    def load_hf(self, tensors: dict[str, np.ndarray]) -> None:
        """Assigns transformers' tensors (names of HF_NAMES, without the layer prefix); every name is required."""
        missing = sorted(set(HF_NAMES) - set(tensors))
        if missing:
            raise ValueError(f"Gated DeltaNet weights missing: {', '.join(missing)}")
        laid_out = {}
        for hf_name, (attr, layout) in HF_NAMES.items():
            value = hf_to_variable(layout, np.asarray(tensors[hf_name]))
            target = getattr(self, attr)
            if tuple(value.shape) != tuple(target.shape):
                raise ValueError(f"{hf_name}: shape {value.shape} after layout, expected {tuple(target.shape)}")
            laid_out[attr] = value
        for attr, value in laid_out.items():  # nothing assigned unless everything fits
            target = getattr(self, attr)
            target.assign(tf.cast(value, target.dtype))

    def __call__(self, x: tf.Tensor, segments: tf.Tensor | None = None) -> tf.Tensor:
        """The decoder's mixer call: y [b, s, hidden] of a fresh state, documents restarting it (`segments`)."""
        starts = None if segments is None else starts_of(segments)
        return self.forward(x, form=self.form, starts=starts)[0]

    def forward(self, x: tf.Tensor, state=None, form: str = "chunked", mask: tf.Tensor | None = None,
                starts: tf.Tensor | None = None):
        """(y, state). mask [B, T] (1 = token, 0 = padding) zeroes padded inputs first, as transformers'
        apply_mask_to_padding_states does for left-padded batches. starts [B, T] (1 where a packed segment
        begins) cuts the row into independent sequences; the returned state is that of the last one."""
        s = self.shape
        if mask is not None:
            x = x * tf.cast(mask, x.dtype)[:, :, None]
        w = lambda v: tf.cast(v, x.dtype)  # noqa: E731
        batch, length = tf.shape(x)[0], tf.shape(x)[1]
        qkv = tf.einsum("btd,dc->btc", x, w(self.in_proj_qkv))
        z = tf.einsum("btd,dc->btc", x, w(self.in_proj_z))
        b = tf.einsum("btd,dh->bth", x, w(self.in_proj_b))
        a = tf.einsum("btd,dh->bth", x, w(self.in_proj_a))
        conv_state, recurrent_state = state if state is not None else (None, None)
        if starts is None:
            starts = tf.zeros([batch, length], tf.float32)
        starts = tf.cast(starts, tf.float32)
        qkv, conv_state = causal_conv(qkv, w(self.conv1d), conv_state, starts)
        qkv = tf.nn.silu(qkv)
        q, k, v = tf.split(qkv, [s.key_dim, s.key_dim, s.value_dim], axis=-1)
        q = tf.reshape(q, [batch, length, s.linear_num_key_heads, s.linear_key_head_dim])
        k = tf.reshape(k, [batch, length, s.linear_num_key_heads, s.linear_key_head_dim])
        v = tf.reshape(v, [batch, length, s.linear_num_value_heads, s.linear_value_head_dim])
        beta = tf.sigmoid(tf.cast(b, tf.float32))
        g = -tf.exp(tf.cast(self.A_log, tf.float32)) * tf.nn.softplus(
            tf.cast(a, tf.float32) + tf.cast(self.dt_bias, tf.float32))
        q, k, v = prepare_qkv(q, k, v, s.linear_num_value_heads // s.linear_num_key_heads)
        if form not in ("chunked", "recurrent"):
            raise ValueError(f"form must be 'chunked' or 'recurrent', got {form!r}")
        if form == "chunked":  # unrolled on a DTensor mesh (see gated_delta_chunked)
            o, recurrent_state = gated_delta_chunked(q, k, v, g, beta, recurrent_state, starts,
                                                     dtensor_ops=self.runtime.laid_out)
        else:
            o, recurrent_state = gated_delta_recurrent(q, k, v, g, beta, recurrent_state, starts)
        z = tf.reshape(z, [batch, length, s.linear_num_value_heads, s.linear_value_head_dim])
        y = gated_rms_norm(tf.cast(o, x.dtype), z, w(self.norm), s.rms_norm_eps)
        y = tf.reshape(y, [batch, length, s.value_dim])
        return tf.einsum("btc,cd->btd", y, w(self.out_proj)), (conv_state, recurrent_state)


def causal_conv(x: tf.Tensor, kernel: tf.Tensor, state: tf.Tensor | None = None, starts: tf.Tensor | None = None):
    """Depthwise causal conv over time: out_t = sum_i kernel[i] * x_{t-(K-1)+i}, the K-1 inputs before the first
    taken from `state` [B, K-1, C] (zeros at a sequence start), inputs of an earlier packed segment (starts [B, T])
    counted as 0. Returns (out, the last K-1 inputs of the last segment)."""
    taps, length = kernel.shape[0], tf.shape(x)[1]
    if state is None:
        state = tf.zeros([tf.shape(x)[0], taps - 1, tf.shape(x)[2]], x.dtype)
    padded = tf.concat([tf.cast(state, x.dtype), x], axis=1)
    if starts is None:
        starts = tf.zeros(tf.shape(x)[:2], tf.float32)
    # Segment numbers: the state's inputs are segment 0, each start opens the next.
    seg = tf.concat([tf.zeros([tf.shape(x)[0], taps - 1]), tf.cumsum(tf.cast(starts, tf.float32), axis=1)], 1)
    same = [tf.cast(tf.equal(seg[:, i:i + length], seg[:, taps - 1:]), x.dtype)[..., None] for i in range(taps)]
    out = tf.add_n([padded[:, i:i + length] * kernel[i] * same[i] for i in range(taps)])
    last = tf.cast(tf.equal(seg[:, -(taps - 1):], seg[:, -1:]), x.dtype)[..., None]
    return out, padded[:, -(taps - 1):] * last


def prepare_qkv(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor, repeat: int):
    """float32; q, k repeated per V head (repeat_interleave: V head j uses QK head j // repeat), L2-normalised
    with eps 1e-6 inside the rsqrt, q scaled by dk^-1/2."""
    q, k, v = (tf.cast(t, tf.float32) for t in (q, k, v))
    if repeat > 1:
        q, k = (tf.repeat(t, repeat, axis=2) for t in (q, k))
    q = q * tf.math.rsqrt(tf.reduce_sum(q * q, axis=-1, keepdims=True) + 1e-6)
    k = k * tf.math.rsqrt(tf.reduce_sum(k * k, axis=-1, keepdims=True) + 1e-6)
    return q * q.shape[-1] ** -0.5, k, v


def gated_delta_recurrent(q, k, v, g, beta, state=None, starts=None):
    """Token by token: q, k [B, T, H, dk], v [B, T, H, dv], g, beta [B, T, H]; state [B, H, dk, dv] or None;
    starts [B, T] zeroes the state before a segment's first token. Returns (o [B, T, H, dv], final state)."""
    if starts is None:
        starts = tf.zeros(tf.shape(g)[:2], tf.float32)
    keep = tf.tile(1.0 - tf.cast(starts, tf.float32)[:, :, None], [1, 1, g.shape[2]])
    if state is None:
        state = tf.zeros([tf.shape(v)[0], v.shape[2], k.shape[-1], v.shape[-1]], tf.float32)

    def step(carry, inputs):
        s, _ = carry
        q_t, k_t, v_t, g_t, b_t, keep_t = inputs
        s = s * (keep_t * tf.exp(g_t))[:, :, None, None]
        memory = tf.einsum("bhkv,bhk->bhv", s, k_t)
        delta = (v_t - memory) * b_t[:, :, None]
        s = s + k_t[:, :, :, None] * delta[:, :, None, :]
        return s, tf.einsum("bhkv,bhk->bhv", s, q_t)

    if q.shape[1] == 1:  # a decoding step: the one update, without a scan's loop
        state, out = step((state, None), [take(t, 0, 1) for t in (q, k, v, g, beta, keep)])
        return out[:, None], state
    time_major = [tf.transpose(t, [1, 0] + list(range(2, t.shape.rank))) for t in (q, k, v, g, beta, keep)]
    first = tf.zeros_like(take(time_major[2], 0))
    states, outs = tf.scan(step, time_major, initializer=(state, first))
    return tf.transpose(outs, [1, 0, 2, 3]), take(states, -1)


def gated_delta_chunked(q, k, v, g, beta, state=None, starts=None, chunk: int = CHUNK, dtensor_ops: bool = False):
    """The same rule in chunks (torch_chunk_gated_delta_rule): inside a chunk the UT transform
    T = (I + strictly_lower((beta k) k^T * decay))^-1 gives the corrected values T (beta v) and the decayed keys
    T (beta k e^{cumsum g}) reading the incoming state; a scan over chunks carries the state. With packed
    segments (starts) every pairwise term is zero across a segment start: the decay matrix is masked to pairs
    of one segment, only the tokens of the incoming state's segment read it, and only those of the chunk's last
    segment write the outgoing one. `dtensor_ops` (static shapes only): ops a DTensor mesh lays out, which has
    no layout rule for a triangular solve nor for the TensorList ops a scan's gradient accumulates into: T by
    matrix products (`unit_lower_inverse`) and the chunks in a Python loop (the graph grows with their count)."""
    batch, length = tf.shape(v)[0], tf.shape(v)[1]
    heads, dk, dv = v.shape[2], k.shape[-1], v.shape[-1]
    static_chunks = None if v.shape[1] is None else -(-v.shape[1] // chunk)  # the Python loop's count
    if state is None:
        state = tf.zeros([batch, heads, dk, dv], tf.float32)
    pad = (chunk - length % chunk) % chunk
    n = (length + pad) // chunk

    def chunks(t):  # [B, T, H, ...] -> [N, B, H, chunk, ...], zero-padded at the end
        t = tf.pad(t, [[0, 0], [0, pad]] + [[0, 0]] * (t.shape.rank - 2))
        t = tf.reshape(t, tf.concat([[batch, n, chunk], tf.shape(t)[2:]], 0))
        return tf.transpose(t, [1, 0, 3, 2] + list(range(4, t.shape.rank)))

    if starts is None:
        starts = tf.zeros(tf.shape(g)[:2], tf.float32)
    seg = tf.tile(tf.cumsum(tf.cast(starts, tf.float32), axis=1)[:, :, None], [1, 1, heads])
    first_start = tf.tile(tf.cast(starts, tf.float32)[:, :, None], [1, 1, heads])
    seg = tf.concat([seg, tf.repeat(seg[:, -1:], pad, axis=1)], axis=1)  # the end padding continues the last one
    q, k, v, g, beta, first_start = (chunks(t) for t in (q, k, v, g, beta, first_start))
    seg = tf.transpose(tf.reshape(seg, [batch, n, chunk, heads]), [1, 0, 3, 2])  # [N, B, H, C]
    seg_in = seg[..., 0] - first_start[..., 0]  # the segment of the token before the chunk
    same = tf.cast(tf.equal(seg[..., :, None], seg[..., None, :]), tf.float32)
    reads = tf.cast(tf.equal(seg, seg_in[..., None]), tf.float32)[..., None]
    writes = tf.cast(tf.equal(seg, seg[..., -1:]), tf.float32)[..., None]
    carries = tf.cast(tf.equal(seg[..., -1], seg_in), tf.float32)[..., None, None]
    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    cum = tf.cumsum(g, axis=-1)  # [N, B, H, C]
    lower = tf.linalg.band_part(tf.ones([chunk, chunk]), -1, 0)  # j <= i
    decay = tf.exp(tf.where(lower > 0, cum[..., :, None] - cum[..., None, :], -np.inf)) * same
    # the identity compared from positions, not tf.eye: DTensor has no layout rule for MatrixDiag
    eye = tf.cast(tf.equal(tf.range(chunk)[:, None], tf.range(chunk)[None, :]), tf.float32)
    strict = lower - eye
    ut = eye + tf.einsum("nbhik,nbhjk->nbhij", k_beta, k) * decay * strict
    decayed_keys = k_beta * tf.exp(cum)[..., None] * reads
    if dtensor_ops:
        inverse = unit_lower_inverse(ut, eye)
        new_values, k_cumdecay = tf.matmul(inverse, v_beta), tf.matmul(inverse, decayed_keys)
    else:
        new_values = tf.linalg.triangular_solve(ut, v_beta, lower=True)
        k_cumdecay = tf.linalg.triangular_solve(ut, decayed_keys, lower=True)
    intra = tf.einsum("nbhik,nbhjk->nbhij", q, k) * decay
    q_in = q * tf.exp(cum)[..., None] * reads
    k_out = k * tf.exp(cum[..., -1:] - cum)[..., None] * writes
    chunk_decay = tf.exp(cum[..., -1])[..., None, None] * carries

    def step(carry, inputs):
        s, _ = carry
        values, kcd, qi, ko, att, cd = inputs
        v_new = values - tf.matmul(kcd, s)
        out = tf.matmul(qi, s) + tf.matmul(att, v_new)
        return s * cd + tf.matmul(ko, v_new, transpose_a=True), out

    first = tf.zeros_like(take(new_values, 0))
    inputs = (new_values, k_cumdecay, q_in, k_out, intra, chunk_decay)
    if dtensor_ops:  # the same steps as the scan's, in Python over the static chunk count
        carry, outs = (state, first), []
        for i in range(static_chunks):
            carry = step(carry, [take(t, i) for t in inputs])
            outs.append(carry[1])
        last, outs = carry[0], tf.stack(outs)  # no [None][-1] round trip: DTensor cannot lay out that slice
    else:
        states, outs = tf.scan(step, inputs, initializer=(state, first))
        last = states[-1]
    outs = tf.reshape(tf.transpose(outs, [1, 0, 3, 2, 4]), [batch, n * chunk, heads, dv])
    return outs[:, :length], last


def unit_lower_inverse(ut: tf.Tensor, eye: tf.Tensor) -> tf.Tensor:
    """(I + L)^-1 of unit lower-triangular matrices ut = I + L [..., C, C] by matrix products: L is strictly
    lower, so L^C = 0 and the inverse is the finite series sum_{j<C} (-L)^j = (I - L)(I + L^2)(I + L^4)...,
    one squaring and one product per doubling of the terms covered. Equal to a triangular solve up to
    float rounding."""
    power = eye - ut                 # -L
    inverse = eye + power            # the terms j < 2
    covered = 2
    while covered < ut.shape[-1]:
        power = tf.matmul(power, power)                  # (-L)^covered
        inverse = inverse + tf.matmul(inverse, power)    # the terms j < 2 covered
        covered *= 2
    return inverse


def gated_rms_norm(o: tf.Tensor, z: tf.Tensor, weight: tf.Tensor, eps: float) -> tf.Tensor:
    """Qwen3_5MoeRMSNormGated: normalise in float32, cast back, times the plain weight, times SiLU(z) in float32."""
    o32 = tf.cast(o, tf.float32)
    normed = tf.cast(o32 * tf.math.rsqrt(tf.reduce_mean(o32 * o32, axis=-1, keepdims=True) + eps), o.dtype)
    y = tf.cast(weight * normed, tf.float32) * tf.nn.silu(tf.cast(z, tf.float32))
    return tf.cast(y, o.dtype)
