"""Optimizers and learning-rate schedules, written out so MLPerf's exact update rules are visible.

Updates are read-once: each new slot value is computed once, assigned, and the computed tensor (never a
re-read of the variable) feeds the weight update. Under DTensor, reading a variable after assigning it in
the same tf.function can return stale values. Slots are created by `build`, before the first step.
"""
from __future__ import annotations

import math
import re
from typing import Callable, Sequence

import tensorflow as tf

from harness.runtime.base import Runtime, VariableInfo
from harness.nn.layers import constant

Schedule = Callable[[tf.Tensor], tf.Tensor]


# ------------------------------------------------------------------------------------- schedules

def poly_warmup_schedule(base_lr: float, warmup_steps: int, decay_steps: int, end_lr: float,
                         power: float, warmup_start_lr: float = 0.0) -> Schedule:
    """Linear warmup from `warmup_start_lr` to `base_lr`, then polynomial decay to `end_lr` over
    `decay_steps` steps (MLPerf ResNet LARS and BERT LAMB); constant `end_lr` afterwards."""
    def lr(step: tf.Tensor) -> tf.Tensor:
        step = tf.cast(step, tf.float32)
        warm = warmup_start_lr + (base_lr - warmup_start_lr) * step / max(warmup_steps, 1)
        progress = tf.minimum(tf.maximum(step - warmup_steps, 0.0) / max(decay_steps, 1), 1.0)
        decayed = end_lr + (base_lr - end_lr) * tf.pow(1.0 - progress, power)
        return tf.where(step < warmup_steps, warm, decayed)
    return lr


def rsqrt_warmup_schedule(base_lr: float, warmup_steps: int, hidden_size: int) -> Schedule:
    """Transformer's schedule, C * d^-0.5 * min(1, s / W) * max(s, W)^-0.5 (the MLPerf reference's
    `get_learning_rate`; the Noam form). `s` is the number of the update being made, counted from 1:
    the reference's first update reads step 0 and so has rate 0, a wasted step this skips."""
    def lr(step: tf.Tensor) -> tf.Tensor:
        s = tf.cast(step, tf.float32) + 1.0
        w = float(max(warmup_steps, 1))
        return base_lr * hidden_size ** -0.5 * tf.minimum(1.0, s / w) * tf.math.rsqrt(tf.maximum(s, w))
    return lr


def warmup_step_decay_schedule(base_lr: float, warmup_steps: int, warmup_factor: int,
                               boundaries: Sequence[int], decay: float = 0.1) -> Schedule:
    """MLPerf SSD's schedule: the "mlperf warmup rule" lr = base - (W - it) * base / (W * 2^factor) for
    update it < W, counted from 0 as the reference does (factor 0: the first update runs at rate 0, its
    gradient still entering the momentum), then base times `decay` per boundary step reached.
    """
    def lr(step: tf.Tensor) -> tf.Tensor:
        it = tf.cast(step, tf.float32)
        value = tf.constant(base_lr, tf.float32)
        for b in boundaries:
            value = tf.where(it >= b, value * decay, value)
        if warmup_steps:
            w = float(warmup_steps)
            warm = base_lr - (w - it) * base_lr / (w * 2.0 ** warmup_factor)
            value = tf.where(it < w, warm, value)
        return value
    return lr


# ------------------------------------------------------------------------------------ optimizers

class Optimizer:
    """Base: owns the step counter and slot variables; `apply` runs in replica context."""

    slot_names: tuple[str, ...] = ()

    def __init__(self, runtime: Runtime, variables: Sequence[VariableInfo], schedule: Schedule,
                 weight_decay: float = 0.0, exclude_from_decay: Sequence[str] = (),
                 name: str = "optimizer") -> None:
        self.runtime = runtime
        self.name = name
        self.params = list(variables)
        self.schedule = schedule
        self.weight_decay = weight_decay
        self._exclude = [re.compile(p) for p in exclude_from_decay]
        self.slots: dict[str, list[tf.Variable]] = {}
        self.step: tf.Variable | None = None

    def excluded(self, path: str) -> bool:
        """Batch norm, layer norm and bias weights get neither weight decay nor layer-wise adaptation."""
        return any(p.search(path) for p in self._exclude)

    def build(self) -> None:
        self.step = self.runtime.variable(f"{self.name}/step", (), (), constant(0), trainable=False,
                                          dtype=tf.int64)
        self.build_slots()

    def build_slots(self) -> None:
        """One slot per weight and slot name, shaped as the weight (zeros)."""
        for name in self.slot_names:
            self.slots[name] = [
                self.runtime.variable(f"{self.name}/{name}/{p.path}", p.shape, p.dims, constant(0.0),
                                      trainable=False)
                for p in self.params]

    def learning_rate(self) -> tf.Tensor:
        return self.schedule(self.step)

    def apply(self, grads: Sequence[tf.Tensor]) -> tf.Tensor:
        """Applies all-reduced gradients; returns the learning rate used."""
        step = self.step.read_value()
        lr = self.schedule(step)
        self.prepare(step, lr)
        for i, (p, g) in enumerate(zip(self.params, grads)):
            self.update(i, p, tf.cast(g, tf.float32), lr)
        self.step.assign(step + 1)
        return lr

    def prepare(self, step: tf.Tensor, lr: tf.Tensor) -> None:
        """Per-step values shared by every weight's update (bias corrections), computed once."""
        return None  # a statement: AutoGraph cannot convert a body that is only a docstring

    def update(self, i: int, p: VariableInfo, g: tf.Tensor, lr: tf.Tensor) -> None:
        raise NotImplementedError


class AdaptiveMoments(Optimizer):
    """Base of the Adam family: first and second moment slots and their bias-corrected ratio."""

    slot_names = ("m", "v")

    def __init__(self, *args, beta_1: float, beta_2: float, epsilon: float, bias_correction: bool = True,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
        self.bias_correction = bias_correction

    def prepare(self, step: tf.Tensor, lr: tf.Tensor) -> None:
        t = tf.cast(step + 1, tf.float32)
        self._c1 = 1.0 - tf.pow(self.beta_1, t) if self.bias_correction else 1.0
        self._c2 = 1.0 - tf.pow(self.beta_2, t) if self.bias_correction else 1.0

    def moments(self, i: int, g: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2, stored and returned."""
        m = self.beta_1 * self.slots["m"][i].read_value() + (1.0 - self.beta_1) * g
        v = self.beta_2 * self.slots["v"][i].read_value() + (1.0 - self.beta_2) * tf.square(g)
        self.slots["m"][i].assign(m)
        self.slots["v"][i].assign(v)
        return m, v

    def direction(self, i: int, g: tf.Tensor) -> tf.Tensor:
        """m_hat / (sqrt(v_hat) + eps), with this step's bias corrections."""
        m, v = self.moments(i, g)
        return (m / self._c1) / (tf.sqrt(v / self._c2) + self.epsilon)


class SGDMomentum(Optimizer):
    """Momentum SGD as the MLPerf ResNet TF2 reference runs it (Keras SGD plus an L2 loss term).

    The reference adds `weight_decay * 2 * sum(tf.nn.l2_loss(w))` = wd * sum(w^2) to the loss for every
    variable not excluded (its rule: names without 'bn'), so the gradient gains 2 * wd * w; the logged
    `sgd_opt_weight_decay` is that wd. Keras SGD folds the learning rate into the velocity:
    v = m * v + lr * g, w -= v (not PyTorch's v = m * v + g, w -= lr * v, which differs while lr changes).
    """

    slot_names = ("momentum",)

    def __init__(self, *args, momentum: float = 0.9, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.momentum = momentum

    def update(self, i, p, g, lr) -> None:
        w = p.variable.read_value()
        if self.weight_decay and not self.excluded(p.path):
            g = g + 2.0 * self.weight_decay * w
        v = self.momentum * self.slots["momentum"][i].read_value() + lr * g
        self.slots["momentum"][i].assign(v)
        p.variable.assign(w - v)


class TF1Momentum(Optimizer):
    """tf.train.MomentumOptimizer with weight decay added to the gradient: g += wd * w,
    v = m * v + g, w -= lr * v (Google's v0.7 TF SSD; the same update as the PyTorch reference's SGD).

    The rules' allowed-optimizer table names this optimizer for TensorFlow. Unlike `SGDMomentum`, the
    rate multiplies the velocity, and the decay term is wd * w (no L2-loss factor of 2).
    """

    slot_names = ("momentum",)

    def __init__(self, *args, momentum: float = 0.9, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.momentum = momentum

    def update(self, i, p, g, lr) -> None:
        w = p.variable.read_value()
        if self.weight_decay and not self.excluded(p.path):
            g = g + self.weight_decay * w
        v = self.momentum * self.slots["momentum"][i].read_value() + g
        self.slots["momentum"][i].assign(v)
        p.variable.assign(w - lr * v)


class LARS(Optimizer):
    """Layer-wise adaptive rate scaling (You et al.), as in the MLPerf ResNet reference.

    For adapted weights: trust = eta * |w| / (|g| + wd * |w| + eps) (1 where either norm is 0),
    v = m * v + lr * trust * (g + wd * w), w -= v. Excluded weights (batch norm, bias): v = m * v + lr * g.
    """

    slot_names = ("momentum",)

    def __init__(self, *args, momentum: float = 0.9, eta: float = 0.001, epsilon: float = 0.0,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.momentum = momentum
        self.eta = eta
        self.epsilon = epsilon

    def trust_ratio(self, w: tf.Tensor, g: tf.Tensor) -> tf.Tensor:
        w_norm, g_norm = tf.norm(w), tf.norm(g)
        ratio = self.eta * w_norm / (g_norm + self.weight_decay * w_norm + self.epsilon)
        return tf.where(w_norm > 0, tf.where(g_norm > 0, ratio, 1.0), 1.0)

    def update(self, i, p, g, lr) -> None:
        w = p.variable.read_value()
        if self.excluded(p.path):
            scaled = lr * g
        else:
            scaled = lr * self.trust_ratio(w, g) * (g + self.weight_decay * w)
        v = self.momentum * self.slots["momentum"][i].read_value() + scaled
        self.slots["momentum"][i].assign(v)
        p.variable.assign(w - v)


class LAMB(AdaptiveMoments):
    """Layer-wise adaptive moments (You et al. 2019), as in the MLPerf BERT reference.

    m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; u = m_hat / (sqrt(v_hat) + eps) + wd * w (bias-corrected
    moments); w -= lr * trust * u, trust = |w| / |u| (1 where either is 0). Excluded weights (LayerNorm,
    bias) get neither weight decay nor the trust ratio.
    """

    def __init__(self, *args, beta_1: float = 0.9, beta_2: float = 0.999, epsilon: float = 1e-6,
                 bias_correction: bool = True, **kwargs) -> None:
        super().__init__(*args, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon,
                         bias_correction=bias_correction, **kwargs)

    def update(self, i, p, g, lr) -> None:
        w = p.variable.read_value()
        u = self.direction(i, g)
        if self.excluded(p.path):
            p.variable.assign(w - lr * u)
            return
        u = u + self.weight_decay * w
        w_norm, u_norm = tf.norm(w), tf.norm(u)
        trust = tf.where(w_norm > 0, tf.where(u_norm > 0, w_norm / u_norm, 1.0), 1.0)
        p.variable.assign(w - lr * trust * u)


class Adam(AdaptiveMoments):
    """Adam as the MLPerf Transformer reference runs it (TF1 LazyAdam, which is plain Adam for dense
    gradients), in TF1's "epsilon hat" form: lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t),
    w -= lr_t * m / (sqrt(v) + eps). No weight decay.
    """

    def __init__(self, *args, beta_1: float = 0.9, beta_2: float = 0.997, epsilon: float = 1e-9,
                 **kwargs) -> None:
        super().__init__(*args, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, **kwargs)

    def prepare(self, step: tf.Tensor, lr: tf.Tensor) -> None:
        t = tf.cast(step + 1, tf.float32)
        self._lr_t = lr * tf.sqrt(1.0 - tf.pow(self.beta_2, t)) / (1.0 - tf.pow(self.beta_1, t))

    def update(self, i, p, g, lr) -> None:
        m, v = self.moments(i, g)
        p.variable.assign(p.variable.read_value() - self._lr_t * m / (tf.sqrt(v) + self.epsilon))


def cosine_warmup_schedule(base_lr: float, end_lr: float, warmup_steps: int, decay_steps: int) -> Schedule:
    """Linear warmup from 0 to `base_lr` over `warmup_steps`, then a cosine from `base_lr` to `end_lr`
    over `decay_steps` (Megatron's "cosine with linear warmup"), `end_lr` after that."""
    def lr(step: tf.Tensor) -> tf.Tensor:
        s = tf.cast(step, tf.float32)
        warm = base_lr * s / float(max(warmup_steps, 1))
        frac = tf.clip_by_value((s - warmup_steps) / float(max(decay_steps, 1)), 0.0, 1.0)
        decayed = end_lr + (base_lr - end_lr) * 0.5 * (1.0 + tf.cos(math.pi * frac))
        return tf.where(s < float(warmup_steps), warm, decayed)
    return lr


class AdamW(AdaptiveMoments):
    """Adam with decoupled weight decay (Loshchilov & Hutter; torch.optim.AdamW as Megatron runs it):
    bias-corrected moments, w -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * w); excluded weights (norms,
    biases) get no decay."""

    def __init__(self, *args, beta_1: float = 0.9, beta_2: float = 0.95, epsilon: float = 1e-5,
                 **kwargs) -> None:
        super().__init__(*args, beta_1=beta_1, beta_2=beta_2, epsilon=epsilon, **kwargs)

    def update(self, i, p, g, lr) -> None:
        w = p.variable.read_value()
        u = self.direction(i, g)
        if not self.excluded(p.path):
            u = u + self.weight_decay * w
        p.variable.assign(w - lr * u)


class RowWiseAdagrad(Optimizer):
    """FBGEMM's exact row-wise Adagrad (EXACT_ROWWISE_ADAGRAD, weight decay 0), for embedding tables:
    one float32 accumulator per row. For each row r a step touched, with g_r its gradient summed over all
    of the step's lookups of r: G_r += mean_d(g_r,d^2); w_r -= lr * g_r / (sqrt(G_r) + eps). Rows the step
    did not touch keep weight and accumulator (pytorch/FBGEMM@00c10a03
    fbgemm_gpu/codegen/genscript/optimizers.py `rowwise_adagrad`).

    A gradient given as IndexedSlices (a gather's) updates only its distinct rows, each once from its summed
    slices. A dense gradient updates the whole table, which is the same arithmetic: an untouched row's zero
    gradient leaves its accumulator and weight as they were.
    """

    def __init__(self, *args, epsilon: float = 1e-8, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.epsilon = epsilon

    def build_slots(self) -> None:
        self.slots["accumulator"] = [
            self.runtime.variable(f"{self.name}/accumulator/{p.path}", p.shape[:1], p.dims[:1], constant(0.0),
                                  trainable=False)
            for p in self.params]

    def update(self, i, p, g, lr) -> None:
        acc = self.slots["accumulator"][i]
        if isinstance(g, tf.IndexedSlices):
            rows, index = tf.unique(g.indices)
            summed = tf.math.unsorted_segment_sum(g.values, index, tf.shape(rows)[0])
            new = tf.gather(acc.read_value(), rows) + tf.reduce_mean(tf.square(summed), axis=1)
            acc.scatter_update(tf.IndexedSlices(new, rows))
            step = lr * summed / (tf.sqrt(new)[:, None] + self.epsilon)
            p.variable.scatter_sub(tf.IndexedSlices(step, rows))
            return
        new = acc.read_value() + tf.reduce_mean(tf.square(g), axis=1)
        acc.assign(new)
        p.variable.assign(p.variable.read_value() - lr * g / (tf.sqrt(new)[:, None] + self.epsilon))


class Partitioned(Optimizer):
    """Disjoint groups of weights, each with its own optimizer, under one step counter and one learning
    rate (dlrmv4: Adam on the dense weights, row-wise Adagrad on the tables, the same warmup for both).
    `params` is the parts' weights in order, which is the order `apply` takes gradients in."""

    def __init__(self, runtime: Runtime, parts: Sequence[Optimizer], schedule: Schedule,
                 name: str = "optimizer") -> None:
        super().__init__(runtime, [p for part in parts for p in part.params], schedule, name=name)
        self.parts = list(parts)
        self._route = [(part, j) for part in self.parts for j in range(len(part.params))]

    def build(self) -> None:
        super().build()
        for part in self.parts:
            part.step = self.step
            part.build_slots()

    def apply(self, grads: Sequence[tf.Tensor]) -> tf.Tensor:
        step = self.step.read_value()
        lr = self.schedule(step)
        for part in self.parts:
            part.prepare(step, lr)
        for (part, j), g in zip(self._route, grads):
            part.update(j, part.params[j], tf.cast(g, tf.float32), lr)
        self.step.assign(step + 1)
        return lr
