"""benchmarks/qwen35_397b_grpo/deltanet.py: transformers' own Qwen3_5MoeGatedDeltaNet (tests/data/qwen35/, made by
scripts/make_qwen35_goldens.py in a side virtualenv, which the harness never imports) loaded through the layer's
transformers name mapping gives transformers' outputs: the 70-token forward in both forms (chunked and
recurrent), a left-padded batch with its mask, and a 37-token prefill followed by cached single-token
decoding. The two forms agree to float32 rounding on other shapes too (several chunks, an incoming state)."""
from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.qwen35_397b_grpo.deltanet import (HF_NAMES, DeltaNetShape, GatedDeltaNet, gated_delta_chunked,
                                                  gated_delta_recurrent, prepare_qkv)
from conftest import REPO
from harness.runtime import distribute

pytestmark = pytest.mark.quick

DATA = os.path.join(REPO, "tests", "data", "qwen35")
_spec = importlib.util.spec_from_file_location("make_qwen35_goldens",
                                               os.path.join(REPO, "scripts", "make_qwen35_goldens.py"))
goldens = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(goldens)  # NumPy only at import: the weights' and input's seeds


@pytest.fixture(scope="module")
def golden():
    with open(os.path.join(DATA, "deltanet_golden.json")) as f:
        meta = json.load(f)
    arrays = np.load(os.path.join(DATA, "deltanet_golden.npz"))
    c = meta["config"]
    shape = DeltaNetShape(c["hidden_size"], c["linear_num_key_heads"], c["linear_num_value_heads"],
                          c["linear_key_head_dim"], c["linear_value_head_dim"], c["linear_conv_kernel_dim"],
                          c["rms_norm_eps"])
    weights = goldens.golden_weights()
    runtime = distribute.make_default("float32", False)
    with runtime.scope():
        layer = GatedDeltaNet(runtime, "linear_attn", 0, shape)
    layer.load_hf(weights)
    return meta, arrays, layer, weights


def test_weights_and_names_are_the_ones_transformers_used(golden):
    meta, _, layer, weights = golden
    assert goldens.weights_digest(weights) == meta["weights_sha256"]
    assert set(meta["hf_names"]) == set(HF_NAMES)
    for name, hf_shape in meta["hf_names"].items():
        assert list(weights[name].shape) == hf_shape
    np.testing.assert_array_equal(layer.in_proj_qkv.numpy(), weights["in_proj_qkv.weight"].T)
    np.testing.assert_array_equal(layer.conv1d.numpy(), weights["conv1d.weight"][:, 0, :].T)


@pytest.mark.parametrize("form", ["chunked", "recurrent"])
def test_forward_equals_transformers(golden, form):
    meta, arrays, layer, _ = golden
    y, _ = layer.forward(tf.constant(goldens.golden_input()), form=form)
    np.testing.assert_allclose(y.numpy(), arrays["full"], rtol=1e-5, atol=2e-5)


def test_prefill_then_cached_decoding_equals_transformers(golden):
    meta, arrays, layer, _ = golden
    x = tf.constant(goldens.golden_input())
    prefill = meta["prefill"]
    y, state = layer.forward(x[:, :prefill], form="chunked")
    np.testing.assert_allclose(y.numpy(), arrays["full"][:, :prefill], rtol=1e-5, atol=2e-5)
    decoded = []
    for t in range(prefill, meta["length"]):
        y_t, state = layer.forward(x[:, t:t + 1], state, form="recurrent")
        decoded.append(y_t.numpy())
    np.testing.assert_allclose(np.concatenate(decoded, axis=1), arrays["decoded"], rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("length,chunk", [(29, 8), (16, 8), (5, 64)])
def test_chunked_equals_recurrent_with_an_incoming_state(length, chunk):
    rng = np.random.default_rng(length)
    b, hk, hv, dk, dv = 2, 1, 3, 5, 4
    q, k = (tf.constant(rng.normal(size=(b, length, hk, dk)).astype(np.float32)) for _ in range(2))
    v = tf.constant(rng.normal(size=(b, length, hv, dv)).astype(np.float32))
    q, k, v = prepare_qkv(q, k, v, hv // hk)
    g = tf.constant(-rng.uniform(0.0, 0.5, (b, length, hv)).astype(np.float32))
    beta = tf.constant(rng.uniform(0.0, 1.0, (b, length, hv)).astype(np.float32))
    state = tf.constant(rng.normal(size=(b, hv, dk, dv)).astype(np.float32))
    o_c, s_c = gated_delta_chunked(q, k, v, g, beta, state, chunk=chunk)
    o_r, s_r = gated_delta_recurrent(q, k, v, g, beta, state)
    np.testing.assert_allclose(o_c.numpy(), o_r.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s_c.numpy(), s_r.numpy(), rtol=1e-5, atol=1e-5)
    # The reference recurrence in NumPy float64: S <- e^g S; S += k ((v - S^T k) beta)^T; o = S^T q.
    qn, kn, vn, gn, bn = (t.numpy().astype(np.float64) for t in (q, k, v, g, beta))
    s = state.numpy().astype(np.float64)
    for t in range(length):
        s = s * np.exp(gn[:, t])[:, :, None, None]
        delta = (vn[:, t] - np.einsum("bhkv,bhk->bhv", s, kn[:, t])) * bn[:, t, :, None]
        s = s + kn[:, t, :, :, None] * delta[:, :, None, :]
        np.testing.assert_allclose(o_r.numpy()[:, t], np.einsum("bhkv,bhk->bhv", s, qn[:, t]), atol=1e-5)


def test_load_refuses_missing_or_misshapen_weights(golden):
    _, _, layer, weights = golden
    partial = dict(weights)
    del partial["A_log"]
    with pytest.raises(ValueError, match="missing: A_log"):
        layer.load_hf(partial)
    with pytest.raises(ValueError, match="in_proj_z.weight"):
        layer.load_hf({**weights, "in_proj_z.weight": weights["in_proj_z.weight"].T})


def test_chunked_form_compiles_under_xla(golden):
    """The training form inside a compiled step: XLA's program gives transformers' output too."""
    _, arrays, layer, _ = golden
    compiled = tf.function(lambda x: layer.forward(x, form="chunked")[0], jit_compile=True)
    np.testing.assert_allclose(compiled(tf.constant(goldens.golden_input())).numpy(), arrays["full"],
                               rtol=1e-5, atol=2e-5)


@pytest.mark.parametrize("form", ["chunked", "recurrent"])
def test_left_padded_batch_equals_transformers(golden, form):
    """Padded positions are zeroed before the projections: the padded row's tokens give what they give unpadded."""
    _, arrays, layer, _ = golden
    batch, mask = goldens.golden_padded_batch()
    y, _ = layer.forward(tf.constant(batch), form=form, mask=tf.constant(mask))
    np.testing.assert_allclose(y.numpy(), arrays["padded"], rtol=1e-5, atol=2e-5)
    np.testing.assert_allclose(y.numpy()[1, 5:], arrays["full"][0, :7], rtol=1e-5, atol=2e-5)
    unmasked, _ = layer.forward(tf.constant(batch), form=form)
    assert np.abs(unmasked.numpy()[1, 5:] - arrays["full"][0, :7]).max() > 1e-3  # the junk would leak in


@pytest.mark.parametrize("form", ["chunked", "recurrent"])
def test_packed_segments_equal_separate_runs(golden, form):
    """Rows of packed sequences (boundaries inside a chunk and across the 64-token chunk edge) give each
    sequence's own outputs, and the state after the row is that of its last sequence alone."""
    _, _, layer, _ = golden
    x = goldens.golden_input()[0]
    rng = np.random.default_rng(5)
    other = rng.normal(size=x.shape).astype(np.float32)
    # 65 tokens each; row 1 ends in a 2-token segment, shorter than the conv's left context.
    rows = [[x[:23], other[:30], x[30:42]], [other[10:50], x[:23], x[40:42]]]
    packed = np.stack([np.concatenate(r) for r in rows])
    starts = np.zeros(packed.shape[:2], np.float32)
    for i, r in enumerate(rows):
        starts[i, np.cumsum([0] + [len(s) for s in r[:-1]])] = 1.0
    y, (conv, state) = layer.forward(tf.constant(packed), form=form, starts=tf.constant(starts))
    for i, r in enumerate(rows):
        alone = [layer.forward(tf.constant(s[None]), form=form) for s in r]
        np.testing.assert_allclose(y.numpy()[i], np.concatenate([a[0].numpy()[0] for a in alone]),
                                   rtol=1e-5, atol=2e-5)
        np.testing.assert_allclose(conv.numpy()[i], alone[-1][1][0].numpy()[0], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(state.numpy()[i], alone[-1][1][1].numpy()[0], rtol=1e-5, atol=2e-5)


def test_chunked_equals_recurrent_with_starts_and_an_incoming_state():
    rng = np.random.default_rng(9)
    b, length, h, dk, dv = 2, 29, 2, 5, 4
    q, k = (tf.constant(rng.normal(size=(b, length, h, dk)).astype(np.float32)) for _ in range(2))
    v = tf.constant(rng.normal(size=(b, length, h, dv)).astype(np.float32))
    q, k, v = prepare_qkv(q, k, v, 1)
    g = tf.constant(-rng.uniform(0.0, 0.5, (b, length, h)).astype(np.float32))
    beta = tf.constant(rng.uniform(0.0, 1.0, (b, length, h)).astype(np.float32))
    state = tf.constant(rng.normal(size=(b, h, dk, dv)).astype(np.float32))
    starts = np.zeros((b, length), np.float32)
    starts[0, [0, 8, 13, 14]] = 1.0  # row 0 drops the incoming state; a start on a chunk edge; a 1-token segment
    starts[1, [5, 23]] = 1.0  # row 1 continues the incoming state for 5 tokens
    o_c, s_c = gated_delta_chunked(q, k, v, g, beta, state, tf.constant(starts), chunk=8)
    o_r, s_r = gated_delta_recurrent(q, k, v, g, beta, state, tf.constant(starts))
    np.testing.assert_allclose(o_c.numpy(), o_r.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(s_c.numpy(), s_r.numpy(), rtol=1e-5, atol=1e-5)
    fresh, _ = gated_delta_recurrent(q[:1], k[:1], v[:1], g[:1], beta[:1], None)  # row 0 ignores the state
    np.testing.assert_allclose(o_r.numpy()[0, :8], fresh.numpy()[0, :8], rtol=1e-5, atol=1e-6)
