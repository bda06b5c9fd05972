"""The rectified-flow objective of the MLPerf flux1 reference and the random numbers it draws.

One training step per sample (mlcommons/training@aa344c7f text_to_image, torchtitan 9603aa83
torchtitan/experiments/flux/train.py FluxTrainer.train_step, utils.py):

    z   = mean + exp(0.5 logvar) * e_vae          the VAE latent, resampled every step from the stored moments
    x0  = (z - shift) * scale                     shift 0.1159, scale 0.3611
    t   = bfloat16(u),  u ~ U[0, 1)               plain uniform, no shift, rounded to bfloat16 before any use
    x_t = (1 - t) x0 + t e                        e ~ N(0, I)
    loss = mean over the latent's elements of (model(x_t, t) - (e - x0))^2, in float32

with the text swapped for the empty prompt's encodings with probability 0.1 (training only). The
reference computes z, x0, x_t and the target in bfloat16; so does this module in the runtime's compute dtype.
Latents are packed [b, c, (h 2), (w 2)] -> [b, (h w), (c 2 2)] (torchtitan utils.pack_latents, einops
"b c (h ph) (w pw) -> b (h w) (c ph pw)") before anything else: every step is elementwise, so packing first
changes no number, and the model reads and predicts packed tokens.

Random numbers. The reference seeds every data-parallel rank differently (torchtitan distributed/utils.py
set_determinism: seed + dp_replicate_rank + dp_shard_rank x dp_replicate_size); its 5.1 version left ranks of
one shard index on different nodes drawing the same noise. Here every number is a counter-based integer hash
of (a stateless seed, the sample's position in the GLOBAL batch, a stream, the element). The seed is (run
seed, step), the same on every replica (harness/train/loop.py position_seed, asked for by
Workload.DRAWS_BY_GLOBAL_POSITION); the position comes with the example from the input pipeline
(benchmarks/flux1/data.py with_slots), not from a device-side range. So distinct replicas draw distinct noise,
along every data-parallel axis at once, because their samples' positions differ, and one device, mirrored
replicas, a DTensor mesh, micro-batches and an XLA step all draw exactly the same numbers for a sample. Only
integer ops and a few float ones make them: no TensorFlow random kernel, whose XLA and plain versions differ.
Normals come from two uniforms by Box-Muller. The validation draws are keyed by (run seed, optimizer step, the
sample's index in the validation set): fresh noise at every eval, as the reference, yet reproducible.
"""
from __future__ import annotations

import math

import tensorflow as tf

MASK32 = 0xFFFFFFFF
# streams: which quantity a hash feeds
T_STREAM, DROP_STREAM, NOISE_STREAM, VAE_STREAM, EVAL_NOISE_STREAM, EVAL_VAE_STREAM = 1, 2, 3, 4, 5, 6


# ------------------------------------------------------------------------------------- random numbers

def hash32(x: tf.Tensor) -> tf.Tensor:
    """A 32-bit integer hash (Chris Wellons' "lowbias32"; https://nullprogram.com/blog/2018/07/31/) on int64
    tensors holding values in [0, 2^32): full avalanche, so neighbouring counters give unrelated outputs."""
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16))
    x = tf.bitwise.bitwise_and(x * 0x7FEB352D, MASK32)
    x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 15))
    x = tf.bitwise.bitwise_and(x * 0x846CA68B, MASK32)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16))


def _mix(key: tf.Tensor, value: tf.Tensor) -> tf.Tensor:
    return hash32(tf.bitwise.bitwise_xor(key, tf.bitwise.bitwise_and(tf.cast(value, tf.int64), MASK32)))


def sample_keys(seed: tf.Tensor, positions: tf.Tensor, stream: int) -> tf.Tensor:
    """int64 [b] keys in [0, 2^32) of (seed int64 [2], each sample's position, stream)."""
    seed = tf.cast(seed, tf.int64)
    key = tf.constant(stream * 0x9E3779B9 & MASK32, tf.int64)
    for part in (seed[0], tf.bitwise.right_shift(seed[0], 32), seed[1], tf.bitwise.right_shift(seed[1], 32)):
        key = _mix(key, part)
    return _mix(tf.fill(tf.shape(positions), key), positions)


def uniform(keys: tf.Tensor, shape: list[int]) -> tf.Tensor:
    """float32 [b, *shape] uniform in [0, 1) (multiples of 2^-24), element i of row r from hash(keys[r], i)."""
    n = math.prod(shape)
    counters = tf.range(n, dtype=tf.int64)
    bits = hash32(_mix(tf.expand_dims(keys, 1), tf.expand_dims(counters, 0) + 1))
    u = tf.cast(tf.bitwise.right_shift(bits, 8), tf.float32) * 2.0 ** -24
    return tf.reshape(u, [-1] + list(shape))


def normal(keys: tf.Tensor, shape: list[int]) -> tf.Tensor:
    """float32 [b, *shape] standard normals: Box-Muller on two uniforms per element."""
    n = math.prod(shape)
    u = uniform(keys, [2, n])
    u1, u2 = 1.0 - u[:, 0], u[:, 1]                     # u1 in (0, 1]: log(u1) finite
    z = tf.sqrt(-2.0 * tf.math.log(u1)) * tf.cos(2.0 * math.pi * u2)
    return tf.reshape(z, [-1] + list(shape))


def positions(batch: int) -> tf.Tensor:
    return tf.range(batch, dtype=tf.int64)


# ------------------------------------------------------------------------------------------- objective

def pack(x: tf.Tensor) -> tf.Tensor:
    """[b, c, (h 2), (w 2)] -> [b, (h w), (c 2 2)] (einops "b c (h ph) (w pw) -> b (h w) (c ph pw)")."""
    b, c, hh, ww = x.shape
    x = tf.reshape(x, [-1, c, hh // 2, 2, ww // 2, 2])
    return tf.reshape(tf.transpose(x, [0, 2, 4, 1, 3, 5]), [-1, (hh // 2) * (ww // 2), c * 4])


def unpack(x: tf.Tensor, channels: int, size: int) -> tf.Tensor:
    """The inverse of `pack`: [b, (h w), (c 2 2)] -> [b, c, (h 2), (w 2)]."""
    g = size // 2
    x = tf.reshape(x, [-1, g, g, channels, 2, 2])
    return tf.reshape(tf.transpose(x, [0, 3, 1, 4, 2, 5]), [-1, channels, size, size])


def timesteps(u: tf.Tensor) -> tf.Tensor:
    """t = u (finite float32) rounded to bfloat16 (round to nearest even, as torch's .to(bfloat16)), as float32.

    Rounded on the bits (add 0x7FFF plus the lowest kept bit, clear the low 16), not by a float32 -> bfloat16
    -> float32 cast pair, which XLA may drop where excess precision is allowed, its default (the
    simplify-fp-conversions pass, openxla/xla xla/hlo/transforms/simplifiers/simplify_fp_conversions.h): t
    would go unrounded. Not what made this CPU's XLA step differ (the loop's TF-random seed did), but no
    compiler may fold integer ops away."""
    bits = tf.bitcast(tf.cast(u, tf.float32), tf.int32)
    bits += 0x7FFF + tf.bitwise.bitwise_and(tf.bitwise.right_shift(bits, 16), 1)
    return tf.bitcast(tf.bitwise.bitwise_and(bits, -0x10000), tf.float32)


def latents(mean: tf.Tensor, logvar: tf.Tensor, eps: tf.Tensor, shift: float, scale: float,
            dtype: tf.DType) -> tf.Tensor:
    """x0 = (mean + exp(0.5 logvar) eps - shift) * scale in `dtype` (torchtitan
    generate_unscaled_latent_from_mean_logvar, then the autoencoder shift and scale)."""
    mean, logvar, eps = (tf.cast(a, dtype) for a in (mean, logvar, eps))
    z = mean + tf.exp(tf.cast(0.5, dtype) * logvar) * eps
    return (z - tf.cast(shift, dtype)) * tf.cast(scale, dtype)


def interpolate(x0: tf.Tensor, noise: tf.Tensor, t: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """(x_t, target) = ((1 - t) x0 + t noise, noise - x0) in x0's dtype; t [b] float32."""
    tt = tf.reshape(tf.cast(t, x0.dtype), [-1] + [1] * (len(x0.shape) - 1))
    noise = tf.cast(noise, x0.dtype)
    return (1.0 - tt) * x0 + tt * noise, noise - x0


def per_sample_loss(pred: tf.Tensor, target: tf.Tensor) -> tf.Tensor:
    """float32 [b]: each sample's mean squared error over its latent elements."""
    err = tf.square(tf.cast(pred, tf.float32) - tf.cast(target, tf.float32))
    return tf.reduce_mean(tf.reshape(err, [tf.shape(err)[0], -1]), 1)
