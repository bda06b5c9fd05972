"""gpt_oss_20b's architecture options against the formulas, written out here in numpy from their published
definitions (transformers' GptOssForCausalLM, Megatron's qk_layernorm) rather than from the harness code:
YaRN's frequencies and attention factor, attention sinks in both attention formulations (windowed blocks
and full-causal strips), the clamped GLU, and a whole small decoder with every option on (and with the
reference's q/k norm), whose logits must match and move when any one option is dropped from the formula.
The mesh and smoke runs with the options on are in tests/test_gpt_oss.py."""
from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.gpt_oss_20b.config import ModelConfig
from benchmarks.lm import attention, ffn
from harness.nn import layers

from tests.helpers import tiny_gpt_oss
from tests.helpers.numpy_attention import masked_attention, softmax

pytestmark = pytest.mark.quick


# ------------------------------------------------------------------------------------------- YaRN

def _yarn_numpy(dim, base, factor, orig, beta_fast, beta_slow, truncate):
    """transformers' _compute_yarn_parameters, restated: (inv_freq, attention_factor)."""
    i = np.arange(0, dim, 2) / dim
    extrapolation, interpolation = base ** -i, base ** -i / factor

    def corr(rotations):
        return dim * math.log(orig / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = corr(beta_fast), corr(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = np.clip((np.arange(dim // 2) - low) / (high - low), 0, 1)
    return interpolation * ramp + extrapolation * (1 - ramp), 0.1 * math.log(factor) + 1


@pytest.mark.parametrize("truncate", [False, True])
def test_yarn_frequencies_and_attention_factor_follow_the_formula(truncate):
    scaling = layers.YarnScaling(32.0, 4096, 32.0, 1.0, truncate)
    want, factor = _yarn_numpy(64, 150000.0, 32.0, 4096, 32.0, 1.0, truncate)
    np.testing.assert_allclose(layers.rope_frequencies(64, 150000.0, scaling).numpy(), want, rtol=2e-6)
    assert scaling.attention_factor() == pytest.approx(factor)
    if not truncate:
        # gpt-oss-20b's numbers as transformers 5.24 computes them (dim 64, theta 150000, factor 32, orig 4096)
        assert factor == pytest.approx(1.3465736, abs=1e-7)
        np.testing.assert_allclose(want[:3], [1.0, 0.68904, 0.47478], rtol=2e-5)
        np.testing.assert_allclose(want[-3:], [6.368e-07, 4.388e-07, 3.024e-07], rtol=2e-3)


def test_yarn_rotary_turns_by_the_scaled_frequencies_and_scales_by_the_attention_factor():
    scaling = layers.YarnScaling(32.0, 64, 32.0, 1.0, False)
    inv, factor = _yarn_numpy(8, 10000.0, 32.0, 64, 32.0, 1.0, False)
    x = np.random.default_rng(0).normal(size=[1, 5, 3, 8]).astype(np.float32)
    angle = np.arange(5)[:, None] * inv[None, :]                         # [seq, half]
    cos, sin = np.cos(angle)[None, :, None] * factor, np.sin(angle)[None, :, None] * factor
    want = np.concatenate([x[..., :4] * cos - x[..., 4:] * sin, x[..., 4:] * cos + x[..., :4] * sin], -1)
    np.testing.assert_allclose(layers.rotary(tf.constant(x), 10000.0, scaling).numpy(), want, rtol=1e-5,
                               atol=1e-6)


# ---------------------------------------------------------------------------------- attention sinks

@pytest.mark.parametrize("xla", [False, True])
def test_sinks_join_the_softmax_denominator_in_windows_and_causal_strips(xla):
    rng = np.random.default_rng(4)
    q = rng.normal(size=[2, 32, 2, 2, 4]).astype(np.float32) * 2
    k, v = (rng.normal(size=[2, 32, 2, 4]).astype(np.float32) for _ in range(2))
    sinks = rng.normal(size=[2, 2]).astype(np.float32) * 2
    segments = np.cumsum(rng.random([2, 32]) < 0.15, 1).astype(np.int32)
    args = [tf.constant(t) for t in (q, k, v)]
    windowed = tf.function(attention.windowed_attention, jit_compile=xla)
    strips = tf.function(attention.causal_attention, jit_compile=xla)
    got = windowed(*args, tf.constant(segments), 9, 4, like=tf.constant(q[:, :, 0, 0, 0]), xla=xla,
                   sinks=tf.constant(sinks))
    np.testing.assert_allclose(got.numpy(), masked_attention(q, k, v, 9, sinks, segments), atol=2e-5)
    full = masked_attention(q, k, v, 32, sinks)
    for chunk in (8, 1024):                       # strips of 8 queries, and one dense block
        got = strips(*args, chunk=chunk, xla=xla, sinks=tf.constant(sinks))
        np.testing.assert_allclose(got.numpy(), full, atol=2e-5)
    # A sink only takes weight: against no sink, the outputs shrink toward zero.
    assert np.abs(full).sum() < np.abs(masked_attention(q, k, v, 32, None)).sum()


# --------------------------------------------------------------------------------------- clamped GLU

def test_clamped_glu_is_gpt_oss_apply_gate():
    gate = np.linspace(-10, 10, 41).astype(np.float32)
    up = np.linspace(9, -9, 41).astype(np.float32)
    act = ffn.Glu(alpha=1.702, limit=7.0, up_offset=1.0)
    g, u = np.minimum(gate, 7.0), np.clip(up, -7.0, 7.0)
    want = g / (1 + np.exp(-1.702 * g)) * (u + 1)
    np.testing.assert_allclose(ffn.swiglu_hidden(tf.constant(gate), tf.constant(up), act).numpy(), want,
                               rtol=1e-6, atol=1e-6)
    plain = gate / (1 + np.exp(-gate)) * up                                          # the reference's SwiGLU
    np.testing.assert_allclose(ffn.swiglu_hidden(tf.constant(gate), tf.constant(up)).numpy(), plain, rtol=1e-6,
                               atol=1e-6)
    # No gradient past a clamp (torch.clamp's): gate above 7 and |up| above 7.
    with tf.GradientTape() as tape:
        g_t, u_t = tf.constant(gate), tf.constant(up)
        tape.watch([g_t, u_t])
        out = ffn.swiglu_hidden(g_t, u_t, act)
    dg, du = tape.gradient(out, [g_t, u_t])
    assert (dg.numpy()[gate > 7] == 0).all() and (du.numpy()[np.abs(up) > 7] == 0).all()
    assert (dg.numpy()[gate < 6] != 0).all()


# ------------------------------------------------------------------------------ the whole decoder

GPT_OSS = dict(attention_sinks=True, attention_bias=True, router_bias=True, expert_bias=True, swiglu_alpha=1.702,
               swiglu_limit=0.6, swiglu_up_offset=1.0, rope_type="yarn", rope_original_context=64, qk_norm=False)
SIZES = dict(vocab_size=32, hidden_size=16, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
             sliding_window=8, attention_block=4, num_experts=4, experts_per_token=2, expert_hidden=8,
             moe_group_size=16, moe_block_size=4, moe_chunk_blocks=3, init_stddev=0.3, rope_base=10000.0,
             norm_epsilon=1e-5)


def _rms(x, gamma, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * gamma


def _rope(x, base, yarn):
    """x [b, s, heads, d], rotate-half; YaRN: transformers' frequencies and cos/sin factor."""
    d, s = x.shape[-1], x.shape[1]
    if yarn is None:
        inv, factor = base ** -(np.arange(0, d, 2) / d), 1.0
    else:
        inv, factor = _yarn_numpy(d, base, *yarn)
    angle = np.arange(s)[:, None] * inv[None, :]
    cos, sin = np.cos(angle)[None, :, None] * factor, np.sin(angle)[None, :, None] * factor
    h = d // 2
    return np.concatenate([x[..., :h] * cos - x[..., h:] * sin, x[..., h:] * cos + x[..., :h] * sin], -1)


def _decoder_numpy(w, tokens, c: ModelConfig, drop: str = ""):
    """Logits of GptOssForCausalLM's forward (eager attention, float64) with the harness's weights `w` (path ->
    array), every option as `c` sets it except `drop` (a feature removed from the formula)."""
    on = {f: getattr(c, f) and f != drop for f in ("attention_sinks", "attention_bias", "router_bias",
                                                   "expert_bias", "qk_norm")}
    clamp = drop != "clamp" and c.swiglu_limit > 0
    yarn = None if c.rope_type != "yarn" or drop == "yarn" else (
        c.rope_scaling_factor, c.rope_original_context, c.rope_beta_fast, c.rope_beta_slow, c.rope_truncate)
    m, kv, d, eps = c.hidden_size, c.num_kv_heads, c.head_dim, c.norm_epsilon
    nh, g = c.num_heads, c.num_heads // kv
    x = w["gpt_oss/embedding/embeddings"][tokens]
    b, s, _ = x.shape
    for layer in range(c.num_layers):
        p = lambda name: w[f"gpt_oss/layer_{layer}/{name}"]  # noqa: E731
        bias = lambda name, shape: p(name).reshape(shape) if on["attention_bias"] else 0  # noqa: E731
        h = _rms(x, p("attention_norm/gamma"), eps)
        q = (h @ p("attention/query/kernel").reshape(m, nh * d) + bias("attention/query/bias", nh * d))
        k = h @ p("attention/key/kernel").reshape(m, kv * d) + bias("attention/key/bias", kv * d)
        v = h @ p("attention/value/kernel").reshape(m, kv * d) + bias("attention/value/bias", kv * d)
        q, k, v = q.reshape(b, s, nh, d), k.reshape(b, s, kv, d), v.reshape(b, s, kv, d)
        if on["qk_norm"]:
            q, k = _rms(q, p("attention/query_norm/gamma"), eps), _rms(k, p("attention/key_norm/gamma"), eps)
        q, k = _rope(q, c.rope_base, yarn), _rope(k, c.rope_base, yarn)
        window = c.sliding_window if layer % 2 == 0 else s
        sinks = p("attention/sinks").reshape(nh) if on["attention_sinks"] else None
        ctx = np.zeros([b, s, nh, d])
        for head in range(nh):                       # query head h reads key/value head h // g (repeat_kv)
            scores = np.einsum("bqd,bkd->bqk", q[:, :, head], k[:, :, head // g]) / math.sqrt(d)
            qi, ki = np.arange(s)[:, None], np.arange(s)[None, :]
            scores = np.where((ki <= qi) & (qi - ki < window), scores, -np.inf)
            if sinks is not None:
                scores = np.concatenate([scores, np.full([b, s, 1], sinks[head])], -1)
            probs = softmax(scores)[..., :s]
            ctx[:, :, head] = np.einsum("bqk,bkd->bqd", probs, v[:, :, head // g])
        x = x + ctx.reshape(b, s, nh * d) @ p("attention/output/kernel").reshape(nh * d, m) + bias(
            "attention/output/bias", m)
        h = _rms(x, p("mlp_norm/gamma"), eps)
        logits = h @ p("moe/router/kernel") + (p("moe/router/bias") if on["router_bias"] else 0)
        top = np.argsort(-logits, -1, kind="stable")[..., :c.experts_per_token]
        gates = softmax(np.take_along_axis(logits, top, -1))
        y = np.zeros_like(x)
        for e in range(c.num_experts):
            eb = lambda name: p(f"moe/experts/{name}/bias")[e] if on["expert_bias"] else 0  # noqa: E731
            gate = h @ p("moe/experts/gate/kernel")[e] + eb("gate")
            up = h @ p("moe/experts/up/kernel")[e] + eb("up")
            if clamp:
                gate, up = np.minimum(gate, c.swiglu_limit), np.clip(up, -c.swiglu_limit, c.swiglu_limit)
            alpha = c.swiglu_alpha if drop != "alpha" else 1.0
            offset = c.swiglu_up_offset if drop != "offset" else 0.0
            out = (gate / (1 + np.exp(-alpha * gate)) * (up + offset)) @ p("moe/experts/down/kernel")[e] + eb("down")
            weight = (gates * (top == e)).sum(-1, keepdims=True)          # the down bias is weighted too
            y += weight * out
        x = x + y
    return _rms(x, w["gpt_oss/final_norm/gamma"], eps) @ w["gpt_oss/output/kernel"]


def _harness_logits(cfg: ModelConfig, jit: bool):
    runtime, net = tiny_gpt_oss.build(cfg, 11, jit_compile=jit)
    rng = np.random.default_rng(5)
    for info in runtime.variables():       # biases, sinks and norm weights away from their init values
        if not info.path.endswith("kernel") and not info.path.endswith("embeddings"):
            info.variable.assign(rng.normal(1.0 if "gamma" in info.path else 0.0, 0.5, info.variable.shape))
    tokens = np.random.default_rng(6).integers(0, cfg.vocab_size, [2, 32]).astype(np.int32)
    forward = tf.function(lambda t: net.logits(net(t)[0]), jit_compile=True) if jit else (
        lambda t: net.logits(net(t)[0]))
    weights = {info.path: info.variable.numpy().astype(np.float64) for info in runtime.variables()}
    return forward(tf.constant(tokens)).numpy(), weights, tokens


@pytest.mark.parametrize("options, dispatch, jit", [
    (GPT_OSS, "sorted", False),                         # the published architecture, TensorFlow kernels
    (GPT_OSS, "dense", True),                           # and under XLA (the XLA attention formulation)
    ({"qk_norm": True}, "sorted", False),               # the reference's (Primus/Megatron) q/k norm
])
def test_decoder_with_the_options_on_equals_the_formula(options, dispatch, jit):
    cfg = ModelConfig(**SIZES, **{**options, "moe_dispatch": dispatch})
    got, weights, tokens = _harness_logits(cfg, jit)
    want = _decoder_numpy(weights, tokens, cfg)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, atol=2e-5 * scale)
    # Each option moves the logits: the comparison would fail with any one missing from the model.
    features = [f for f in ("attention_sinks", "attention_bias", "router_bias", "expert_bias", "qk_norm")
                if getattr(cfg, f)] + (["clamp", "alpha", "offset", "yarn"] if cfg.rope_type == "yarn" else [])
    for drop in features:
        assert np.abs(_decoder_numpy(weights, tokens, cfg, drop) - want).max() > 1e-3 * scale, drop


def test_a_layers_new_variables_split_as_their_kernels_output():
    """Every option's variable and its named dimensions (what a mesh layout splits): q/k/v biases and sinks
    with the heads, expert biases with the experts and their hidden units, norms and o/router biases whole."""
    runtime, _ = tiny_gpt_oss.build(ModelConfig(**SIZES, **{**GPT_OSS, "qk_norm": True}))
    got = {i.path.split("layer_0/")[1]: (tuple(i.variable.shape), tuple(i.dims)) for i in runtime.variables()
           if "layer_0/" in i.path and not i.path.endswith("kernel") and "attention_norm" not in i.path
           and "mlp_norm" not in i.path}
    assert got == {
        "attention/query/bias": ((2, 2, 8), ("heads", None, None)),
        "attention/key/bias": ((2, 8), ("heads", None)),
        "attention/value/bias": ((2, 8), ("heads", None)),
        "attention/output/bias": ((16,), (None,)),
        "attention/sinks": ((2, 2), ("heads", None)),
        "attention/query_norm/gamma": ((8,), (None,)),
        "attention/key_norm/gamma": ((8,), (None,)),
        "moe/router/bias": ((4,), (None,)),
        "moe/experts/gate/bias": ((4, 8), ("experts", "ff")),
        "moe/experts/up/bias": ((4, 8), ("experts", "ff")),
        "moe/experts/down/bias": ((4, 16), ("experts", None)),
    }


def test_the_plans_parameter_count_is_the_built_models_with_every_option():
    """benchmarks/gpt_oss_20b/cost.py counts each option's parameters as the model creates them (the
    reference's q/k norm is checked against the compiled reduced reference in tests/test_dry_run.py)."""
    from types import SimpleNamespace

    from benchmarks.gpt_oss_20b import cost

    for options in (GPT_OSS, {**GPT_OSS, "qk_norm": True}, {"qk_norm": False}):
        cfg = ModelConfig(**SIZES, **options)
        runtime, _ = tiny_gpt_oss.build(cfg)
        built = sum(i.variable.shape.num_elements() for i in runtime.variables(trainable=True))
        _, counted = cost.forward_macs_and_params(SimpleNamespace(model=cfg, data=SimpleNamespace(seq_length=32)))
        assert counted == built, options
