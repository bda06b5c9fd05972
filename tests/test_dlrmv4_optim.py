"""dlrmv4's optimizers against numpy: FBGEMM's exact row-wise Adagrad (one accumulator per row, the mean of
the squared summed gradient over the row's dims, only rows the step touched) and torch.optim.Adam's update
with betas (0.95, 0.999), both under one step counter and learning rate (harness.nn.optim.Partitioned)."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from harness.config import RuntimeConfig
from harness.nn.optim import AdamW, Partitioned, RowWiseAdagrad
from harness.runtime import make_runtime

EPS = 1e-8


def rowwise_adagrad_numpy(w, acc, ids, grads, lr):
    """FBGEMM EXACT_ROWWISE_ADAGRAD written out: sum each row's gradients, then one update per distinct row."""
    w, acc = w.copy(), acc.copy()
    for r in np.unique(ids):
        g = grads[ids == r].sum(axis=0)
        acc[r] += np.mean(g * g)
        w[r] -= lr * g / (np.sqrt(acc[r]) + EPS)
    return w, acc


def torch_adam_numpy(w, m, v, g, lr, t, b1=0.95, b2=0.999):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    denom = np.sqrt(v) / np.sqrt(1 - b2 ** t) + EPS
    return w - lr / (1 - b1 ** t) * m / denom, m, v


@pytest.fixture(scope="module")
def setup():
    rt = make_runtime(RuntimeConfig(precision="float32"))
    rng = np.random.default_rng(3)
    table0 = rng.normal(size=(10, 4)).astype(np.float32)
    dense0 = rng.normal(size=(3, 2)).astype(np.float32)
    with rt.scope():
        rt.variable("table", (10, 4), ("rows", None), lambda s, d: tf.constant(table0))
        rt.variable("dense", (3, 2), (None, None), lambda s, d: tf.constant(dense0))
    infos = {v.path: v for v in rt.variables(True)}
    schedule = lambda step: 0.1 * tf.cast(step + 1, tf.float32)  # noqa: E731  a different rate per step
    sparse = RowWiseAdagrad(rt, [infos["table"]], schedule, name="sparse")
    adam = AdamW(rt, [infos["dense"]], schedule, beta_1=0.95, beta_2=0.999, epsilon=EPS, name="dense")
    opt = Partitioned(rt, [adam, sparse], schedule)
    with rt.scope():
        opt.build()
    return rt, opt, infos, table0, dense0, rng


def test_rowwise_adagrad_and_adam_match_numpy(setup):
    rt, opt, infos, table, dense, rng = setup
    acc, m, v = np.zeros(10, np.float32), np.zeros_like(dense), np.zeros_like(dense)
    for t, ids in enumerate([np.array([1, 4, 1, 7, 1]), np.array([4, 9, 9]), np.array([0, 1])], start=1):
        lr = 0.1 * t
        g_rows = rng.normal(size=(len(ids), 4)).astype(np.float32)
        g_dense = rng.normal(size=dense.shape).astype(np.float32)
        if t == 2:  # a dense table gradient (what the loop hands over after all-reducing) must do the same
            sparse_grad = tf.math.unsorted_segment_sum(g_rows, ids, 10)
        else:
            sparse_grad = tf.IndexedSlices(tf.constant(g_rows), tf.constant(ids), tf.constant([10, 4]))
        used = opt.apply([tf.constant(g_dense), sparse_grad])
        np.testing.assert_allclose(float(used), lr, rtol=1e-6)
        table, acc = rowwise_adagrad_numpy(table, acc, ids, g_rows, lr)
        dense, m, v = torch_adam_numpy(dense, m, v, g_dense, lr, t)
        np.testing.assert_allclose(infos["table"].variable.numpy(), table, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(opt.parts[1].slots["accumulator"][0].numpy(), acc, rtol=1e-5)
        np.testing.assert_allclose(infos["dense"].variable.numpy(), dense, rtol=1e-5, atol=1e-5)
    untouched = [r for r in range(10) if r not in (0, 1, 4, 7, 9)]
    assert np.all(opt.parts[1].slots["accumulator"][0].numpy()[untouched] == 0.0)
    assert int(opt.step.numpy()) == 3

