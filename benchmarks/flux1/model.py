"""The FLUX.1 MMDiT as the MLPerf reference builds it (torchtitan experiments/flux/model/{model,layers,math}.py at
9603aa83; the same math as black-forest-labs/flux@802fb471:src/flux/{model.py,modules/layers.py} with
guidance_embed=False, and diffusers' FluxTransformer2DModel).

- Conditioning: vec = MLP(timestep embedding of t) + MLP(pooled CLIP). The timestep embedding is
  [cos(1000 t f), sin(1000 t f)], f_i = 10000^(-i/128), computed in float32.
- Double-stream blocks: image and text streams with their own weights, adaLN-Zero modulation
  (shift1, scale1, gate1, shift2, scale2, gate2 from SiLU(vec)), q/k RMSNorm per head, one joint attention over
  [text, image] (text first), then each stream's GELU(tanh) MLP.
- Single-stream blocks over [text, image]: modulation (shift, scale, gate), one projection to q/k/v and the MLP's
  hidden units, and one output projection of [attention, GELU(mlp)].
- Final layer on the image tokens: modulation (shift, scale), then a linear to the packed latent channels.
- RoPE over three position axes (0, row, col) with dims `axes_dim`: ADJACENT pairs (2j, 2j+1) of a head turn
  (torchtitan math.py apply_rope), not the decoders' rotate-half; text tokens sit at (0, 0, 0).
- From-scratch init (torchtitan init_weights): Xavier-uniform on the reference's fused [out, in] shapes
  (qkv, the single block's linear1 and linear2 included), normal(0.02) on the time and vector embedders,
  zero on every modulation and on the final layer, q/k norm weights 1, biases 0.

The fused reference weights are held split where a mesh splits them (`heads` on q/k/v and the attention
output, `ff` on the MLP units); the split changes no number. Compute is in the runtime's compute dtype (bfloat16
as the reference runs under FSDP's MixedPrecisionPolicy), norms, RoPE, the timestep embedding and softmax in
float32, weights stored in float32.
"""
from __future__ import annotations

import math

import tensorflow as tf

from harness.nn.layers import Block, RMSNorm, constant, glorot_uniform, normal, silu, take
from harness.runtime.base import Runtime

from benchmarks.flux1.config import ModelConfig

TIME_DIM = 256          # timestep embedding width (torchtitan FluxModel: timestep_embedding(t, 256))
TIME_FACTOR = 1000.0    # t is multiplied by this before the sin/cos
EMBED_STDDEV = 0.02     # time_in / vector_in init


# ------------------------------------------------------------------------------------------ helpers

def layer_norm(x: tf.Tensor, epsilon: float) -> tf.Tensor:
    """LayerNorm without affine parameters, in float32, back in x's dtype."""
    xf = tf.cast(x, tf.float32)
    mean, var = tf.nn.moments(xf, axes=[-1], keepdims=True)
    return tf.cast((xf - mean) * tf.math.rsqrt(var + epsilon), x.dtype)


def modulate(x: tf.Tensor, shift: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
    """(1 + scale) * x + shift, the modulation [b, hidden] broadcast over the sequence."""
    return (1.0 + tf.expand_dims(scale, 1)) * x + tf.expand_dims(shift, 1)


def timestep_embedding(t: tf.Tensor, dim: int = TIME_DIM) -> tf.Tensor:
    """[cos(1000 t f), sin(1000 t f)] with f_i = exp(-ln(10000) i / (dim / 2)), i < dim / 2, in float32."""
    half = dim // 2
    freqs = tf.exp(-math.log(10000.0) * tf.range(half, dtype=tf.float32) / half)
    args = tf.expand_dims(TIME_FACTOR * tf.cast(t, tf.float32), 1) * tf.expand_dims(freqs, 0)
    return tf.concat([tf.cos(args), tf.sin(args)], -1)


def position_ids(text_tokens: int, grid: int) -> tf.Tensor:
    """[text + grid^2, 3] float32: (0, 0, 0) for every text token, then (0, row, col) for the image tokens in
    packing order (token row * grid + col)."""
    rows, cols = tf.meshgrid(tf.range(grid, dtype=tf.float32), tf.range(grid, dtype=tf.float32), indexing="ij")
    img = tf.stack([tf.zeros([grid * grid]), tf.reshape(rows, [-1]), tf.reshape(cols, [-1])], 1)
    return tf.concat([tf.zeros([text_tokens, 3]), img], 0)


def rope_angles(ids: tf.Tensor, axes_dim: list[int], theta: float) -> tuple[tf.Tensor, tf.Tensor]:
    """cos and sin [seq, head_dim / 2] of each token's angle per adjacent pair: axis a's d_a / 2 pairs turn by
    pos_a * theta^(-2i / d_a), the axes' pairs one after another (torchtitan math.py rope over EmbedND)."""
    angles = []
    for a, d in enumerate(axes_dim):
        omega = 1.0 / theta ** (tf.range(0, d, 2, dtype=tf.float64) / d)
        angles.append(tf.cast(ids[:, a:a + 1], tf.float64) * tf.expand_dims(omega, 0))
    angle = tf.concat(angles, 1)
    return tf.cast(tf.cos(angle), tf.float32), tf.cast(tf.sin(angle), tf.float32)


def apply_rope(x: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor) -> tf.Tensor:
    """x [b, seq, heads, head_dim] with pairs (2j, 2j+1) turned by angle j of each token, in float32."""
    b, s, h, d = x.shape
    pairs = tf.reshape(tf.cast(x, tf.float32), [b, s, h, d // 2, 2])
    x0, x1 = pairs[..., 0], pairs[..., 1]
    c, n = tf.reshape(cos, [1, s, 1, d // 2]), tf.reshape(sin, [1, s, 1, d // 2])
    out = tf.stack([c * x0 - n * x1, n * x0 + c * x1], -1)
    return tf.cast(tf.reshape(out, [b, s, h, d]), x.dtype)


def attention(q: tf.Tensor, k: tf.Tensor, v: tf.Tensor) -> tf.Tensor:
    """Full bidirectional softmax attention, q/k/v [b, seq, heads, head_dim], scale head_dim^-0.5 (SDPA's
    default; the reference stores but never uses a qk_scale); softmax in float32."""
    d = q.shape[-1]
    scores = tf.cast(tf.einsum("bqhd,bkhd->bhqk", q, k), tf.float32) * d ** -0.5
    probs = tf.cast(tf.nn.softmax(scores, axis=-1), v.dtype)
    return tf.einsum("bhqk,bkhd->bqhd", probs, v)


def xavier(fan_in: int, fan_out: int, path: str, seed: int):
    """Xavier-uniform with the reference's fans (of its fused weight, where the harness holds parts of it)."""
    return glorot_uniform(fan_in, fan_out, path, seed)


# ------------------------------------------------------------------------------------------- blocks

class Linear(Block):
    """y = x @ kernel + bias over the leading `n_in` kernel dims; `dims` names the kernel's dims for a mesh."""

    def __init__(self, runtime: Runtime, path: str, seed: int, shape: tuple[int, ...], dims: tuple, init,
                 bias: bool = True, bias_dims: tuple | None = None, n_in: int = 1) -> None:
        super().__init__(runtime, path, seed)
        self.n_in = n_in
        self.kernel = self.var("kernel", shape, dims, init)
        out_shape, out_dims = shape[n_in:], tuple(bias_dims if bias_dims is not None else dims[n_in:])
        self.bias = self.var("bias", out_shape, out_dims, constant(0.0)) if bias else None

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        k = tf.cast(self.kernel, self.dtype)
        y = tf.tensordot(tf.cast(x, self.dtype), k, [list(range(len(x.shape) - self.n_in, len(x.shape))),
                                                      list(range(self.n_in))])
        return y if self.bias is None else y + tf.cast(self.bias, self.dtype)


class MLPEmbedder(Block):
    """Linear, SiLU, Linear (torchtitan MLPEmbedder: in_layer, out_layer), normal(0.02) init."""

    def __init__(self, runtime: Runtime, path: str, seed: int, in_dim: int, hidden: int) -> None:
        super().__init__(runtime, path, seed)
        self.in_layer = Linear(runtime, f"{path}/in_layer", seed, (in_dim, hidden), (None, None),
                               normal(EMBED_STDDEV, f"{path}/in_layer/kernel", seed))
        self.out_layer = Linear(runtime, f"{path}/out_layer", seed, (hidden, hidden), (None, None),
                                normal(EMBED_STDDEV, f"{path}/out_layer/kernel", seed))

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        return self.out_layer(silu(self.in_layer(x)))


class Modulation(Block):
    """`parts` vectors [b, hidden] from SiLU(vec), zero-initialized (adaLN-Zero), in the reference's order."""

    def __init__(self, runtime: Runtime, path: str, seed: int, hidden: int, parts: int) -> None:
        super().__init__(runtime, path, seed)
        self.parts = parts
        self.lin = Linear(runtime, f"{path}/lin", seed, (hidden, parts * hidden), (None, None), constant(0.0))

    def __call__(self, vec: tf.Tensor) -> list[tf.Tensor]:
        return tf.split(self.lin(silu(vec)), self.parts, axis=-1)


class QKV(Block):
    """The fused q/k/v projection, kernel [hidden, 3, heads, head_dim] (the reference's "(K H D)" rows),
    Xavier on the reference's fused [`fused_out`, hidden] shape; then the per-head q and k RMSNorms."""

    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig, fused_out: int) -> None:
        super().__init__(runtime, path, seed)
        h, d = cfg.num_heads, cfg.head_dim
        self.qkv = Linear(runtime, f"{path}/qkv", seed, (cfg.hidden_size, 3, h, d), (None, None, "heads", None),
                          xavier(cfg.hidden_size, fused_out, f"{path}/qkv/kernel", seed), bias=cfg.qkv_bias)
        self.query_norm = RMSNorm(runtime, f"{path}/query_norm", seed, d, cfg.norm_epsilon)
        self.key_norm = RMSNorm(runtime, f"{path}/key_norm", seed, d, cfg.norm_epsilon)

    def __call__(self, x: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        qkv = self.qkv(x)                                                     # [b, s, 3, heads, head_dim]
        q, k, v = (take(qkv, i, 2) for i in range(3))  # every axis written out: heads may be split (take)
        return self.query_norm(q), self.key_norm(k), v


class Stream(Block):
    """One stream of a double block: modulation, q/k/v with norms, attention output projection, MLP."""

    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig) -> None:
        super().__init__(runtime, path, seed)
        m, h, d, f = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.mlp_hidden
        self.mod = Modulation(runtime, f"{path}/mod", seed, m, 6)
        self.attn = QKV(runtime, f"{path}/attn", seed, cfg, 3 * m)
        self.proj = Linear(runtime, f"{path}/attn/proj", seed, (h, d, m), ("heads", None, None),
                           xavier(m, m, f"{path}/attn/proj/kernel", seed), bias_dims=(None,), n_in=2)
        self.mlp_in = Linear(runtime, f"{path}/mlp/in", seed, (m, f), (None, "ff"),
                             xavier(m, f, f"{path}/mlp/in/kernel", seed))
        self.mlp_out = Linear(runtime, f"{path}/mlp/out", seed, (f, m), ("ff", None),
                              xavier(f, m, f"{path}/mlp/out/kernel", seed))
        self.epsilon = cfg.norm_epsilon

    def mlp(self, x: tf.Tensor) -> tf.Tensor:
        return self.mlp_out(tf.nn.gelu(self.mlp_in(x), approximate=True))


class DoubleBlock(Block):
    """torchtitan DoubleStreamBlock: image and text streams attend jointly over [text, image]."""

    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig) -> None:
        super().__init__(runtime, path, seed)
        self.img = Stream(runtime, f"{path}/img", seed, cfg)
        self.txt = Stream(runtime, f"{path}/txt", seed, cfg)

    def __call__(self, img: tf.Tensor, txt: tf.Tensor, vec: tf.Tensor, cos: tf.Tensor,
                 sin: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        eps = self.img.epsilon
        mods, qkvs = {}, {}
        for name, stream, x in (("img", self.img, img), ("txt", self.txt, txt)):
            mods[name] = [tf.cast(p, x.dtype) for p in stream.mod(vec)]
            shift1, scale1 = mods[name][0], mods[name][1]
            qkvs[name] = stream.attn(modulate(layer_norm(x, eps), shift1, scale1))
        n_txt = txt.shape[1]
        q, k, v = (tf.concat([qkvs["txt"][i], qkvs["img"][i]], 1) for i in range(3))
        ctx = attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
        out = []
        for name, stream, x, a in (("img", self.img, img, ctx[:, n_txt:]), ("txt", self.txt, txt, ctx[:, :n_txt])):
            _, _, gate1, shift2, scale2, gate2 = mods[name]
            x = x + tf.expand_dims(gate1, 1) * stream.proj(a)
            x = x + tf.expand_dims(gate2, 1) * stream.mlp(modulate(layer_norm(x, eps), shift2, scale2))
            out.append(x)
        return out[0], out[1]


class SingleBlock(Block):
    """torchtitan SingleStreamBlock over [text, image]: linear1 = q/k/v and the MLP's input (held as two
    kernels, Xavier with linear1's fused fans), linear2 = attention and MLP outputs (two kernels, one bias,
    Xavier with linear2's fused fans)."""

    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig) -> None:
        super().__init__(runtime, path, seed)
        m, h, d, f = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.mlp_hidden
        self.epsilon = cfg.norm_epsilon
        self.mod = Modulation(runtime, f"{path}/mod", seed, m, 3)
        self.attn = QKV(runtime, f"{path}/attn", seed, cfg, 3 * m + f)
        self.mlp_in = Linear(runtime, f"{path}/mlp_in", seed, (m, f), (None, "ff"),
                             xavier(m, 3 * m + f, f"{path}/mlp_in/kernel", seed))
        self.out_attn = Linear(runtime, f"{path}/out_attn", seed, (h, d, m), ("heads", None, None),
                               xavier(m + f, m, f"{path}/out_attn/kernel", seed), bias=False, n_in=2)
        self.out_mlp = Linear(runtime, f"{path}/out_mlp", seed, (f, m), ("ff", None),
                              xavier(m + f, m, f"{path}/out_mlp/kernel", seed))

    def __call__(self, x: tf.Tensor, vec: tf.Tensor, cos: tf.Tensor, sin: tf.Tensor) -> tf.Tensor:
        shift, scale, gate = (tf.cast(p, x.dtype) for p in self.mod(vec))
        u = modulate(layer_norm(x, self.epsilon), shift, scale)
        q, k, v = self.attn(u)
        a = attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
        hidden = tf.nn.gelu(self.mlp_in(u), approximate=True)
        return x + tf.expand_dims(gate, 1) * (self.out_attn(a) + self.out_mlp(hidden))


class LastLayer(Block):
    """Modulation (shift, scale) of the image tokens, then a linear to the packed latent channels; both zero."""

    def __init__(self, runtime: Runtime, path: str, seed: int, cfg: ModelConfig) -> None:
        super().__init__(runtime, path, seed)
        m = cfg.hidden_size
        self.epsilon = cfg.norm_epsilon
        self.mod = Modulation(runtime, f"{path}/adaLN", seed, m, 2)
        self.linear = Linear(runtime, f"{path}/linear", seed, (m, cfg.in_channels), (None, None), constant(0.0))

    def __call__(self, x: tf.Tensor, vec: tf.Tensor) -> tf.Tensor:
        shift, scale = (tf.cast(p, x.dtype) for p in self.mod(vec))
        return self.linear(modulate(layer_norm(x, self.epsilon), shift, scale))


class Flux(Block):
    """The MMDiT: called on packed noisy latents [b, tokens, in_channels], T5 states [b, text, context_in_dim],
    pooled CLIP [b, vec_in_dim] and timesteps t [b] in [0, 1]; returns the predicted velocity, packed like the
    latents, in the compute dtype."""

    def __init__(self, runtime: Runtime, name: str, seed: int, cfg: ModelConfig) -> None:
        super().__init__(runtime, name, seed)
        self.cfg = cfg
        m = cfg.hidden_size
        self.img_in = Linear(runtime, f"{name}/img_in", seed, (cfg.in_channels, m), (None, None),
                             xavier(cfg.in_channels, m, f"{name}/img_in/kernel", seed))
        self.txt_in = Linear(runtime, f"{name}/txt_in", seed, (cfg.context_in_dim, m), (None, None),
                             xavier(cfg.context_in_dim, m, f"{name}/txt_in/kernel", seed))
        self.time_in = MLPEmbedder(runtime, f"{name}/time_in", seed, TIME_DIM, m)
        self.vector_in = MLPEmbedder(runtime, f"{name}/vector_in", seed, cfg.vec_in_dim, m)
        self.double_blocks = [DoubleBlock(runtime, f"{name}/double_{i}", seed, cfg) for i in range(cfg.depth)]
        self.single_blocks = [SingleBlock(runtime, f"{name}/single_{i}", seed, cfg)
                              for i in range(cfg.depth_single_blocks)]
        self.final_layer = LastLayer(runtime, f"{name}/final_layer", seed, cfg)

    def __call__(self, img: tf.Tensor, txt: tf.Tensor, y: tf.Tensor, t: tf.Tensor) -> tf.Tensor:
        c = self.cfg
        n_txt, n_img = txt.shape[1], img.shape[1]
        grid = int(round(math.sqrt(n_img)))
        cos, sin = rope_angles(position_ids(n_txt, grid), list(c.axes_dim), c.theta)
        vec = self.time_in(timestep_embedding(t)) + self.vector_in(y)
        img, txt = self.img_in(img), self.txt_in(txt)
        for block in self.double_blocks:
            if c.remat:
                img, txt = tf.recompute_grad(lambda a, b, v, blk=block: blk(a, b, v, cos, sin))(img, txt, vec)
            else:
                img, txt = block(img, txt, vec, cos, sin)
        x = tf.concat([txt, img], 1)
        for block in self.single_blocks:
            if c.remat:
                x = tf.recompute_grad(lambda a, v, blk=block: blk(a, v, cos, sin))(x, vec)
            else:
                x = block(x, vec, cos, sin)
        return self.final_layer(x[:, n_txt:], vec)
