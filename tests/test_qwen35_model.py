"""benchmarks/qwen35_397b_grpo/model.py: the whole tiny Qwen3.5 MoE text model (three Gated DeltaNet layers, then
one gated attention layer, every layer's feed-forward the sparse MoE with its gated shared expert), loaded from a
checkpoint in transformers' names and layout (fused experts, head-interleaved query/gate rows) through
harness/nn/hf_checkpoint.py, gives the logits of transformers' own `Qwen3_5MoeForCausalLM`
(tests/data/qwen35/model_golden.*, made by scripts/make_qwen35_goldens.py in a side virtualenv; the weights come
from fixed NumPy seeds, so only the logits and a digest are committed). Each feature matters: the logits move
far past the tolerance when one is changed (a norm without its + 1, RoPE over the whole head, the query/gate
rows read un-interleaved, the experts' gate and up halves swapped)."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os

import numpy as np
import pytest
import tensorflow as tf
from safetensors.numpy import save_file

from benchmarks.qwen35_397b_grpo import hf_names
from benchmarks.qwen35_397b_grpo.config import ModelConfig
from benchmarks.qwen35_397b_grpo.model import GatedAttention, Qwen35, SparseMoE
from conftest import REPO
from harness.errors import HarnessError
from harness.nn import hf_checkpoint
from harness.nn.layers import RMSNorm
from harness.runtime import distribute

pytestmark = pytest.mark.quick

DATA = os.path.join(REPO, "tests", "data", "qwen35")
_spec = importlib.util.spec_from_file_location("make_qwen35_goldens",
                                               os.path.join(REPO, "scripts", "make_qwen35_goldens.py"))
goldens = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(goldens)  # NumPy only at import: the weights' and tokens' seeds
TOLERANCE = 1e-5  # of max |logit|; float32 on both sides, measured 2e-6 of it (each changed feature: > 0.1)


def model_config(c: dict, **overrides) -> ModelConfig:
    """The model section for transformers' config keys `c` (the golden's)."""
    rope = c["rope_parameters"]
    return ModelConfig(**{**dict(
        vocab_size=c["vocab_size"], hidden_size=c["hidden_size"], num_layers=c["num_hidden_layers"],
        num_heads=c["num_attention_heads"], num_kv_heads=c["num_key_value_heads"], head_dim=c["head_dim"],
        rope_base=rope["rope_theta"], rotary_dim=round(c["head_dim"] * rope["partial_rotary_factor"]),
        norm_epsilon=c["rms_norm_eps"], linear_num_key_heads=c["linear_num_key_heads"],
        linear_num_value_heads=c["linear_num_value_heads"], linear_key_head_dim=c["linear_key_head_dim"],
        linear_value_head_dim=c["linear_value_head_dim"], linear_conv_kernel_dim=c["linear_conv_kernel_dim"],
        num_experts=c["num_experts"], experts_per_token=c["num_experts_per_tok"],
        expert_hidden=c["moe_intermediate_size"], shared_expert_hidden=c["shared_expert_intermediate_size"]),
        **overrides})


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    """(meta, logits, the transformers weights, a checkpoint directory holding them)."""
    with open(os.path.join(DATA, "model_golden.json")) as f:
        meta = json.load(f)
    logits = np.load(os.path.join(DATA, "model_golden.npz"))["logits"]
    weights = goldens.model_weights(meta["hf_names"])
    assert goldens.weights_digest(weights) == meta["weights_sha256"]
    ckpt = str(tmp_path_factory.mktemp("qwen35_ckpt"))
    save_file(weights, os.path.join(ckpt, "model.safetensors"))
    with open(os.path.join(ckpt, "config.json"), "w") as f:
        json.dump({**meta["config"], "layer_types": meta["layer_types"], "model_type": "qwen3_5_moe_text"}, f)
    return meta, logits, weights, ckpt


def build(meta: dict, ckpt: str, **overrides) -> tuple[Qwen35, ModelConfig]:
    cfg = model_config(meta["config"], **overrides)
    runtime = distribute.make_default("float32", False)
    with runtime.scope():
        model = Qwen35(runtime, 0, cfg, goldens.MODEL_LENGTH)
    hf_checkpoint.load_into(runtime, ckpt, hf_names.FORMAT, cfg)
    return model, cfg


def logits_of(model: Qwen35) -> np.ndarray:
    hidden, _ = model(tf.constant(goldens.model_tokens(), tf.int32))
    return model.logits(hidden).numpy()


@pytest.fixture(scope="module")
def loaded(golden):
    meta, _, _, ckpt = golden
    return build(meta, ckpt)


def test_layout_covers_every_transformers_tensor(golden, loaded):
    """The layout reads every tensor transformers' model has, with its shape; the layer pattern is the config's."""
    meta, _, _, _ = golden
    model, cfg = loaded
    layout = hf_names.layout(cfg, set(meta["hf_names"]), lambda p: True)
    assert {k: list(v[0]) for k, v in layout.expected().items()} == meta["hf_names"]
    assert [cfg.layer_type(i) for i in range(cfg.num_layers)] == meta["layer_types"]
    kinds = [type(layer.attention).__name__ for layer in model.layers]
    assert kinds == ["GatedDeltaNet"] * 3 + ["GatedAttention"]
    assert all(isinstance(layer.ffn, SparseMoE) for layer in model.layers)
    assert not model.layers[0].ffn.router.trainable and model.layers[0].ffn.shared_gate.trainable


@pytest.mark.parametrize("dispatch", ["alltoall", "dense"])
def test_logits_equal_transformers(golden, loaded, dispatch):
    meta, want, _, ckpt = golden
    model = loaded[0] if dispatch == "alltoall" else build(meta, ckpt, moe_dispatch=dispatch)[0]
    scale = np.abs(want).max()
    np.testing.assert_allclose(logits_of(model), want, rtol=0, atol=TOLERANCE * scale)


def _mutate(model: Qwen35, cfg: ModelConfig, feature: str) -> None:
    if feature == "norm_without_plus_one":
        for m in model.submodules:
            if isinstance(m, RMSNorm) and m.offset:
                m.offset = 0.0
    elif feature == "rope_on_whole_head":
        for layer in model.layers:
            if isinstance(layer.attention, GatedAttention):
                layer.attention.cfg = dataclasses.replace(cfg, rotary_dim=cfg.head_dim)
    elif feature == "query_gate_not_interleaved":  # q_proj read as [all queries; all gates]
        for layer in model.layers:
            att = layer.attention
            if isinstance(att, GatedAttention):
                both = np.concatenate([att.wq.numpy().reshape(cfg.hidden_size, -1),
                                       att.wg.numpy().reshape(cfg.hidden_size, -1)], 1)   # interleaved per head
                heads = both.reshape(cfg.hidden_size, cfg.num_heads, 2, cfg.head_dim)
                wrong = heads.transpose(0, 2, 1, 3).reshape(cfg.hidden_size, 2, -1)
                att.wq.assign(wrong[:, 0].reshape(att.wq.shape))
                att.wg.assign(wrong[:, 1].reshape(att.wg.shape))
    elif feature == "experts_gate_up_swapped":
        for layer in model.layers:
            gate, up = layer.ffn.w_gate.numpy(), layer.ffn.w_up.numpy()
            layer.ffn.w_gate.assign(up)
            layer.ffn.w_up.assign(gate)


@pytest.mark.parametrize("feature", ["norm_without_plus_one", "rope_on_whole_head", "query_gate_not_interleaved",
                                     "experts_gate_up_swapped"])
def test_a_changed_feature_fails_the_golden(golden, feature):
    meta, want, _, ckpt = golden
    model, cfg = build(meta, ckpt)
    _mutate(model, cfg, feature)
    moved = np.abs(logits_of(model) - want).max() / np.abs(want).max()
    assert moved > 100 * TOLERANCE, moved


def test_export_writes_what_transformers_stores(golden, loaded):
    """Export's tensors (the layout's `outs`) are the checkpoint's tensors, bit for bit, fused ones included."""
    meta, _, weights, _ = golden
    model, cfg = loaded
    values = {v.path: v.variable.numpy() for v in model.runtime.variables()}
    layout = hf_names.layout(cfg, set(meta["hf_names"]), lambda p: True)
    names, produce = hf_checkpoint.export_tensors(layout, values.__getitem__, np.float32)
    assert sorted(n for n, _, _ in names) == sorted(weights)
    for name, shape, _ in names:
        np.testing.assert_array_equal(produce(name), weights[name], err_msg=name)


def test_a_mismatched_config_is_refused_in_one_line(golden):
    meta, _, _, ckpt = golden
    cfg = model_config(meta["config"], rotary_dim=meta["config"]["head_dim"], full_attention_interval=2)
    with pytest.raises(HarnessError, match="partial_rotary_factor=0.25.*layer_types"):
        hf_checkpoint.check_config(ckpt, hf_names.FORMAT, cfg)


def test_cached_decoding_equals_the_full_forward(golden, loaded, prefill=5):
    """A prefill of 5 tokens (the chunked DeltaNet form; the attention cache written at 0..4), then one token
    at a time with the key/value cache (longer than needed: unfilled positions must stay unseen) and the
    DeltaNet state, gives the whole row's logits at every position to float32 rounding. (Positions off by one
    move them 0.11 of max |logit|, a DeltaNet state dropped 1.5.)"""
    _, want, _, _ = golden
    model, _ = loaded
    tokens = tf.constant(goldens.model_tokens(), tf.int32)
    rows, length = tokens.shape
    cache = model.empty_cache(rows, length + 3)
    logits, cache = model.step(tokens[:, :prefill], cache, 0)
    steps = [logits.numpy()]
    for t in range(prefill, length):
        logits, cache = model.step(tokens[:, t:t + 1], cache, tf.constant(t))
        steps.append(logits.numpy())
    full = logits_of(model)
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=0, atol=TOLERANCE * np.abs(full).max())
    np.testing.assert_allclose(full, want, rtol=0, atol=TOLERANCE * np.abs(want).max())


def test_gradients_reach_every_trainable_weight_but_the_frozen_router(loaded):
    """The router is no trainable variable (freeze_router), yet the gate weights pass gradients to the layer's
    input; every other weight gets one, and recomputing each layer in the backward pass (model.remat) changes
    none of them."""
    model, cfg = loaded
    tokens = tf.constant(goldens.model_tokens(), tf.int32)
    routers = {id(layer.ffn.router) for layer in model.layers}
    trainable = model.trainable_variables
    assert routers and not routers & {id(v) for v in trainable}

    def grads():
        with tf.GradientTape() as tape:
            hidden, _ = model(tokens)
            loss = tf.reduce_sum(tf.square(model.logits(hidden))) * 1e-3
        return [None if g is None else tf.convert_to_tensor(g) for g in tape.gradient(loss, trainable)]

    plain = grads()
    assert all(g is not None and float(tf.reduce_max(tf.abs(g))) > 0 for g in plain), \
        [v.name for v, g in zip(trainable, plain) if g is None or not np.any(g.numpy())]
    model.cfg = dataclasses.replace(cfg, remat=True)
    try:
        rematted = grads()
    finally:
        model.cfg = cfg
    for v, a, b in zip(trainable, plain, rematted):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-6 * float(tf.norm(a)), err_msg=v.name)


def test_the_default_config_is_the_397b_text_model():
    """The defaults' checkpoint layout (no model built): 15 gated attention layers (3, 7, ..., 59) among 60, and
    396,346,350,336 text weights (Qwen3.5-397B-A17B: 397B with its vision tower of about 0.4B), of which the 60
    frozen routers hold 60 x 512 x 4096."""
    cfg = ModelConfig()
    assert [i for i in range(cfg.num_layers) if cfg.layer_type(i) == "full_attention"] == list(range(3, 60, 4))
    expected = hf_names.layout(cfg, set(), lambda p: True).expected()
    assert sum(int(np.prod(shape)) for shape, _ in expected.values()) == 396_346_350_336
    routers = [name for name in expected if name.endswith("mlp.gate.weight")]
    assert len(routers) == 60 and sum(int(np.prod(expected[n][0])) for n in routers) == 60 * 512 * 4096


def test_the_vision_language_snapshot_form_loads_its_text_model(golden, loaded, tmp_path):
    """The published snapshot's form (Qwen3_5MoeForConditionalGeneration): the text tensors under
    `model.language_model.`, config.json's keys under `text_config`, and vision and multi-token-prediction
    tensors the model ignores; loaded, the model gives the golden logits."""
    meta, want, weights, _ = golden
    model, cfg = loaded
    tensors = {("lm_head.weight" if k == "lm_head.weight" else "model.language_model." + k[len("model."):]): v
               for k, v in weights.items()}
    tensors.update({"mtp.fc.weight": np.ones((2, 2), np.float32), "model.visual.patch_embed.proj.weight":
                    np.ones((2, 2), np.float32)})
    save_file(tensors, str(tmp_path / "model.safetensors"))
    text = {**meta["config"], "layer_types": meta["layer_types"], "model_type": "qwen3_5_moe_text"}
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5MoeForConditionalGeneration"],
                                                      "model_type": "qwen3_5_moe", "text_config": text}))
    for v in model.trainable_variables:
        v.assign(tf.zeros_like(v))
    try:
        hf_checkpoint.load_into(model.runtime, str(tmp_path), hf_names.FORMAT, cfg)
        np.testing.assert_allclose(logits_of(model), want, rtol=0, atol=TOLERANCE * np.abs(want).max())
    finally:
        hf_checkpoint.load_into(model.runtime, golden[3], hf_names.FORMAT, cfg)
