"""LARS, SGD, the Adam family and the learning-rate schedules against values computed by hand."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from harness.config import RuntimeConfig
from harness.nn.layers import constant
from harness.nn.optim import (LARS, Adam, AdamW, SGDMomentum, TF1Momentum, poly_warmup_schedule, rsqrt_warmup_schedule,
                          warmup_step_decay_schedule)
from harness.runtime import make_runtime

pytestmark = pytest.mark.quick


def lr_at(schedule, step: int) -> float:
    return float(schedule(tf.constant(step, tf.int64)))


def test_poly_warmup_schedule_by_hand():
    s = poly_warmup_schedule(base_lr=10.0, warmup_steps=4, decay_steps=10, end_lr=1e-4, power=2)
    assert lr_at(s, 0) == 0.0
    assert lr_at(s, 2) == pytest.approx(5.0)
    assert lr_at(s, 4) == pytest.approx(10.0)
    # 5 of 10 decay steps done: end + (base - end) * (1 - 0.5)^2
    assert lr_at(s, 9) == pytest.approx(1e-4 + (10.0 - 1e-4) * 0.25)
    assert lr_at(s, 14) == pytest.approx(1e-4)
    assert lr_at(s, 1000) == pytest.approx(1e-4)


def test_rsqrt_schedule_by_hand():
    # C * d^-0.5 * min(1, s/W) * max(s, W)^-0.5 with s = optimizer step + 1 (the update's number).
    s = rsqrt_warmup_schedule(base_lr=2.0, warmup_steps=100, hidden_size=16)
    assert lr_at(s, 0) == pytest.approx(2.0 / 4 * (1 / 100) / 10)   # the first update is not wasted at 0
    assert lr_at(s, 49) == pytest.approx(2.0 / 4 * 50 * 100 ** -1.5)
    assert lr_at(s, 99) == pytest.approx(2.0 / 4 / 10)              # the peak C / sqrt(d W)
    assert lr_at(s, 399) == pytest.approx(2.0 / 4 / 20)


def test_ssd_warmup_step_decay_schedule_by_hand():
    # Update `it` (from 0) during warmup: base - (W - it) * base / (W * 2^factor); then x0.1 per boundary reached.
    s = warmup_step_decay_schedule(base_lr=0.08, warmup_steps=4, warmup_factor=0, boundaries=[10, 20])
    assert lr_at(s, 0) == 0.0                                      # factor 0 ramps from zero, as the reference
    assert lr_at(s, 2) == pytest.approx(0.04)
    assert lr_at(s, 3) == pytest.approx(0.06)                      # W updates below base
    assert lr_at(s, 4) == pytest.approx(0.08)
    assert lr_at(s, 9) == pytest.approx(0.08)
    assert lr_at(s, 10) == pytest.approx(0.008)                    # from the boundary step on
    assert lr_at(s, 20) == pytest.approx(0.0008)
    half = warmup_step_decay_schedule(base_lr=0.08, warmup_steps=4, warmup_factor=1, boundaries=[])
    assert lr_at(half, 0) == pytest.approx(0.04)                   # factor 1 starts halfway up


@pytest.fixture(scope="module")
def runtime():
    return make_runtime(RuntimeConfig(kind="default"))


def make_vars(runtime, prefix: str):
    w = runtime.variable(f"{prefix}/dense/kernel", (2,), (None,), lambda s, d: tf.constant([3.0, 4.0]))
    b = runtime.variable(f"{prefix}/bn/gamma", (2,), (None,), constant(1.0))
    return [runtime.variables()[-2], runtime.variables()[-1]], w, b


def test_lars_two_steps_by_hand(runtime):
    infos, w, b = make_vars(runtime, "lars")
    const_lr = lambda step: tf.constant(2.0)  # noqa: E731
    opt = LARS(runtime, infos, const_lr, weight_decay=0.01, exclude_from_decay=[r"/bn/"], momentum=0.9,
               eta=0.001, epsilon=0.0, name="opt_lars")
    opt.build()
    g_w, g_b = np.array([0.6, 0.8]), np.array([0.5, -0.5])
    w_ref, b_ref = np.array([3.0, 4.0]), np.array([1.0, 1.0])
    v_w, v_b = np.zeros(2), np.zeros(2)
    for step in range(2):
        opt.apply([tf.constant(g_w, tf.float32), tf.constant(g_b, tf.float32)])
        if step == 0:
            # By hand: trust = 0.001 * 5 / (1 + 0.01 * 5) = 0.005 / 1.05; v = 2 * trust * (g + 0.01 w)
            np.testing.assert_allclose(w.numpy(), [3.0 - 2 * 0.005 / 1.05 * 0.63,
                                                   4.0 - 2 * 0.005 / 1.05 * 0.84], rtol=1e-6)
        trust = 0.001 * np.linalg.norm(w_ref) / (np.linalg.norm(g_w) + 0.01 * np.linalg.norm(w_ref))
        v_w = 0.9 * v_w + 2.0 * trust * (g_w + 0.01 * w_ref)
        w_ref = w_ref - v_w
        v_b = 0.9 * v_b + 2.0 * g_b        # batch norm: no decay, no trust ratio
        b_ref = b_ref - v_b
    np.testing.assert_allclose(w.numpy(), w_ref, rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), b_ref, rtol=1e-6)
    assert int(opt.step.numpy()) == 2


def test_lars_trust_ratio_is_one_for_zero_norms(runtime):
    infos, w, _ = make_vars(runtime, "lars0")
    opt = LARS(runtime, infos, lambda s: tf.constant(1.0), weight_decay=0.0, eta=0.001)
    assert float(opt.trust_ratio(tf.zeros(2), tf.ones(2))) == 1.0
    assert float(opt.trust_ratio(tf.ones(2), tf.zeros(2))) == 1.0


def reference_sgd(w, b, grads, lrs, wd, momentum):
    """Numpy rendering of the MLPerf ResNet TF2 reference's SGD step: the loss gains
    wd * 2 * l2_loss(w) for non-'bn' variables (gradient 2 * wd * w), and Keras SGD keeps
    velocity v = momentum * v - lr * g, then w = w + v."""
    v_w, v_b = np.zeros_like(w), np.zeros_like(b)
    for (g_w, g_b), lr in zip(grads, lrs):
        v_w = momentum * v_w - lr * (g_w + 2 * wd * w)
        w = w + v_w
        v_b = momentum * v_b - lr * g_b            # 'bn' in the name: no L2 term
        b = b + v_b
    return w, b


def test_sgd_momentum_matches_the_reference_update(runtime):
    infos, w, b = make_vars(runtime, "sgd")
    # A changing rate (as during warmup/decay) separates Keras' lr-in-velocity from PyTorch-style SGD.
    schedule = lambda step: 0.1 * tf.cast(step + 1, tf.float32)  # noqa: E731
    opt = SGDMomentum(runtime, infos, schedule, weight_decay=0.05, exclude_from_decay=[r"/bn/"],
                      momentum=0.9, name="opt_sgd")
    opt.build()
    rng = np.random.default_rng(0)
    grads = [(rng.normal(size=2), rng.normal(size=2)) for _ in range(4)]
    for g_w, g_b in grads:
        opt.apply([tf.constant(g_w, tf.float32), tf.constant(g_b, tf.float32)])
    w_ref, b_ref = reference_sgd(np.array([3.0, 4.0]), np.array([1.0, 1.0]), grads,
                                 [0.1, 0.2, 0.3, 0.4], wd=0.05, momentum=0.9)
    np.testing.assert_allclose(w.numpy(), w_ref, rtol=1e-5)
    np.testing.assert_allclose(b.numpy(), b_ref, rtol=1e-5)
    # The defects this pins: half the decay, or the rate applied outside the velocity, are far off.
    w_half, _ = reference_sgd(np.array([3.0, 4.0]), np.array([1.0, 1.0]), grads, [0.1, 0.2, 0.3, 0.4],
                              wd=0.025, momentum=0.9)
    assert np.abs(w.numpy() - w_half).max() > 1e-3
    assert int(opt.step.numpy()) == 4


def test_tf1_momentum_matches_the_pytorch_reference_sgd(runtime):
    infos, w, b = make_vars(runtime, "tf1m")
    schedule = lambda step: 0.1 * tf.cast(step + 1, tf.float32)  # noqa: E731
    opt = TF1Momentum(runtime, infos, schedule, weight_decay=0.05, momentum=0.9, name="opt_tf1m")
    opt.build()
    rng = np.random.default_rng(1)
    grads = [(rng.normal(size=2), rng.normal(size=2)) for _ in range(4)]
    for g_w, g_b in grads:
        opt.apply([tf.constant(g_w, tf.float32), tf.constant(g_b, tf.float32)])
    # torch.optim.SGD(momentum=0.9, weight_decay=0.05): g += wd * w; buf = m * buf + g; w -= lr * buf.
    params, bufs = [np.array([3.0, 4.0]), np.array([1.0, 1.0])], [np.zeros(2), np.zeros(2)]
    for lr, step_grads in zip([0.1, 0.2, 0.3, 0.4], grads):
        for k, g in enumerate(step_grads):
            bufs[k] = 0.9 * bufs[k] + g + 0.05 * params[k]
            params[k] = params[k] - lr * bufs[k]
    np.testing.assert_allclose(w.numpy(), params[0], rtol=1e-5)
    np.testing.assert_allclose(b.numpy(), params[1], rtol=1e-5)   # decay on every variable, bn included


def test_adam_matches_numpy_tf1_form(runtime):
    """TF1 Adam (the Transformer reference's LazyAdam on dense gradients), epsilon-hat form, 3 steps."""
    w = runtime.variable("adam/dense/kernel", (3,), (None,), lambda s, d: tf.constant([0.5, -1.0, 2.0]))
    opt = Adam(runtime, [runtime.variables()[-1]], lambda step: tf.constant(0.1), beta_1=0.9, beta_2=0.997,
               epsilon=1e-9, name="opt_adam")
    opt.build()
    ref, m, v = np.array([0.5, -1.0, 2.0]), np.zeros(3), np.zeros(3)
    for t, g in enumerate(([0.1, -0.2, 0.3], [0.0, 0.5, -0.1], [1.0, 1.0, 1.0]), start=1):
        g = np.array(g)
        opt.apply([tf.constant(g, tf.float32)])
        m = 0.9 * m + 0.1 * g
        v = 0.997 * v + 0.003 * g * g
        ref = ref - 0.1 * np.sqrt(1 - 0.997 ** t) / (1 - 0.9 ** t) * m / (np.sqrt(v) + 1e-9)
        np.testing.assert_allclose(w.numpy(), ref, rtol=1e-5)
    assert int(opt.step.numpy()) == 3


def test_adamw_matches_numpy_with_decoupled_decay(runtime):
    """torch.optim.AdamW's rule: bias-corrected moments, decay outside the moments, none on norm weights."""
    w = runtime.variable("adamw/dense/kernel", (3,), (None,), lambda s, d: tf.constant([0.5, -1.0, 2.0]))
    n = runtime.variable("adamw/norm/scale", (2,), (None,), lambda s, d: tf.constant([1.0, 2.0]))
    opt = AdamW(runtime, runtime.variables()[-2:], lambda step: tf.constant(0.01), beta_1=0.9, beta_2=0.95,
                epsilon=1e-5, weight_decay=0.1, exclude_from_decay=["norm"], name="opt_adamw")
    opt.build()
    refs = [np.array([0.5, -1.0, 2.0]), np.array([1.0, 2.0])]
    ms, vs = [np.zeros(3), np.zeros(2)], [np.zeros(3), np.zeros(2)]
    for t, grads in enumerate((([0.1, -0.2, 0.3], [0.5, -0.5]), ([0.0, 0.5, -0.1], [1.0, 0.0])), start=1):
        opt.apply([tf.constant(g, tf.float32) for g in grads])
        for k, g in enumerate(grads):
            g = np.array(g)
            ms[k] = 0.9 * ms[k] + 0.1 * g
            vs[k] = 0.95 * vs[k] + 0.05 * g * g
            u = (ms[k] / (1 - 0.9 ** t)) / (np.sqrt(vs[k] / (1 - 0.95 ** t)) + 1e-5)
            refs[k] = refs[k] - 0.01 * (u + (0.1 * refs[k] if k == 0 else 0.0))
        np.testing.assert_allclose(w.numpy(), refs[0], rtol=1e-5)
        np.testing.assert_allclose(n.numpy(), refs[1], rtol=1e-5)
