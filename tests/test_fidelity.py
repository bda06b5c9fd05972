"""Closed-division fidelity to the MLPerf references: ResNet init, SGD exclusions, ImageNet preprocessing,
BERT dropout seeds."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.bert.config import ModelConfig as BertModelConfig
from benchmarks.bert.model import Bert
from benchmarks.resnet import data as resnet_data
from benchmarks.resnet.config import DataConfig
from benchmarks.resnet.model import ResNet
from harness import config as config_lib
from harness.config import RuntimeConfig
from harness.nn.optim import SGDMomentum
from harness.runtime import make_runtime
from harness.runtime.base import InputContext

from conftest import REPO

pytestmark = pytest.mark.quick

REFERENCE = os.path.join(REPO, "configs", "resnet", "reference.yaml")
SMOKE = os.path.join(REPO, "configs", "resnet", "smoke.yaml")


def build_resnet(config: str, overrides: list[str] = ()):
    cfg = config_lib.load_config(config, ["runtime.kind=default", *overrides])
    runtime = make_runtime(RuntimeConfig(kind="default"))
    with runtime.scope():
        ResNet(runtime, 1, cfg.model, cfg.data.num_classes, 1)
    return cfg, runtime, {v.path: v for v in runtime.variables()}


# ------------------------------------------------------------------------------------ ResNet init

@pytest.fixture(scope="module")
def resnet50():
    return build_resnet(REFERENCE)


@pytest.mark.parametrize("path, fan_in", [
    ("resnet/stem/conv/kernel", 7 * 7 * 3),                      # fan-out would be 49 * 64: 4.6x smaller std
    ("resnet/stage2/block1/a/conv/kernel", 256),                 # 1x1 reduce
    ("resnet/stage2/block1/b/conv/kernel", 9 * 128),             # 3x3 (stride 2 in v1.5)
    ("resnet/stage2/block1/c/conv/kernel", 128),                 # 1x1 expand: fan-out would be 4x larger
    ("resnet/stage3/block1/proj/conv/kernel", 512),              # projection
])
def test_conv_init_is_fan_in_he_normal(resnet50, path, fan_in):
    """TF2 reference: Keras he_normal = truncated normal with variance 2 / fan_in."""
    w = resnet50[2][path].variable.numpy()
    assert math.prod(w.shape[:-1]) == fan_in
    want = math.sqrt(2.0 / fan_in)
    assert np.std(w) == pytest.approx(want, rel=0.05)
    assert np.abs(w).max() <= 2 * want / 0.87962566103423978 + 1e-6  # truncated at two stddevs


def test_last_bn_gamma_of_each_block_starts_at_one_unless_asked(resnet50):
    """Both TF references start every BN gamma at 1; zero-init is a named choice (Google's TPU code)."""
    cfg, _, variables = resnet50
    assert cfg.model.zero_init_residual is False
    gammas = [p for p in variables if p.endswith("/c/bn/gamma")]
    assert len(gammas) == 16 and all(np.all(variables[p].variable.numpy() == 1.0) for p in gammas)
    _, _, zero = build_resnet(SMOKE, ["model.zero_init_residual=true"])
    assert all(np.all(v.variable.numpy() == 0.0) for p, v in zero.items() if p.endswith("/c/bn/gamma"))


# ------------------------------------------------------------------------------------ SGD exclusions

def test_sgd_decays_the_fc_bias_and_lars_does_not():
    """Reference SGD: L2 on every variable whose name lacks 'bn'; LARS skips batch norm and biases."""
    for name, bias_excluded in (("sgd", False), ("lars", True)):
        cfg, runtime, variables = build_resnet(SMOKE, [f"optimizer.name={name}"])
        opt = SGDMomentum(runtime, list(variables.values()), lambda s: tf.constant(0.1),
                          exclude_from_decay=cfg.optimizer.exclude_from_decay)
        assert opt.excluded("resnet/fc/bias") is bias_excluded
        assert opt.excluded("resnet/stem/bn/gamma") and opt.excluded("resnet/stage1/block1/c/bn/beta")
        assert not opt.excluded("resnet/fc/kernel") and not opt.excluded("resnet/stem/conv/kernel")
    explicit = config_lib.load_config(SMOKE, ["optimizer.name=sgd", "optimizer.exclude_from_decay=[x]"])
    assert explicit.optimizer.exclude_from_decay == ["x"]


# ---------------------------------------------------------------------------------- preprocessing

def test_reference_config_uses_the_reference_preprocessing():
    for config in ("reference.yaml", "smoke-tfrecord.yaml", "gpu-8x.yaml", "tpu-v3-32.yaml"):
        cfg = config_lib.load_config(os.path.join(REPO, "configs", "resnet", config))
        assert cfg.data.preprocessing == "reference", config
    assert DataConfig().preprocessing == "reference"


def crop_areas(preset: str, n: int = 300) -> np.ndarray:
    # An object box of a quarter of the image: with the whole image as the box, min_object_covered 0.1
    # alone keeps every crop above 10% of the image and the two area ranges could not differ.
    prep = resnet_data.PREPROCESSING[preset]
    box = tf.constant([[[0.25, 0.25, 0.75, 0.75]]])
    areas = []
    for i in range(n):
        _, size = resnet_data.sample_crop(tf.constant([200, 200, 3]), box, tf.constant([5, i], tf.int64), prep)
        areas.append(float(size[0] * size[1]) / 200 ** 2)
    return np.array(areas)


def test_training_crop_area_ranges():
    """Reference: area 5%-100% (100 attempts); google_tpu: 8%-100% (10 attempts)."""
    ref, tpu = crop_areas("reference"), crop_areas("google_tpu")
    assert ref.min() >= 0.05 - 0.01 and ref.min() < 0.08 and ref.max() <= 1.0
    assert tpu.min() >= 0.08 - 0.01


def box_record(boxes: list[tuple[float, float, float, float]]) -> bytes:
    pixels = tf.cast(tf.fill([40, 60, 3], 128), tf.uint8)
    feature = {"image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(
                   value=[tf.io.encode_jpeg(pixels).numpy()])),
               "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[3]))}
    for i, k in enumerate(resnet_data.BOX_KEYS):
        feature[f"image/object/bbox/{k}"] = tf.train.Feature(
            float_list=tf.train.FloatList(value=[b[i] for b in boxes]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def test_dataset_boxes_are_read_and_cover_the_crop_sampler():
    source = resnet_data.TFRecordSource(DataConfig(source="tfrecord", num_classes=10, image_size=32))
    _, label, boxes = source.parse_with_boxes(tf.constant(box_record([(0.1, 0.2, 0.5, 0.6)])))
    np.testing.assert_allclose(boxes.numpy(), [[[0.1, 0.2, 0.5, 0.6]]], rtol=1e-6)
    assert int(label) == 2
    _, _, none = source.parse_with_boxes(tf.constant(box_record([])))
    assert none.shape == (1, 0, 4)
    # With a box in the top-left corner, every crop must overlap it (min_object_covered 0.1).
    prep = resnet_data.PREPROCESSING["reference"]
    corner = tf.constant([[[0.0, 0.0, 0.2, 0.2]]])
    for i in range(50):
        begin, size = resnet_data.sample_crop(tf.constant([200, 200, 3]), corner, tf.constant([1, i], tf.int64),
                                              prep)
        assert int(begin[0]) < 40 and int(begin[1]) < 40, (begin.numpy(), size.numpy())


def test_eval_resizes_the_shorter_side_then_crops_the_centre():
    """Reference eval: aspect-preserving resize of the shorter side to 256 (x 8/7 of the size), central crop."""
    image = tf.cast(tf.reshape(tf.range(60 * 90 * 3) % 251, [60, 90, 3]), tf.uint8)
    ref = resnet_data.PREPROCESSING["reference"]
    out = resnet_data.eval_crop(image, 224, ref)
    resized = tf.compat.v1.image.resize(image, [256, 384], method=tf.image.ResizeMethod.BILINEAR)
    np.testing.assert_allclose(out.numpy(), resized[16:240, 80:304].numpy())
    norm = resnet_data.normalize(tf.fill([2, 2, 3], 128.0), ref)
    np.testing.assert_allclose(norm.numpy()[0, 0], [128 - 123.68, 128 - 116.78, 128 - 103.94], rtol=1e-5)
    tpu = resnet_data.PREPROCESSING["google_tpu"]
    assert resnet_data.eval_crop(image, 32, tpu).shape == (32, 32, 3)
    assert abs(float(tf.reduce_mean(resnet_data.normalize(tf.fill([2, 2, 3], 117.0), tpu)))) < 0.1


def test_both_presets_feed_a_tfrecord_train_pipeline(tmp_path):
    from benchmarks.resnet.tfrecord_writer import write_imagenet_tfrecords

    write_imagenet_tfrecords(str(tmp_path), 16, 4, image_size=40, num_classes=10, train_shards=1, eval_shards=1)
    for preset in ("reference", "google_tpu"):
        source = resnet_data.TFRecordSource(DataConfig(source="tfrecord", data_dir=str(tmp_path), image_size=32,
                                                       num_classes=10, preprocessing=preset))
        batch = next(iter(source.train(InputContext(1, 0, 4, seed=1)).batch(4)))
        assert batch["image"].shape == (4, 32, 32, 3)
        assert source.eval_parse(next(iter(source.eval_records())))["image"].shape == (32, 32, 3)


# ----------------------------------------------------------------------------------- BERT dropout

@pytest.fixture
def recorded_dropout(monkeypatch):
    """Records (shape, seed) of every dropout call in the BERT model and its attention blocks."""
    import benchmarks.bert.model as bert_model
    import harness.nn.layers as layers

    calls: list[tuple[tuple[int, ...], tuple[int, int]]] = []
    real = layers.dropout

    def recording(x, rate, seed):
        if rate and seed is not None:
            calls.append((tuple(x.shape), tuple(int(s) for s in seed.numpy())))
        return real(x, rate, seed)

    monkeypatch.setattr(bert_model, "dropout", recording)
    monkeypatch.setattr(layers, "dropout", recording)
    return calls


def mask(shape, seed) -> np.ndarray:
    return tf.nn.experimental.stateless_dropout(tf.ones(shape), 0.5, tf.constant(seed, tf.int64)).numpy() != 0


def test_dropout_masks_differ_across_layers_sites_and_seeds(recorded_dropout):
    cfg = BertModelConfig(vocab_size=32, hidden_size=16, num_layers=3, num_heads=2, ff_size=32, max_position=8,
                          hidden_dropout=0.5, attention_dropout=0.5)
    runtime = make_runtime(RuntimeConfig(kind="default"))
    with runtime.scope():
        model = Bert(runtime, 0, cfg)
    batch = {"input_ids": tf.ones([2, 8], tf.int32), "input_mask": tf.ones([2, 8], tf.int32),
             "segment_ids": tf.zeros([2, 8], tf.int32), "masked_lm_positions": tf.zeros([2, 2], tf.int32)}
    runs = {}
    for step_seed in ((7, 0), (7, 16), (8, 0)):  # two steps, and another replica/run word
        recorded_dropout.clear()
        model(batch, training=True, seed=tf.constant(step_seed, tf.int64))
        runs[step_seed] = list(recorded_dropout)
    first = runs[(7, 0)]
    assert len(first) == 1 + 3 * cfg.num_layers  # embeddings + (attention probs, attention out, FFN) per layer
    assert len({seed for _, seed in first}) == len(first)
    hidden = [(shape, seed) for shape, seed in first if shape == (2, 8, 16)]
    masks = [mask(shape, seed) for shape, seed in hidden]
    assert all(not np.array_equal(a, b) for i, a in enumerate(masks) for b in masks[i + 1:])
    # Another step or another seed word: no dropout seed of one forward pass reappears in the other
    # (before, layer i at step t reused layer i-1's seeds from step t + 16).
    for other in ((7, 16), (8, 0)):
        assert not {s for _, s in first} & {s for _, s in runs[other]}
        assert not np.array_equal(mask(*first[-1]), mask(*runs[other][-1]))
    recorded_dropout.clear()
    model(batch, training=False, seed=tf.constant((7, 0), tf.int64))
    assert recorded_dropout == []  # no dropout at eval
