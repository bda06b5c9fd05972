"""The dlrmv4 HSTU ranker against the MLPerf reference's own PyTorch modules (tests/data/dlrmv4_golden/, made
by scripts/dlrmv4_golden.py in the side virtualenv): forward logits of 16 samples dealt to two replicas, and
one training step (Adam on the dense weights after clipping, exact row-wise Adagrad on the 11 tables).

The user path (ContextualPreprocessor, HSTUPositionalEncoder, three STULayers, TimestampLayerNormPostprocessor)
ran as mlcommons/training@a67b8459 ships it, on its PyTorch kernels; torchrec and fbgemm_gpu do not load
beside the side venv's torch, so the script writes out the table lookups, three fbgemm jagged ops (data
movement only), the head, the loss and FBGEMM's row-wise Adagrad rule itself (its docstring says which).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from harness.config import RuntimeConfig
from harness.runtime import make_runtime

from benchmarks.dlrmv4.config import ModelConfig
from benchmarks.dlrmv4.model import HSTURanker
from benchmarks.dlrmv4.training import clip_dense, is_table, make_optimizer

GOLDEN = os.path.join(os.path.dirname(__file__), "data", "dlrmv4_golden")
TINY_TABLES = {"item_id": 1000, "artist_id": 100, "album_id": 300, "uid": 51, "user_x_artist": 97,
               "user_x_album": 89, "user_x_hour": 83, "item_x_hour": 79, "artist_x_hour": 73,
               "user_x_is_organic": 5, "user_x_artist_x_hour": 71}
TINY = ModelConfig(embedding_dim=32, num_heads=2, attention_dim=16, linear_dim=16, preprocessor_hidden_dim=16,
                   history_length=30, max_seq_len=40, num_position_buckets=32, num_time_buckets=31,
                   input_dropout=0.0, linear_dropout=0.0, tables=TINY_TABLES)
REPLICAS = 2


def reference_names() -> dict[str, tuple[str, bool]]:
    """This model's variable path -> (the reference parameter, whether torch stores it transposed)."""
    t, pre = "transducer.", "transducer._input_preprocessor."
    out: dict[str, tuple[str, bool]] = {}

    def mlp(ours: str, theirs: str) -> None:
        for i, kind in ((0, "w1"), (2, "w2")):
            out[f"hstu/{ours}/{kind}/kernel"] = (f"{theirs}.{i}.weight", True)
            out[f"hstu/{ours}/{kind}/bias"] = (f"{theirs}.{i}.bias", False)
        for i, kind in ((1, "swish_layer_norm"), (3, "layer_norm")):
            out[f"hstu/{ours}/{kind}/gamma"] = (f"{theirs}.{i}.weight", False)
            out[f"hstu/{ours}/{kind}/beta"] = (f"{theirs}.{i}.bias", False)

    mlp("content_mlp", pre + "_content_embedding_mlp")
    mlp("additional_mlp", pre + "_additional_embedding_mlp")
    mlp("action_mlp", pre + "_action_embedding_mlp")
    mlp("item_mlp", "item_mlp")
    out["hstu/action_embeddings"] = (pre + "_action_encoder._action_embedding_table", False)
    out["hstu/target_action_embedding"] = (pre + "_action_encoder._target_action_embedding_table", False)
    out["hstu/context_kernel"] = (pre + "_batched_contextual_linear_weights", False)
    out["hstu/context_bias"] = (pre + "_batched_contextual_linear_bias", False)
    out["hstu/position_embeddings"] = (t + "_positional_encoder._position_embeddings_weight", False)
    out["hstu/time_embeddings"] = (t + "_positional_encoder._timestamp_embeddings_weight", False)
    for i in range(3):
        s = f"{t}_stu_module._stu_layers.{i}."
        out[f"hstu/stu_{i}/uvqk_kernel"] = (s + "_uvqk_weight", False)
        out[f"hstu/stu_{i}/uvqk_bias"] = (s + "_uvqk_beta", False)
        out[f"hstu/stu_{i}/output_kernel"] = (s + "_output_weight", False)
        for ours, theirs in (("input_layer_norm", "_input_norm"), ("output_layer_norm", "_output_norm")):
            out[f"hstu/stu_{i}/{ours}/gamma"] = (s + theirs + "_weight", False)
            out[f"hstu/stu_{i}/{ours}/beta"] = (s + theirs + "_bias", False)
    post = t + "_output_postprocessor."
    out["hstu/time_combiner/kernel"] = (post + "_time_feature_combiner.weight", True)
    out["hstu/time_combiner/bias"] = (post + "_time_feature_combiner.bias", False)
    out["hstu/post_layer_norm/gamma"] = (post + "_layer_norm.weight", False)
    out["hstu/post_layer_norm/beta"] = (post + "_layer_norm.bias", False)
    for ours, i in (("hidden", 0), ("out", 2)):
        out[f"hstu/head/{ours}/kernel"] = (f"head.{i}.weight", True)
        out[f"hstu/head/{ours}/bias"] = (f"head.{i}.bias", False)
    out["hstu/head/swish_layer_norm/gamma"] = ("head.1.weight", False)
    out["hstu/head/swish_layer_norm/beta"] = ("head.1.bias", False)
    for name in TINY_TABLES:
        out[f"hstu/tables/{name}"] = (f"table.{name}", False)
    return out


def reference_value(weights, name: str, transposed: bool) -> np.ndarray:
    return weights[name].T if transposed else weights[name]


@pytest.fixture(scope="module")
def ranker():
    runtime = make_runtime(RuntimeConfig(precision="float32"))
    with runtime.scope():
        model = HSTURanker(runtime, "hstu", 1, TINY)
    before = np.load(os.path.join(GOLDEN, "weights_before.npz"))
    names = reference_names()
    variables = runtime.variables(True)
    assert sorted(v.path for v in variables) == sorted(names), "every weight maps to one of the reference's"
    for v in variables:
        v.variable.assign(reference_value(before, *names[v.path]))
    batch = {k: tf.constant(v) for k, v in np.load(os.path.join(GOLDEN, "batch.npz")).items()}
    return runtime, model, batch


def test_forward_matches_reference(ranker):
    _, model, batch = ranker
    want = np.load(os.path.join(GOLDEN, "outputs.npz"))["logits"]
    np.testing.assert_allclose(model.logits(batch, groups=REPLICAS).numpy(), want, rtol=2e-4, atol=2e-5)
    # N is each replica's own longest sequence: one N over both replicas' rows computes something else.
    assert not np.allclose(model.logits(batch, groups=1).numpy(), want, rtol=2e-4, atol=2e-5)


def test_one_step_matches_reference(ranker):
    runtime, model, batch = ranker
    out = np.load(os.path.join(GOLDEN, "outputs.npz"))
    after = np.load(os.path.join(GOLDEN, "weights_after.npz"))
    variables = sorted(runtime.variables(True), key=lambda v: is_table(v.path))
    optimizer = make_optimizer(runtime, variables, lambda step: tf.constant(float(out["lr"])))
    with runtime.scope():
        optimizer.build()
    with tf.GradientTape() as tape:
        logits = model.logits(batch, groups=REPLICAS)
        loss = model.loss_sum(logits, batch["label"]) / float(logits.shape[0])
    np.testing.assert_allclose(float(loss), float(out["loss"]), rtol=1e-5)
    grads = tape.gradient(loss, [p.variable for p in optimizer.params])
    dense_count = len(optimizer.parts[0].params)
    optimizer.apply(clip_dense(grads, dense_count))
    names = reference_names()
    # Adam's first step moves each weight by about lr * g / (|g| + eps): a gradient within a few eps of zero
    # amplifies float rounding, so weights are held to lr / 100 (a wrong update is off by up to 2 lr).
    for p in optimizer.params:
        want = reference_value(after, *names[p.path])
        np.testing.assert_allclose(p.variable.numpy(), want, rtol=1e-4, atol=1e-4, err_msg=p.path)
    for p, acc in zip(optimizer.parts[1].params, optimizer.parts[1].slots["accumulator"]):
        want = after[f"accumulator.{p.path.split('/')[-1]}"]
        np.testing.assert_allclose(acc.numpy(), want, rtol=1e-4, atol=1e-12, err_msg=p.path)
