"""Dynamic loss scaling for float16 compute (runtime.precision: float16).

float16 has 5 exponent bits: small gradients flush to zero unless the loss is multiplied by a large
scale before backprop, and the scale must drop when that overflows. The rule is the usual dynamic one:
a step whose all-reduced gradients are not all finite is skipped (no update, the step counter stays)
and halves the scale; `growth_steps` finite steps in a row double it. The scale and counters are
float32/int64 variables updated identically on every replica from all-reduced values.
"""
from __future__ import annotations

from typing import Sequence

import tensorflow as tf

from harness.nn.layers import constant
from harness.runtime.base import Runtime


class DynamicLossScale:
    def __init__(self, runtime: Runtime, initial: float = 2.0 ** 15, growth_steps: int = 2000,
                 factor: float = 2.0, minimum: float = 1.0, name: str = "loss_scale") -> None:
        self.growth_steps = int(growth_steps)
        self.factor = float(factor)
        self.minimum = float(minimum)
        self.initial = float(initial)
        self.scale = runtime.variable(f"{name}/scale", (), (), constant(float(initial)), trainable=False)
        self.good_steps = runtime.variable(f"{name}/good_steps", (), (), constant(0), trainable=False,
                                           dtype=tf.int64)
        self.skipped = runtime.variable(f"{name}/skipped_steps", (), (), constant(0), trainable=False,
                                        dtype=tf.int64)

    def unscale(self, grads: Sequence[tf.Tensor], scale: tf.Tensor) -> tuple[list[tf.Tensor], tf.Tensor]:
        """All-reduced scaled gradients -> (gradients / scale, whether all are finite)."""
        inv = 1.0 / scale
        grads = [tf.cast(g, tf.float32) * inv for g in grads]
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
        return grads, finite

    def update(self, finite: tf.Tensor, scale: tf.Tensor) -> None:
        """In replica context, after the (possibly skipped) step: adjusts the scale and counters."""
        good = self.good_steps.read_value()
        grow = tf.logical_and(finite, good + 1 >= self.growth_steps)
        new_scale = tf.where(finite, tf.where(grow, scale * self.factor, scale),
                             tf.maximum(scale / self.factor, self.minimum))
        self.scale.assign(new_scale)
        self.good_steps.assign(tf.where(finite, tf.where(grow, tf.zeros_like(good), good + 1),
                                        tf.zeros_like(good)))
        self.skipped.assign_add(tf.where(finite, tf.constant(0, tf.int64), tf.constant(1, tf.int64)))
