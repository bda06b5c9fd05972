"""SSD model (benchmarks/ssd/model.py): shapes, anchor-order flattening, layout checks, init, MLPerf tensor
names and backbone checkpoint loading. Tiny widths so the whole file runs in seconds on 2 CPU cores."""
from __future__ import annotations

import dataclasses
import math
import types

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.ssd import anchors as A
from benchmarks.ssd import model as M
from benchmarks.ssd import tensor_names as T
from benchmarks.ssd.config import ModelConfig
from harness.train import weights_init
from harness.config import RuntimeConfig
from harness.errors import HarnessError
from harness.runtime import make_runtime
from harness.runtime.distribute import StrategyRuntime

pytestmark = pytest.mark.quick

SSD300_SMALL = ModelConfig(width=4, extra_channels=[[4, 8]] * 5)
TINY = ModelConfig(image_size=64, width=2, blocks=[1, 1, 1], extra_channels=[[4, 8]] * 3, num_classes=3,
                   **{k: [list(v) if isinstance(v, tuple) else v for v in A.TINY64[k]]
                      for k in ("feature_sizes", "steps", "scales", "aspect_ratios")})


def build(cfg: ModelConfig, runtime=None, seed: int = 0):
    runtime = runtime or make_runtime(RuntimeConfig(kind="default"))
    with runtime.scope():
        model = M.SSD(runtime, seed, cfg, 1)
    return runtime, model, {v.path: v.variable for v in runtime.variables()}


def num_anchors(cfg: ModelConfig) -> int:
    return len(A.default_boxes(cfg.image_size, cfg.feature_sizes, cfg.steps, cfg.scales, cfg.aspect_ratios))


# ---------------------------------------------------------------- shapes

def test_ssd300_layout_shapes_at_small_width():
    _, model, _ = build(SSD300_SMALL)
    images = tf.random.stateless_uniform([1, 300, 300, 3], [1, 2])
    maps = model.features(images, training=False)
    assert [tuple(m.shape[1:]) for m in maps] == [(38, 38, 16), (19, 19, 8), (10, 10, 8), (5, 5, 8), (3, 3, 8),
                                                  (1, 1, 8)]
    loc, logits = model(images, training=True)
    assert num_anchors(SSD300_SMALL) == 8732
    assert loc.shape == (1, 8732, 4) and logits.shape == (1, 8732, 81)
    assert loc.dtype == tf.float32 and logits.dtype == tf.float32


def test_tiny_layout_shapes_train_and_eval():
    _, model, variables = build(TINY)
    images = tf.random.stateless_uniform([2, 64, 64, 3], [3, 4])
    assert [tuple(m.shape[1:3]) for m in model.features(images, training=False)] == [(8, 8), (4, 4), (2, 2),
                                                                                      (1, 1)]
    for training in (True, False):
        loc, logits = model(images, training=training)
        assert loc.shape == (2, 340, 4) and logits.shape == (2, 340, 3) == (2, num_anchors(TINY), 3)
        assert np.all(np.isfinite(loc.numpy())) and np.all(np.isfinite(logits.numpy()))
    # Training updated the batch-norm statistics; no backbone conv has a bias, extras and heads do.
    assert not np.allclose(variables["ssd/backbone/stem/bn/moving_mean"].numpy(), 0.0)
    assert not any(p.startswith("ssd/backbone/") and p.endswith("/bias") for p in variables)
    assert {p for p in variables if p.endswith("/bias")} == (
        {f"ssd/extra{k}/conv{s}/bias" for k in (1, 2, 3) for s in ("1x1", "3x3")}
        | {f"ssd/head{k}/bias" for k in range(4)})


# ---------------------------------------------------------------- anchor order

def test_split_head_follows_the_anchor_order():
    """Flattened row n must be anchor n of anchors.default_boxes: kind outermost, then row, then column."""
    size, kinds, classes = 3, 4, 2
    image, step = 90, 30  # f_k = 3 = size, so cell (i, j) has centre ((j + .5) / 3, (i + .5) / 3)
    y = np.zeros([1, size, size, kinds * (4 + classes)], np.float32)
    for i in range(size):
        for j in range(size):
            for a in range(kinds):
                y[0, i, j, 4 * a:4 * a + 4] = [j, i, a, 7]  # loc channels 4a + k
                for c in range(classes):
                    y[0, i, j, 4 * kinds + a * classes + c] = 100 * a + 10 * i + j + 0.5 * c  # 4A + aC + c
    loc, conf = M.split_head(tf.constant(y), kinds, classes)
    loc, conf = loc.numpy()[0], conf.numpy()[0]
    assert loc.shape == (36, 4) and conf.shape == (36, 2)
    expected = [(j, i, a) for a in range(kinds) for i in range(size) for j in range(size)]
    assert [tuple(r) for r in loc[:, :3].astype(int)] == expected
    assert np.all(loc[:, 3] == 7)
    np.testing.assert_array_equal(conf[:, 0], [100 * a + 10 * i + j for j, i, a in expected])
    np.testing.assert_array_equal(conf[:, 1] - conf[:, 0], 0.5)
    # Cross-check against the anchor generator itself on a one-map layout.
    anchors = A.default_boxes(image, [size], [step], [20, 40], [[2]])
    j, i, a = loc[:, 0], loc[:, 1], loc[:, 2].astype(int)
    np.testing.assert_allclose(anchors[:, 0], (j + 0.5) / size, rtol=1e-6)
    np.testing.assert_allclose(anchors[:, 1], (i + 0.5) / size, rtol=1e-6)
    for kind in range(kinds):  # one (w, h) per kind
        assert len({tuple(r) for r in anchors[a == kind, 2:]}) == 1


# ---------------------------------------------------------------- layout

def test_feature_map_sizes_and_layout_checks():
    assert M.feature_map_sizes(ModelConfig()) == [38, 19, 10, 5, 3, 1]
    assert M.extra_kinds([38, 19, 10, 5, 3, 1]) == [M.STRIDED] * 3 + [M.VALID] * 2
    assert M.feature_map_sizes(TINY) == [8, 4, 2, 1]
    M.check_layout(ModelConfig())
    M.check_layout(ModelConfig(image_size=304))  # 304 / 8 = 38 too
    with pytest.raises(HarnessError, match=r"model.image_size=64 gives feature maps \[8, 4, 2, 1, 0, 0\].*"
                                           r"\[38, 19, 10, 5, 3, 1\].*297..304"):
        M.check_layout(ModelConfig(image_size=64))
    with pytest.raises(HarnessError, match="model.image_size=64"):
        M.SSD(make_runtime(RuntimeConfig(kind="default")), 0, ModelConfig(image_size=64), 1)
    with pytest.raises(HarnessError, match="extra_channels has 4 entries.*need 5"):
        M.check_layout(ModelConfig(extra_channels=[[8, 8]] * 4))
    with pytest.raises(HarnessError, match="from a 38x38 map to 12x12"):
        M.check_layout(ModelConfig(feature_sizes=[38, 12], extra_channels=[[8, 8]], steps=[8, 25],
                                   scales=[21, 45, 99], aspect_ratios=[[2], [2]]))
    with pytest.raises(HarnessError, match="model.blocks"):
        M.check_layout(ModelConfig(blocks=[3, 4]))


# ---------------------------------------------------------------- init

def test_fused_head_is_two_glorot_blocks_and_extras_are_glorot():
    cfg = dataclasses.replace(TINY, num_classes=81)
    _, _, v = build(cfg)
    kernel = v["ssd/head0/kernel"].numpy()  # in = 4 * width = 8 channels, 4 anchors
    assert kernel.shape == (3, 3, 8, 4 * (4 + 81))
    loc, conf = kernel[..., :16], kernel[..., 16:]
    loc_limit = math.sqrt(6 / (9 * 8 + 9 * 16))
    conf_limit = math.sqrt(6 / (9 * 8 + 9 * 4 * 81))
    assert 0.9 * loc_limit < np.abs(loc).max() <= loc_limit
    assert 0.9 * conf_limit < np.abs(conf).max() <= conf_limit
    assert np.abs(loc).max() > 2 * conf_limit  # not one block with the fused conv's fans
    assert not np.any(v["ssd/head0/bias"].numpy())
    k3 = v["ssd/extra1/conv3x3/kernel"].numpy()  # 3x3, 4 -> 8
    limit = math.sqrt(6 / (9 * 4 + 9 * 8))
    assert k3.shape == (3, 3, 4, 8) and 0.8 * limit < np.abs(k3).max() <= limit
    k1 = v["ssd/extra1/conv1x1/kernel"].numpy()  # 1x1, 8 -> 4
    assert np.abs(k1).max() <= math.sqrt(6 / (8 + 4))
    assert not np.any(v["ssd/extra1/conv1x1/bias"].numpy())


# ---------------------------------------------------------------- MLPerf tensor names

def _plan(cfg: ModelConfig) -> dict[str, str]:
    workload = types.SimpleNamespace(MLPERF_KEY="ssd", NAME="ssd",
                                     weights_initialization_map=lambda: T.weights_initialization_map(cfg))
    return weights_init.plan(workload, ["1.1.0"], "closed")


def test_reference_structure_fills_the_119_names_with_existing_variables():
    names = weights_init.required_tensors("ssd", "1.1.0", "closed")
    assert len(names) == 119
    cfg = ModelConfig(width=2, extra_channels=[[2, 2]] * 5)  # no forward pass: image size is irrelevant
    _, _, v = build(cfg)
    plan = _plan(cfg)
    assert set(plan) == set(names) and len(set(plan.values())) == 119
    assert all(p in v for p in plan.values())
    assert T.weights_initialization_map(cfg) == T.weights_initialization_map(ModelConfig())  # width-free
    shape = {n: tuple(v[p].shape) for n, p in plan.items()}
    # The downsample conv comes after its block's two convs (MXNet creation order).
    assert shape["ssd0_resnetmlperf0_stage2_conv2_weight"] == (1, 1, 2, 4)
    assert shape["ssd0_resnetmlperf0_stage3_conv2_weight"] == (1, 1, 4, 8)
    assert shape["ssd0_resnetmlperf0_stage3_conv3_weight"] == (3, 3, 8, 8)
    assert shape["ssd0_resnetmlperf0_conv0_weight"] == (7, 7, 3, 2)
    assert shape["ssd0_expand_trans_conv0_weight"][:2] == (1, 1)
    assert shape["ssd0_expand_conv4_weight"][:2] == (3, 3)
    assert shape["ssd0_convpredictor1_conv0_weight"] == (3, 3, 2, 6 * 85)


def test_other_structures_lack_names_and_are_refused():
    with pytest.raises(HarnessError, match="cannot name"):
        _plan(TINY)
    deeper = T.weights_initialization_map(ModelConfig(blocks=[4, 4, 6]))
    assert not any("_stage1_" in n for n in deeper) and any("_stage2_" in n for n in deeper)
    with pytest.raises(HarnessError, match="cannot name"):
        _plan(ModelConfig(blocks=[4, 4, 6]))


# ---------------------------------------------------------------- backbone checkpoint

def _save(prefix: str, tensors: dict[str, np.ndarray]) -> str:
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=list(tensors), shape_and_slices=[""] * len(tensors),
                      tensors=[tf.constant(t) for t in tensors.values()])
    return prefix


def _backbone_values(variables: dict) -> dict[str, np.ndarray]:
    return {p: v.numpy() + 0.25 for p, v in variables.items() if p.startswith("ssd/backbone/")}


RENAME = {r"^ssd/backbone/": "resnet34/", r"/bn/moving_variance$": "/bn/var"}


def _renamed(path: str) -> str:
    return path.replace("ssd/backbone/", "resnet34/").replace("/bn/moving_variance", "/bn/var")


@pytest.mark.parametrize("mirrored", [False, True])
def test_backbone_checkpoint_round_trip_with_renaming(tmp_path, mirrored):
    _, _, source = build(TINY, seed=1)
    values = _backbone_values(source)
    prefix = _save(str(tmp_path / "ckpt"), {_renamed(p): x for p, x in values.items()})
    cfg = dataclasses.replace(TINY, backbone_checkpoint=prefix, backbone_checkpoint_names=dict(RENAME))
    runtime = (StrategyRuntime("mirrored", tf.distribute.MirroredStrategy(["/cpu:0"]), "CPU", "float32", False)
               if mirrored else None)
    runtime, _, target = build(cfg, runtime, seed=2)
    head_before = target["ssd/head0/kernel"].numpy()
    assert M.load_backbone(runtime, cfg) == len(values)
    for p, x in values.items():
        np.testing.assert_array_equal(target[p].numpy(), x, err_msg=p)
    np.testing.assert_array_equal(target["ssd/head0/kernel"].numpy(), head_before)


def test_backbone_checkpoint_errors_name_variable_and_key(tmp_path):
    runtime, _, v = build(TINY)
    values = {_renamed(p): x for p, x in _backbone_values(v).items()}
    ok = dict(backbone_checkpoint_names=dict(RENAME))

    def load(prefix: str, **kw) -> None:
        M.load_backbone(runtime, dataclasses.replace(TINY, backbone_checkpoint=prefix, **kw))

    with pytest.raises(HarnessError, match="cannot read a TF checkpoint"):
        load(str(tmp_path / "nowhere"), **ok)
    with pytest.raises(HarnessError, match="is empty"):
        load("")

    full = _save(str(tmp_path / "full"), values)
    n = len(values)
    with pytest.raises(HarnessError, match=rf"{n} of {n} backbone variables have no tensor.*"
                                           r"ssd/backbone/stem/conv/kernel -> ssd/backbone/stem/conv/kernel.*"
                                           rf"and {n - 4} more.*backbone_checkpoint_names"):
        load(full)  # identity names against a renamed checkpoint

    gone = "resnet34/stage2/block1/proj/bn/var"
    partial = _save(str(tmp_path / "partial"), {k: x for k, x in values.items() if k != gone})
    with pytest.raises(HarnessError, match=rf"1 of {n} .*ssd/backbone/stage2/block1/proj/bn/moving_variance "
                                           rf"-> {gone}\)"):
        load(partial, **ok)

    before = v["ssd/backbone/stem/conv/kernel"].numpy()
    bad = dict(values, **{"resnet34/stem/conv/kernel": np.zeros([3, 3, 3, 2], np.float32)})
    with pytest.raises(HarnessError, match=r"ssd/backbone/stem/conv/kernel \[7, 7, 3, 2\] vs "
                                           r"resnet34/stem/conv/kernel \[3, 3, 3, 2\]"):
        load(_save(str(tmp_path / "bad"), bad), **ok)
    np.testing.assert_array_equal(v["ssd/backbone/stem/conv/kernel"].numpy(), before)  # nothing assigned

    with pytest.raises(HarnessError, match="backbone_checkpoint_names: bad regex"):
        load(full, backbone_checkpoint_names={"(": "x"})
