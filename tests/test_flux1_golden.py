"""flux1's MMDiT and objective equal the reference implementation: a tiny FluxTransformer2DModel checkpoint
written by diffusers (tests/data/flux_golden/, made by scripts/make_flux_goldens.py with torch and diffusers,
which the harness never imports) loads through the harness's importer (diffusers layout, its name mapping) and
gives diffusers' prediction (within 1e-5 of max |pred|), rectified-flow loss (2e-6 relative) and gradients,
float32 on one device, from the uniform draws u the harness rounds to bfloat16 itself.

Each feature the reference has and a near miss lacks is shown to matter: with rotate-half RoPE instead of
adjacent pairs, with the modulation's shift and scale swapped, or with t not rounded to bfloat16, the same
comparison fails (each moves the numbers by far more than the tolerance).
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.flux1 import diffusers_names, flow, model as flux_model
from benchmarks.flux1.config import ModelConfig
from harness.nn import hf_checkpoint
from harness.runtime import distribute

from conftest import REPO


pytestmark = pytest.mark.quick

GOLDEN = os.path.join(REPO, "tests", "data", "flux_golden")
PRED_TOL = 1e-5   # of max |pred|
LOSS_RTOL = 2e-6


def tiny_config() -> ModelConfig:
    with open(os.path.join(GOLDEN, "golden.json")) as f:
        c = json.load(f)["config"]
    heads = c["num_attention_heads"]
    return ModelConfig(hidden_size=heads * c["attention_head_dim"], num_heads=heads, depth=c["num_layers"],
                       depth_single_blocks=c["num_single_layers"], axes_dim=list(c["axes_dims_rope"]),
                       in_channels=c["in_channels"], vec_in_dim=c["pooled_projection_dim"],
                       context_in_dim=c["joint_attention_dim"])


@pytest.fixture(scope="module")
def loaded():
    m = tiny_config()
    rt = distribute.make_default("float32", False)
    with rt.scope():
        model = flux_model.Flux(rt, "flux", 0, m)
    n = hf_checkpoint.load_into(rt, os.path.join(GOLDEN, "transformer"), diffusers_names.FORMAT, m)
    assert n == len(rt.variables())
    return rt, model, m, dict(np.load(os.path.join(GOLDEN, "io.npz")))


def forward(loaded, round_t: bool = True):
    """(pred, loss, gradients by variable path) as the harness computes them from the golden's draws."""
    rt, model, m, io = loaded
    u = tf.constant(io["u"])
    t = flow.timesteps(u) if round_t else u
    x0, noise = flow.pack(tf.constant(io["x0"])), flow.pack(tf.constant(io["noise"]))
    x_t, target = flow.interpolate(x0, noise, t)
    variables = [v.variable for v in rt.variables()]
    with tf.GradientTape() as tape:
        pred = model(x_t, tf.constant(io["t5"]), tf.constant(io["clip"]), t)
        loss = tf.reduce_mean(flow.per_sample_loss(pred, target))
    grads = dict(zip([v.path for v in rt.variables()], tape.gradient(loss, variables)))
    return pred.numpy(), float(loss), grads


def matches(loaded, pred, loss) -> bool:
    io = loaded[3]
    scale = np.abs(io["pred"]).max()
    want = float(io["loss"])
    return bool(np.abs(pred - io["pred"]).max() <= PRED_TOL * scale and abs(loss - want) <= LOSS_RTOL * want)


def test_prediction_loss_and_gradients_equal_diffusers(loaded):
    io = loaded[3]
    pred, loss, grads = forward(loaded)
    scale = np.abs(io["pred"]).max()
    assert scale > 1.0                                   # large enough for a relative tolerance to mean something
    np.testing.assert_allclose(pred, io["pred"], atol=PRED_TOL * scale, rtol=0)
    assert loss == pytest.approx(float(io["loss"]), rel=LOSS_RTOL)
    # the gradients, exported to diffusers' names through the layout's own inverse
    layout = diffusers_names.layout(loaded[2])
    outs = {o.name: o for o in layout.outs}
    names = [k[len("grad:"):] for k in io if k.startswith("grad:")]
    assert len(names) >= 8
    for name in names:
        o = outs[name]
        got = o.to_hf(*[grads[p].numpy() for p in o.paths])
        want = io[f"grad:{name}"]
        np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max() + 1e-7, rtol=0, err_msg=name)


def test_the_golden_fails_with_one_feature_changed(loaded, monkeypatch):
    """Rotate-half RoPE, the modulation's shift and scale swapped, t not rounded to bfloat16: each misses."""
    def rotate_half(x, cos, sin):
        b, s, h, d = x.shape
        xf = tf.cast(x, tf.float32)
        x1, x2 = xf[..., :d // 2], xf[..., d // 2:]
        c, n = tf.reshape(cos, [1, s, 1, d // 2]), tf.reshape(sin, [1, s, 1, d // 2])
        return tf.cast(tf.concat([x1 * c - x2 * n, x2 * c + x1 * n], -1), x.dtype)

    with monkeypatch.context() as mp:
        mp.setattr(flux_model, "apply_rope", rotate_half)
        assert not matches(loaded, *forward(loaded)[:2])

    original = flux_model.Modulation.__call__

    def shift_scale_swapped(self, vec):
        parts = original(self, vec)
        return [parts[1], parts[0]] + parts[2:]

    with monkeypatch.context() as mp:
        mp.setattr(flux_model.Modulation, "__call__", shift_scale_swapped)
        assert not matches(loaded, *forward(loaded)[:2])

    assert not matches(loaded, *forward(loaded, round_t=False)[:2])
    assert matches(loaded, *forward(loaded)[:2])         # and back: the model is as loaded
