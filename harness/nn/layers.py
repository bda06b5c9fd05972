"""A small set of tf.Module blocks whose variables come from `Runtime.variable` with named dimensions.

Not Keras: Keras 3 layers cannot hold DTensor-sharded variables on the TF backend, and MLPerf needs exact
control of initialization, precision, batch-norm synchronization and weight-decay exclusions. Every
initializer is stateless, seeded by (run seed, variable path), so a model is the same on any runtime.

Variable paths carry the role of the weight in their last component (`kernel`, `bias`, `gamma`, `beta`,
`embeddings`) and the kind of layer in the path (`bn`, `layer_norm`), which is what optimizers match to
skip weight decay and LARS/LAMB adaptation.
"""
from __future__ import annotations

import dataclasses
import math
import zlib
from typing import Callable, Sequence

import tensorflow as tf

from harness.runtime.base import Runtime

Initializer = Callable[[Sequence[int], tf.DType], tf.Tensor]


def _seed(path: str, run_seed: int) -> tf.Tensor:
    return tf.constant([run_seed, zlib.crc32(path.encode()) & 0x7FFFFFFF], tf.int64)


def truncated_normal(stddev: float, path: str, run_seed: int) -> Initializer:
    return lambda shape, dtype: tf.random.stateless_truncated_normal(
        shape, _seed(path, run_seed), stddev=stddev, dtype=dtype)


def normal(stddev: float, path: str, run_seed: int) -> Initializer:
    return lambda shape, dtype: tf.random.stateless_normal(shape, _seed(path, run_seed), stddev=stddev,
                                                           dtype=dtype)


def he_normal_fan_in(path: str, run_seed: int) -> Initializer:
    """Variance scaling 2.0 over fan-in (kernel height x width x input channels), truncated normal.

    The MLPerf ResNet TF2 reference's conv init (Keras `he_normal`, as in Google's v0.7 TF2 code).
    As in Keras, the truncated normal's stddev is divided by 0.8796..., the stddev of a unit normal
    truncated at two standard deviations, so the kept values have variance 2 / fan_in.
    """
    def init(shape: Sequence[int], dtype: tf.DType) -> tf.Tensor:
        fan_in = math.prod(shape[:-1])
        stddev = math.sqrt(2.0 / fan_in) / 0.87962566103423978
        return tf.random.stateless_truncated_normal(shape, _seed(path, run_seed), stddev=stddev, dtype=dtype)
    return init


def glorot_uniform(fan_in: int, fan_out: int, path: str, run_seed: int) -> Initializer:
    """Uniform in +-sqrt(6 / (fan_in + fan_out)): tf.layers.dense's default, which the MLPerf Transformer
    reference's attention and feed-forward layers use. Fans are explicit because a per-head kernel
    (hidden, heads, head_dim) is one (hidden, hidden) matrix to the reference."""
    limit = math.sqrt(6.0 / (fan_in + fan_out))
    return lambda shape, dtype: tf.random.stateless_uniform(shape, _seed(path, run_seed), -limit, limit,
                                                            dtype=dtype)


def constant(value: float) -> Initializer:
    return lambda shape, dtype: tf.fill(shape, tf.cast(value, dtype))


class Block(tf.Module):
    """Base for layers: knows its runtime, its path prefix and the run seed."""

    def __init__(self, runtime: Runtime, path: str, seed: int) -> None:
        super().__init__(name=None)
        self.runtime = runtime
        self.path = path
        self.seed = seed

    def var(self, name: str, shape: Sequence[int], dims: Sequence[str | None], init: Initializer,
            trainable: bool = True, sync: str = "first") -> tf.Variable:
        return self.runtime.variable(f"{self.path}/{name}", shape, dims, init, trainable=trainable, sync=sync)

    @property
    def dtype(self) -> tf.DType:
        return self.runtime.compute_dtype


class Dense(Block):
    def __init__(self, runtime: Runtime, path: str, seed: int, in_dim: int, out_dim: int,
                 dims: tuple[str | None, str | None] = (None, None), use_bias: bool = True,
                 init: Initializer | None = None, stddev: float = 0.02) -> None:
        super().__init__(runtime, path, seed)
        self.kernel = self.var("kernel", (in_dim, out_dim), dims,
                               init or truncated_normal(stddev, f"{path}/kernel", seed))
        self.bias = self.var("bias", (out_dim,), (dims[1],), constant(0.0)) if use_bias else None

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        y = tf.matmul(tf.cast(x, self.dtype), tf.cast(self.kernel, self.dtype))
        if self.bias is not None:
            y = y + tf.cast(self.bias, self.dtype)
        return y


class Conv2D(Block):
    """Convolution without bias, He fan-in init. Stride 1 pads TF 'SAME' ((size - 1) // 2 before, the rest
    after). A strided conv pads as `padding` says, since the MLPerf references differ there:

    - "fixed": (size - 1) // 2 zeros before and the rest after, whatever the input size, then a VALID conv:
      the TF1 ResNet reference's `fixed_padding` (3x3/2 pads 1/1, 7x7/2 3/3), and the TF2 reference's stem
      (ZeroPadding2D(3) then a valid 7x7/2).
    - "same": TF/Keras 'SAME', which depends on the input size: pad_total = max((ceil(in / stride) - 1) *
      stride + size - in, 0), pad_total // 2 before and the rest after; a 3x3/2 pads 0/1 at even sizes and
      1/1 at odd ones. The TF2 ResNet reference's strided 3x3 convs (Conv2D(padding='same')).

    Both give ceil(in / stride) outputs for an odd `size`, so shapes and FLOPs do not depend on the choice.
    """

    PADDINGS = ("fixed", "same")

    def __init__(self, runtime: Runtime, path: str, seed: int, in_ch: int, out_ch: int, size: int,
                 stride: int = 1, padding: str = "fixed") -> None:
        super().__init__(runtime, path, seed)
        if padding not in self.PADDINGS:
            raise ValueError(f"{path}: padding {padding!r} is not one of {self.PADDINGS}")
        self.stride = stride
        self.size = size
        self.padding = padding
        self.kernel = self.var("kernel", (size, size, in_ch, out_ch), (None, None, None, "channels"),
                               he_normal_fan_in(f"{path}/kernel", seed))

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        kernel = tf.cast(self.kernel, self.dtype)
        x = tf.cast(x, self.dtype)
        if self.stride > 1 and self.padding == "fixed":
            pad = self.size - 1
            x = tf.pad(x, [[0, 0], [pad // 2, pad - pad // 2], [pad // 2, pad - pad // 2], [0, 0]])
            return tf.nn.conv2d(x, kernel, self.stride, "VALID")
        return tf.nn.conv2d(x, kernel, self.stride, "SAME")


class BatchNorm(Block):
    """Batch norm whose statistics span `group_size` replicas (MLPerf's `model_bn_span`)."""

    def __init__(self, runtime: Runtime, path: str, seed: int, channels: int, momentum: float = 0.9,
                 epsilon: float = 1e-5, gamma_init: float = 1.0, group_size: int = 1) -> None:
        super().__init__(runtime, path, seed)
        self.momentum = momentum
        self.epsilon = epsilon
        self.group_size = group_size
        self.gamma = self.var("gamma", (channels,), ("channels",), constant(gamma_init))
        self.beta = self.var("beta", (channels,), ("channels",), constant(0.0))
        self.moving_mean = self.var("moving_mean", (channels,), ("channels",), constant(0.0), trainable=False,
                                   sync="mean")
        self.moving_var = self.var("moving_variance", (channels,), ("channels",), constant(1.0),
                                   trainable=False, sync="mean")

    def __call__(self, x: tf.Tensor, training: bool) -> tf.Tensor:
        axes = list(range(len(x.shape) - 1))
        if training:
            xf = tf.cast(x, tf.float32)
            count = tf.cast(tf.reduce_prod(tf.shape(xf)[:-1]), tf.float32)
            s, ss = tf.reduce_sum(xf, axes), tf.reduce_sum(tf.square(xf), axes)
            s, ss, count = self.runtime.replica_all_sum([s, ss, count], self.group_size)
            mean = s / count
            var = tf.maximum(ss / count - tf.square(mean), 0.0)
            # Averaged over replicas (one all-reduce per step for all layers, see Runtime.assign_mean).
            self.runtime.assign_mean(self.moving_mean, self.moving_mean * self.momentum + mean * (1 - self.momentum))
            self.runtime.assign_mean(self.moving_var, self.moving_var * self.momentum + var * (1 - self.momentum))
        else:
            mean, var = self.moving_mean, self.moving_var
        inv = tf.math.rsqrt(var + self.epsilon) * self.gamma
        return x * tf.cast(inv, x.dtype) + tf.cast(self.beta - mean * inv, x.dtype)


class LayerNorm(Block):
    def __init__(self, runtime: Runtime, path: str, seed: int, dim: int, epsilon: float = 1e-12,
                 dim_name: str | None = None) -> None:
        super().__init__(runtime, path, seed)
        self.epsilon = epsilon
        self.gamma = self.var("gamma", (dim,), (dim_name,), constant(1.0))
        self.beta = self.var("beta", (dim,), (dim_name,), constant(0.0))

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        xf = tf.cast(x, tf.float32)
        mean, var = tf.nn.moments(xf, axes=[-1], keepdims=True)
        y = (xf - mean) * tf.math.rsqrt(var + self.epsilon) * self.gamma + self.beta
        return tf.cast(y, x.dtype)


def take(t: tf.Tensor, index: int | tf.Tensor, axis: int = 0) -> tf.Tensor:
    """t[..., index, ...] at `axis`, that axis dropped, written with a slice for every other axis. DTensor lays
    out the short forms (t[i], t[:, i], t[i, ...]) of a tensor of rank 4 or more wrongly when a later axis is
    split over the mesh: the values come back from the wrong shards, silently (measured on a 2-device CPU mesh,
    TensorFlow 2.21: rank 4 split on axis 1 or 2, rank 5 split on axis 1 or 3; the full form is right)."""
    rank = t.shape.rank
    axis = axis % rank
    return t[(slice(None),) * axis + (index,) + (slice(None),) * (rank - axis - 1)]


def vocab_parallel_lookup(runtime: Runtime, table: tf.Variable | tf.Tensor, ids: tf.Tensor) -> tf.Tensor:
    """Rows `ids` of `table` [vocab, dim], whose vocab dimension the runtime may split.

    Kept whole (tf.distribute runtimes, or a layout that does not split `vocab`): a plain gather. Split n
    ways: the table is viewed as [n, vocab / n, dim] with its first axis on the vocab's devices; each device
    looks every id up in its own rows only (at id mod vocab / n), an id another device owns is masked to
    zero, and the n partial lookups are summed (one all-reduce of [batch, seq, dim] over the vocab's mesh
    dimension). A gather from the split table would make DTensor all-gather it to full size first, and
    build the gradient as a dense full-size segment sum; here the gradient is a one-hot contraction that
    each device computes for its own rows only (the same size as one device's share of a vocab-split
    output layer), so table, gradient and optimizer update stay shards.
    """
    n = runtime.shards("vocab")
    table = runtime.read(table) if isinstance(table, tf.Variable) else table
    if n == 1:
        return tf.gather(table, ids)
    if ids.shape.rank != 2:
        raise ValueError(f"a vocab-split lookup takes ids [batch, seq], not rank {ids.shape.rank}")
    vocab, dim = table.shape
    rows = vocab // n
    ids = tf.cast(ids, tf.int32)
    batch_dims = ("batch", None)
    own = runtime.place(tf.one_hot(ids // rows, n, dtype=table.dtype), batch_dims + ("vocab",))
    local_ids = ids % rows

    @tf.custom_gradient
    def lookup(t: tf.Tensor) -> tf.Tensor:
        shards = runtime.place(tf.reshape(t, [n, rows, dim]), ("vocab", None, None))
        looked = runtime.place(tf.gather(shards, local_ids, axis=1), ("vocab",) + batch_dims + (None,))
        out = tf.einsum("kbsm,bsk->bsm", looked, own)

        def grad(dy: tf.Tensor) -> tf.Tensor:
            hot = runtime.place(tf.one_hot(local_ids, rows, dtype=dy.dtype), batch_dims + (None,))
            per_shard = tf.einsum("bsr,bsk,bsm->krm", hot, tf.cast(own, dy.dtype), dy)
            per_shard = runtime.place(per_shard, ("vocab", None, None))
            return tf.cast(tf.reshape(per_shard, [vocab, dim]), t.dtype)

        return out, grad

    return lookup(table)


class Embedding(Block):
    def __init__(self, runtime: Runtime, path: str, seed: int, vocab: int, dim: int,
                 dims: tuple[str | None, str | None] = ("vocab", None), stddev: float = 0.02) -> None:
        super().__init__(runtime, path, seed)
        self.vocab_split = dims[0] == "vocab"
        self.embeddings = self.var("embeddings", (vocab, dim), dims,
                                   truncated_normal(stddev, f"{path}/embeddings", seed))

    def __call__(self, ids: tf.Tensor) -> tf.Tensor:
        if self.vocab_split:
            return tf.cast(vocab_parallel_lookup(self.runtime, self.embeddings, ids), self.dtype)
        return tf.cast(tf.gather(self.embeddings, ids), self.dtype)


def dropout(x: tf.Tensor, rate: float, seed: tf.Tensor | None) -> tf.Tensor:
    """Stateless dropout (seeded by step and layer), so a run is reproducible on any runtime."""
    if not rate or seed is None:
        return x
    return tf.nn.experimental.stateless_dropout(x, rate, seed)


@tf.custom_gradient
def silu(x: tf.Tensor) -> tf.Tensor:
    """x * sigmoid(x): tf.nn.silu's values and gradient (sigmoid recomputed in the backward pass, so only
    x is kept), without its constant `beta` operand.

    A custom gradient is an IdentityN over its outputs and inputs. DTensor's SPMD expansion re-creates
    that op after whichever operand it finds last, comparing positions across blocks; inside the train
    loop (a while loop), tf.nn.silu's beta constant is hoisted out of the loop body and can win, moving
    the op out of the loop: "operand #0 does not dominate this use". Here the only operands are x and the
    result, both computed where the model calls silu."""
    def grad(dy: tf.Tensor) -> tf.Tensor:
        with tf.control_dependencies([dy]):  # recomputed, not kept from the forward pass
            sig = tf.sigmoid(x)
        return dy * (sig * (1.0 + x * (1.0 - sig)))

    return x * tf.sigmoid(x), grad


NEG_INF = -1e9  # additive attention bias of a masked key (exp underflows to exactly 0 in float32)


def padding_bias(key_mask: tf.Tensor, value: float = NEG_INF) -> tf.Tensor:
    """(batch, keys) 1/0 mask -> additive bias (batch, 1, 1, keys)."""
    return (1.0 - tf.cast(key_mask, tf.float32))[:, None, None, :] * value


class MultiHeadAttention(Block):
    """Attention with per-head weights (hidden, heads, head_dim), so heads shard over a mesh.

    Each device computes its heads end to end; only the output projection sums over heads (one
    all-reduce on the model dimension), as in Megatron-style tensor parallelism. Self- or cross-attention
    (`memory`), any additive `bias` (padding, causal, packed segments), and incremental decoding through
    `project_kv` + `attend` with key/value caches the caller keeps.
    """

    def __init__(self, runtime: Runtime, path: str, seed: int, hidden: int, heads: int,
                 stddev: float = 0.02, dropout_rate: float = 0.0, use_bias: bool = True,
                 glorot: bool = False) -> None:
        super().__init__(runtime, path, seed)
        if hidden % heads:
            raise ValueError(f"{path}: hidden {hidden} is not a multiple of heads {heads}")
        self.heads, self.head_dim = heads, hidden // heads
        self.dropout_rate = dropout_rate
        self.use_bias = use_bias

        def init(name: str) -> Initializer:
            where = f"{path}/{name}/kernel"
            return glorot_uniform(hidden, hidden, where, seed) if glorot else truncated_normal(stddev, where, seed)

        shape = (hidden, heads, self.head_dim)
        dims = (None, "heads", None)
        for name in ("query", "key", "value"):
            setattr(self, f"{name}_kernel", self.var(f"{name}/kernel", shape, dims, init(name)))
            setattr(self, f"{name}_bias", self.var(f"{name}/bias", (heads, self.head_dim), ("heads", None),
                                                   constant(0.0)) if use_bias else None)
        self.output_kernel = self.var("output/kernel", (heads, self.head_dim, hidden), ("heads", None, None),
                                      init("output"))
        self.output_bias = self.var("output/bias", (hidden,), (None,), constant(0.0)) if use_bias else None

    def _project(self, x: tf.Tensor, kernel: tf.Variable, bias: tf.Variable | None) -> tf.Tensor:
        y = tf.einsum("bsh,hnd->bsnd", tf.cast(x, self.dtype), tf.cast(kernel, self.dtype))
        return y if bias is None else y + tf.cast(bias, self.dtype)

    def project_kv(self, memory: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """Keys and values (batch, keys, heads, head_dim) of `memory`: computed once per decode for an
        encoder output, or per new position for a decoder cache."""
        return (self._project(memory, self.key_kernel, self.key_bias),
                self._project(memory, self.value_kernel, self.value_bias))

    def attend(self, x: tf.Tensor, k: tf.Tensor, v: tf.Tensor, bias: tf.Tensor,
               seed: tf.Tensor | None = None) -> tf.Tensor:
        """Queries from x (batch, q, hidden) over given keys/values; `bias` broadcasts to (b, heads, q, k)."""
        dt = self.dtype
        q = self._project(x, self.query_kernel, self.query_bias) * tf.cast(self.head_dim ** -0.5, dt)
        scores = tf.cast(tf.einsum("bsnd,btnd->bnst", q, k), tf.float32) + bias
        probs = tf.cast(tf.nn.softmax(scores, axis=-1), dt)
        probs = dropout(probs, self.dropout_rate, seed)
        context = tf.einsum("bnst,btnd->bsnd", probs, v)
        y = tf.einsum("bsnd,ndh->bsh", context, tf.cast(self.output_kernel, dt))
        return y if self.output_bias is None else y + tf.cast(self.output_bias, dt)

    def __call__(self, x: tf.Tensor, key_mask: tf.Tensor | None = None, seed: tf.Tensor | None = None, *,
                 memory: tf.Tensor | None = None, bias: tf.Tensor | None = None) -> tf.Tensor:
        """x: (batch, seq, hidden) attends to `memory` (default x). Masking: `bias` if given, else
        `key_mask` (batch, keys), 1 for real tokens and 0 for padding."""
        k, v = self.project_kv(x if memory is None else memory)
        if bias is None:
            # -10000: BERT's reference value (any large value gives the same softmax in float32).
            bias = padding_bias(key_mask, -10000.0) if key_mask is not None else tf.zeros([1, 1, 1, 1])
        return self.attend(x, k, v, bias, seed)


class RMSNorm(Block):
    """Root-mean-square norm (no centering, no bias), as in Llama/GPT-OSS: x * rsqrt(mean(x^2) + eps) * gamma.
    `offset` 1: the zero-centred form x * rsqrt(...) * (1 + gamma), gamma initialized to 0 (Qwen3.5's
    Qwen3_5MoeRMSNorm, its weight stored as w, not 1 + w), the sum taken in float32."""

    def __init__(self, runtime: Runtime, path: str, seed: int, dim: int, epsilon: float = 1e-6,
                 offset: float = 0.0) -> None:
        super().__init__(runtime, path, seed)
        self.epsilon, self.offset = epsilon, offset
        self.gamma = self.var("gamma", (dim,), (None,), constant(1.0 - offset))

    def __call__(self, x: tf.Tensor) -> tf.Tensor:
        xf = tf.cast(x, tf.float32)
        gamma = tf.cast(self.gamma, tf.float32) + self.offset if self.offset else self.gamma
        y = xf * tf.math.rsqrt(tf.reduce_mean(tf.square(xf), -1, keepdims=True) + self.epsilon) * gamma
        return tf.cast(y, x.dtype)


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama 3.1's RoPE frequency scaling (`rope_type: llama3`): wavelengths shorter than
    original_context / high_freq_factor keep their frequency, those longer than original_context /
    low_freq_factor are divided by `factor`, and those between are interpolated smoothly."""
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context: int = 8192


@dataclasses.dataclass(frozen=True)
class YarnScaling:
    """YaRN RoPE scaling (`rope_type: yarn`) as Hugging Face transformers computes it for gpt-oss
    (modeling_rope_utils `_compute_yarn_parameters`): frequency i interpolates between base^(-2i/dim) and
    that divided by `factor` along a linear ramp between the correction dimensions of `beta_fast` and
    `beta_slow` rotations over `original_context` tokens (floor/ceil when `truncate`), and cos/sin are
    multiplied by 0.1 ln(factor) + 1, so q.k scales by its square."""
    factor: float = 32.0
    original_context: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = False

    def attention_factor(self) -> float:
        return 0.1 * math.log(self.factor) + 1.0 if self.factor > 1 else 1.0

    def ramp_bounds(self, dim: int, base: float) -> tuple[float, float]:
        """(low, high): the correction dimensions where the ramp from extrapolation to interpolation starts
        and ends."""
        def correction_dim(rotations: float) -> float:
            return dim * math.log(self.original_context / (rotations * 2 * math.pi)) / (2 * math.log(base))
        low, high = correction_dim(self.beta_fast), correction_dim(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:  # a ramp of no width: transformers widens it by 0.001
            high += 0.001
        return low, high


def rope_frequencies(dim: int, base: float, scaling: RopeScaling | YarnScaling | None = None) -> tf.Tensor:
    """The dim / 2 inverse frequencies base^(-2i/dim) of RoPE, scaled as `scaling` says (None: unscaled)."""
    half = dim // 2
    inv = base ** (-tf.range(half, dtype=tf.float32) * 2.0 / dim)
    if scaling is None:
        return inv
    if isinstance(scaling, YarnScaling):
        low, high = scaling.ramp_bounds(dim, base)
        ramp = tf.clip_by_value((tf.range(half, dtype=tf.float32) - low) / (high - low), 0.0, 1.0)
        return inv / scaling.factor * ramp + inv * (1.0 - ramp)
    s = scaling
    wavelength = 2.0 * math.pi / inv
    smooth = (s.original_context / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    between = (1.0 - smooth) * inv / s.factor + smooth * inv
    low = tf.where(wavelength > s.original_context / s.low_freq_factor, inv / s.factor, between)
    return tf.where(wavelength < s.original_context / s.high_freq_factor, inv, low)


def rotary(x: tf.Tensor, base: float, scaling: RopeScaling | YarnScaling | None = None,
           start: tf.Tensor | int = 0) -> tf.Tensor:
    """Rotary position embedding (RoPE, rotate-half form as Megatron/Llama) of x [batch, seq, ..., dim]
    at positions start..start+seq-1 (`start` may be a scalar tensor: a decoding step's): pairs (i, i + dim/2)
    turn by position * base^(-2i/dim) (frequencies scaled by `scaling` when given; YaRN also scales cos and
    sin by its attention factor). Static shapes only."""
    seq, dim = x.shape[1], x.shape[-1]
    half = dim // 2
    inv = rope_frequencies(dim, base, scaling)
    position = tf.range(seq, dtype=tf.float32)
    if not isinstance(start, int) or start:
        position += tf.cast(start, tf.float32)
    angle = position[:, None] * inv[None, :]                                  # [seq, half]
    shape = [1, seq] + [1] * (len(x.shape) - 3) + [half]
    cos, sin = tf.reshape(tf.cos(angle), shape), tf.reshape(tf.sin(angle), shape)
    if isinstance(scaling, YarnScaling) and scaling.attention_factor() != 1.0:
        cos, sin = cos * scaling.attention_factor(), sin * scaling.attention_factor()
    cos, sin = tf.cast(cos, x.dtype), tf.cast(sin, x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return tf.concat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
