"""The decoder LMs' blockwise cross-entropy (harness/nn/cross_entropy.py) against an independent float64 NumPy
log-softmax and against autodiff of the whole-logits formulation it replaced: losses and gradients, in one
block and in several, eager and under XLA, float32 and bfloat16, on one device and on a vocab-split mesh
(tests/helpers/xent_mesh.py, 4 logical CPUs in a subprocess)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import REPO
from harness.nn.cross_entropy import BLOCK_ELEMENTS, KEEP_ELEMENTS, block_length, token_cross_entropy
from tests.helpers.xent_mesh import inputs


class OneDevice:
    def shards(self, dim: str) -> int:
        return 1

    def place(self, t: tf.Tensor, dims) -> tf.Tensor:
        return t


def numpy_reference(case: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Loss [b, s], d(sum loss * dy)/dx and /dw in float64, from the definition."""
    x, w, t, dy = (case[k].astype(np.float64) if k != "targets" else case[k] for k in ("x", "w", "targets", "dy"))
    z = np.einsum("bsm,mv->bsv", x, w)
    z = z - z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    hot = np.eye(w.shape[1])[t]
    loss = -(logp * hot).sum(-1)
    dz = (np.exp(logp) - hot) * dy[..., None]
    return loss, np.einsum("bsv,mv->bsm", dz, w), np.einsum("bsm,bsv->mv", x, dz)


def one_hot_formulation(x, w, targets):
    """The loss this module replaced: whole logits, logsumexp minus a one-hot product."""
    z = tf.cast(tf.einsum("bsm,mv->bsv", x, w), tf.float32)
    return tf.reduce_logsumexp(z, -1) - tf.reduce_sum(z * tf.one_hot(targets, w.shape[-1]), -1)


def loss_and_grads(fn, case: dict, dtype, jit: bool):
    @tf.function(jit_compile=jit)
    def step(x, w):
        with tf.GradientTape() as tape:
            tape.watch([x, w])
            loss = fn(tf.cast(x, dtype), tf.cast(w, dtype), tf.constant(case["targets"]))
            total = tf.reduce_sum(loss * case["dy"])
        return [loss, *tape.gradient(total, [x, w])]
    return [t.numpy().astype(np.float64) for t in step(tf.constant(case["x"]), tf.constant(case["w"]))]


@pytest.mark.quick
def test_block_length_is_the_longest_divisor_in_budget():
    assert block_length(8, 1024, 128256, budget=2 ** 26) == 64  # 8 x 64 x 128,256 = 65.7M <= 2**26
    assert block_length(8, 1024, 128256, budget=8 * 1024 * 128256) == 1024
    assert block_length(4, 12, 40, budget=4 * 5 * 40) == 4    # 5 does not divide 12
    assert block_length(1, 7, 10 ** 9) == 1                   # nothing fits: one position at a time
    assert 8 * block_length(8, 8192, 128256) * 128256 <= BLOCK_ELEMENTS < KEEP_ELEMENTS


@pytest.mark.quick
@pytest.mark.parametrize("blocks", ["kept", 1, 3, 12])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "xla"])
def test_one_device_equals_the_definition_float32(blocks, jit):
    """"kept": one block whose softmax the backward reuses; a number: that many blocks, recomputed."""
    case = inputs()
    b, s, _ = case["x"].shape
    v = case["w"].shape[1]
    budget, keep = (b * s * v, b * s * v) if blocks == "kept" else (b * (s // blocks) * v, 0)
    if blocks != "kept":
        assert s // block_length(b, s, v, budget) == blocks
    got = loss_and_grads(lambda x, w, t: token_cross_entropy(OneDevice(), x, w, t, budget, keep), case, tf.float32,
                         jit)
    for g, want in zip(got, numpy_reference(case)):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-5)


@pytest.mark.quick
@pytest.mark.parametrize("keep", [True, False], ids=["kept", "recomputed"])
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "xla"])
def test_one_device_bfloat16_equals_the_one_hot_formulation(jit, keep):
    case = inputs()
    b, s, _ = case["x"].shape
    budget = b * 3 * case["w"].shape[1]
    got = loss_and_grads(lambda x, w, t: token_cross_entropy(OneDevice(), x, w, t, budget, 10 ** 9 if keep else 0),
                         case, tf.bfloat16, jit)
    old = loss_and_grads(one_hot_formulation, case, tf.bfloat16, jit)
    for g, want, ref in zip(got, old, numpy_reference(case)):
        # Both bfloat16 computations: as close to each other as to the float64 truth they approximate.
        scale = np.abs(ref).max()
        assert np.abs(g - ref).max() <= 0.05 * scale
        np.testing.assert_allclose(g, want, atol=0.05 * scale)


@pytest.mark.quick
@pytest.mark.parametrize("keep", [True, False], ids=["kept", "recomputed"])
def test_bfloat16_head_gradient_of_a_frequent_target_is_summed_in_float32(keep):
    """2,048 positions that all have the same target: the head's gradient column of that id sums 2,048
    terms, which a bfloat16 running sum (e.g. a gather's gradient) stops growing at ~256 of them."""
    rng = np.random.default_rng(1)
    b, s, m, v = 2, 1024, 8, 40
    case = {"x": rng.normal(size=[b, s, m]).astype(np.float32), "w": rng.normal(size=[m, v]).astype(np.float32),
            "targets": np.zeros([b, s], np.int32), "dy": np.ones([b, s], np.float32)}
    budget = b * 256 * v
    got = loss_and_grads(lambda x, w, t: token_cross_entropy(OneDevice(), x, w, t, budget, 10 ** 9 if keep else 0),
                         case, tf.bfloat16, False)
    want = numpy_reference(case)
    column = want[2][:, 0]
    assert np.abs(got[2][:, 0] - column).max() <= 0.02 * np.abs(column).max()


def test_vocab_split_mesh_equals_the_definition():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    p = subprocess.run([sys.executable, os.path.join(REPO, "tests", "helpers", "xent_mesh.py")], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=600)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert p.returncode == 0 and line, p.stdout[-2000:] + p.stderr[-4000:]
    result = json.loads(line[-1][len("RESULT "):])
    want = numpy_reference(inputs())
    for name, g, ref in zip(("loss", "dx", "dw"), (result["float32"][k] for k in ("loss", "dx", "dw")), want):
        np.testing.assert_allclose(np.array(g), ref, rtol=1e-5, atol=1e-5, err_msg=name)
    for name, g, ref in zip(("loss", "dx", "dw"), (result["bfloat16"][k] for k in ("loss", "dx", "dw")), want):
        assert np.abs(np.array(g) - ref).max() <= 0.05 * np.abs(ref).max(), name
