"""The `data.*` input techniques that change what the host computes give the model the same input."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from benchmarks.resnet import data as resnet_data
from harness.train import input_pipeline
from harness.train.input_pipeline import PipelineConfig, nbytes, pipeline_config, train_options

pytestmark = pytest.mark.quick


def test_normalize_on_device_matches_the_host_float_pipeline_to_half_a_grey_level():
    prep = resnet_data.PREPROCESSING["reference"]
    resized = tf.random.stateless_uniform([2, 8, 8, 3], [3, 4], 0.0, 255.0)
    sent = resnet_data.host_image(resized, True, prep)
    assert sent.dtype == tf.uint8
    on_device = resnet_data.device_image(sent, prep)
    on_host = resnet_data.host_image(resized, False, prep)
    assert on_host.dtype == on_device.dtype == tf.float32
    assert float(tf.reduce_max(tf.abs(on_device - on_host))) <= 0.5 + 1e-4
    assert resnet_data.device_image(on_host, prep) is on_host  # float input passes through


def test_images_in_the_compute_dtype_give_the_model_the_same_logits():
    """bfloat16 images from the host: the model casts its input to bfloat16 first, so it sees the same bits."""
    from benchmarks.resnet.config import ModelConfig
    from benchmarks.resnet.model import ResNet
    from harness.config import RuntimeConfig
    from harness.runtime import make_runtime

    prep = resnet_data.PREPROCESSING["reference"]
    resized = tf.random.stateless_uniform([2, 32, 32, 3], [3, 4], 0.0, 255.0)
    as_float = resnet_data.host_image(resized, False, prep)
    as_bf16 = resnet_data.host_image(resized, False, prep, tf.bfloat16)
    assert as_float.dtype == tf.float32 and as_bf16.dtype == tf.bfloat16
    runtime = make_runtime(RuntimeConfig(precision="bfloat16"))
    with runtime.scope():
        model = ResNet(runtime, 1, ModelConfig(width=8, blocks=[1, 1, 1, 1], stem="small"), 10, 1)
    a, b = model(as_float, training=True), model(as_bf16, training=True)
    assert a.dtype == b.dtype == tf.float32
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    cfg = resnet_data.DataConfig(source="tfrecord")
    assert resnet_data.image_dtype(cfg, tf.bfloat16) == tf.bfloat16
    cfg.images_in_compute_dtype = False
    assert resnet_data.image_dtype(cfg, tf.bfloat16) == tf.float32


def test_crop_before_decode_equals_decode_then_crop():
    image = tf.cast(tf.random.stateless_uniform([120, 160, 3], [1, 2], 0, 255), tf.uint8)
    jpeg = tf.io.encode_jpeg(image, quality=90)
    prep = resnet_data.PREPROCESSING["reference"]
    seed = tf.constant([5, 6], tf.int64)
    a = resnet_data.random_resized_crop_jpeg(jpeg, 32, seed, prep, decode_and_crop=True)
    b = resnet_data.random_resized_crop_jpeg(jpeg, 32, seed, prep, decode_and_crop=False)
    np.testing.assert_allclose(a.numpy(), b.numpy(), atol=2.0)


def test_options_and_defaults():
    assert isinstance(pipeline_config(object()), PipelineConfig)  # a workload without the keys
    cfg = PipelineConfig(threads=3)
    options = train_options(cfg)
    assert options.deterministic is False and options.threading.private_threadpool_size == 3
    assert train_options(cfg, synthetic=True).deterministic is True
    spec = {"image": tf.TensorSpec([4, 2, 3], tf.float32), "label": tf.TensorSpec([4], tf.int32)}
    assert nbytes(spec) == 4 * 2 * 3 * 4 + 4 * 4
    assert nbytes({"x": tf.TensorSpec([None, 2], tf.float32)}) is None


def test_resnet_normalization_as_bias_add_is_the_reference_subtraction_bit_for_bit():
    """`normalize` adds the negated means (a bias_add, far cheaper on the host than the broadcast subtraction):
    the same float32 values, for both preprocessings, on one image and on a batch (the uint8 path's device side)."""
    rng = np.random.default_rng(3)
    for shape in ((37, 41, 3), (2, 9, 7, 3)):
        x = tf.constant(rng.uniform(0, 255, size=shape).astype(np.float32))
        for prep in resnet_data.PREPROCESSING.values():
            want = ((x - resnet_data.MEAN_RGB) / resnet_data.STDDEV_RGB if prep.divide_by_stddev
                    else x - resnet_data.REFERENCE_MEAN_RGB)
            np.testing.assert_array_equal(resnet_data.normalize(x, prep).numpy(), want.numpy())


def test_ssd_normalize_on_device_sends_uint8_within_half_a_grey_level():
    """SSD's data.normalize_on_device: the host sends the resized pixels rounded to uint8 (with jitter draws
    under augment); the train step's scaled, jittered and normalized batch is the float pipeline's to the
    rounding (half a grey level before the jitter, which scales differences by its factors)."""
    from benchmarks.ssd import data as ssd_data
    from benchmarks.ssd.config import DataConfig, ModelConfig
    from harness.runtime.base import InputContext

    model, ctx = ModelConfig(image_size=32), InputContext(num_hosts=1, host_id=0, batch_size=4, seed=3)
    for augment in (True, False):
        cfg = dict(source="synthetic", train_samples=16, eval_samples=4, max_boxes=5, augment=augment)
        on = ssd_data.make_source(DataConfig(normalize_on_device=True, **cfg), model, tf.bfloat16)
        off = ssd_data.make_source(DataConfig(images_in_compute_dtype=False, scale_in_step=False, **cfg), model)
        assert on.train_image_dtype == tf.uint8 and off.train_image_dtype == tf.float32
        a = list(on.train(ctx).take(6).as_numpy_iterator())
        b = list(off.train(ctx).take(6).as_numpy_iterator())
        assert {el["image"].dtype for el in a} == {np.dtype(np.uint8)} and ("jitter" in a[0]) == augment
        for x, y in zip(a, b):
            for k in ("boxes", "labels") + (("jitter",) if augment else ()):
                np.testing.assert_array_equal(x[k], y[k])
            if augment:  # the [0, 1] pixels before the train step's jitter
                assert np.abs(x["image"] / 255.0 - y["image"]).max() <= 0.5 / 255 + 1e-6
        batch_a = {k: tf.constant(np.stack([el[k] for el in a])) for k in a[0]}
        batch_b = {k: tf.constant(np.stack([el[k] for el in b])) for k in b[0]}
        got, want = ssd_data.device_image(batch_a), ssd_data.device_image(batch_b)
        assert got.dtype == tf.float32
        # 0.5/255 over the smallest std is 0.0087; the jitter's contrast and saturation (<= 1.5 each) scale it.
        tolerance = 0.5 / 255 / min(ssd_data.STD_RGB) * (1.5 * 1.5 * 1.5 if augment else 1.0) + 1e-5
        assert float(tf.reduce_max(tf.abs(got - want))) <= tolerance
        if augment:  # crops resized: rounded, not the same pixels (unaugmented synthetic images are at size)
            assert float(tf.reduce_max(tf.abs(got - want))) > 0
        evals = on.eval_parse(next(iter(on.eval_records())))["image"]
        assert evals.dtype == tf.bfloat16  # eval images stay normalized in the compute dtype


def test_resnet_fused_normalize_and_cast_is_the_unfused_ops_bit_for_bit():
    """The host's normalize + cast as one XLA loop (`fused_normalize`): the same bits as the two TF ops, in a
    tf.data map as the pipeline calls it, for every dtype the host sends."""
    rng = np.random.default_rng(5)
    image = tf.constant(rng.uniform(0, 255, size=(24, 24, 3)).astype(np.float32))
    for prep in resnet_data.PREPROCESSING.values():
        for dtype in (tf.float32, tf.bfloat16, tf.float16):
            want = tf.cast(resnet_data.normalize(image, prep), dtype)
            ds = tf.data.Dataset.from_tensors(image).repeat(2).map(
                lambda x: resnet_data.host_image(x, False, prep, dtype), num_parallel_calls=2)
            for got in ds:
                assert got.dtype == dtype
                np.testing.assert_array_equal(tf.bitcast(got, tf.uint16 if dtype.size == 2 else tf.uint32).numpy(),
                                              tf.bitcast(want, tf.uint16 if dtype.size == 2 else tf.uint32).numpy())
    halves = tf.constant(np.concatenate([np.arange(-2, 258, 0.5), rng.uniform(-5, 260, 500)]).astype(np.float32))
    np.testing.assert_array_equal(input_pipeline.to_uint8(halves).numpy(),  # uint8 images (normalize_on_device)
                                  tf.cast(tf.clip_by_value(tf.round(halves), 0.0, 255.0), tf.uint8).numpy())


def test_resnet_flip_coin_is_the_reference_flips_coin_and_the_device_flip_its_mirror():
    """data.flip_on_device: the coin the host sends is the one tf.image.stateless_random_flip_left_right tosses,
    and the train step's flip of the unflipped resize is the host's flip: bit for bit where the preprocessing
    flips after its resize (google_tpu); for the reference (flip before the v1 resize) it is the mirror of the
    unflipped image with the same coin."""
    image = tf.cast(tf.random.stateless_uniform([90, 120, 3], [1, 2], 0, 255), tf.uint8)
    jpeg = tf.io.encode_jpeg(image, quality=90)
    coins = []
    for i in range(12):
        seed = tf.constant([5, i], tf.int64)
        coin = bool(resnet_data.flip_coin(seed))
        coins.append(coin)
        flipped = tf.image.stateless_random_flip_left_right(image, seed)
        np.testing.assert_array_equal(flipped.numpy(), (image[:, ::-1] if coin else image).numpy())
        for name, prep in resnet_data.PREPROCESSING.items():
            host = resnet_data.random_resized_crop_jpeg(jpeg, 24, seed, prep)
            unflipped = resnet_data.random_resized_crop_jpeg(jpeg, 24, seed, prep, flip=False)
            crop_coin = bool(resnet_data.flip_coin(seed + 1))  # the crop's flip draws from seed + 1
            on_device = resnet_data.flip_where(unflipped[None], tf.constant([crop_coin]))[0]
            if name == "google_tpu" or not crop_coin:
                np.testing.assert_array_equal(on_device.numpy(), host.numpy())
            else:
                np.testing.assert_array_equal(on_device.numpy(), unflipped[:, ::-1].numpy())
    assert True in coins and False in coins


def test_resnet_normalize_in_step_is_the_host_normalization_bit_for_bit():
    """data.normalize_in_step: the host sends the resized float32 pixels; the train step's normalization (then
    the model's cast to its compute dtype) gives the bits the host's normalized images had, with and without
    XLA; the coin travels with the example and flips the batch's images on the device."""
    rng = np.random.default_rng(7)
    resized = tf.constant(rng.uniform(0, 255, size=(3, 16, 16, 3)).astype(np.float32))
    for prep in resnet_data.PREPROCESSING.values():
        for dtype in (tf.float32, tf.bfloat16):
            host = tf.stack([resnet_data.host_image(x, False, prep, dtype) for x in resized])
            sent = tf.stack([resnet_data.host_image(x, False, prep, dtype, in_step=True) for x in resized])
            assert sent.dtype == tf.float32
            steps = [lambda x: resnet_data.device_image(x, prep, raw=True)]
            if not prep.divide_by_stddev:  # XLA may multiply by the stddevs' reciprocals
                steps.append(tf.function(steps[0], jit_compile=True))
            for step in steps:
                got = tf.cast(step(sent), dtype)
                np.testing.assert_array_equal(tf.bitcast(got, tf.uint16 if dtype.size == 2 else tf.uint32).numpy(),
                                              tf.bitcast(host, tf.uint16 if dtype.size == 2 else tf.uint32).numpy())
    cfg = resnet_data.DataConfig(source="tfrecord")
    assert cfg.normalize_in_step and cfg.flip_on_device  # the defaults
    source = resnet_data.TFRecordSource(cfg, tf.bfloat16)
    assert source.normalizes_in_step and source.train_image_dtype == tf.float32
    batch = {"image": resized, "label": tf.zeros([3], tf.int32), "flip": tf.constant([True, False, True])}
    want = resnet_data.normalize(tf.stack([resized[0, :, ::-1], resized[1], resized[2, :, ::-1]]), source.prep)
    np.testing.assert_array_equal(resnet_data.train_image(batch, source).numpy(), want.numpy())
    features = resnet_data.train_features(resized[0], tf.constant(1), tf.constant([5, 3], tf.int64), cfg,
                                          source.prep, tf.bfloat16)
    assert set(features) == {"image", "label", "flip"} and features["image"].dtype == tf.float32
    assert bool(features["flip"]) == bool(resnet_data.flip_coin(tf.constant([5, 3], tf.int64) + 1))
    cfg.normalize_on_device = True  # uint8 takes precedence
    assert not resnet_data.TFRecordSource(cfg, tf.bfloat16).normalizes_in_step
    assert resnet_data.train_image_dtype(cfg, tf.bfloat16) == tf.uint8


def test_sharded_records_read_in_turn_hold_the_same_records(tmp_path):
    """data.read_threads=1 (the files read in turn by the pipeline's thread) reads every record once per pass,
    like the parallel reads."""
    from harness.runtime.base import InputContext
    from harness.train.datafiles import sharded_records

    files = []
    for k in range(3):
        files.append(str(tmp_path / f"f{k}"))
        with tf.io.TFRecordWriter(files[-1]) as w:
            for i in range(5):
                w.write(f"{k}-{i}".encode())
    ctx = InputContext(num_hosts=1, host_id=0, batch_size=1, seed=1)
    epochs = {t: sorted(sharded_records(files, ctx, 4, cycle_length=2, deterministic=None, repeat=False,
                                        read_threads=t).as_numpy_iterator()) for t in (0, 1, 2)}
    assert epochs[0] == epochs[1] == epochs[2] == sorted(f"{k}-{i}".encode() for k in range(3) for i in range(5))


def test_resnet_boxes_parsed_ragged_equal_the_varlen_parse():
    """The record's boxes as RaggedFeatures (dense per record): the values VarLenFeature + to_dense gave."""
    source = resnet_data.TFRecordSource(resnet_data.DataConfig(source="tfrecord"))
    for boxes in ([], [(0.1, 0.2, 0.5, 0.6)], [(0.0, 0.1, 0.9, 1.0), (0.3, 0.3, 0.4, 0.5), (0.2, 0.0, 0.6, 0.7)]):
        f = {"image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"jpeg"])),
             "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[3]))}
        for i, k in enumerate(resnet_data.BOX_KEYS):
            f[f"image/object/bbox/{k}"] = tf.train.Feature(float_list=tf.train.FloatList(value=[b[i] for b in boxes]))
        record = tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString()
        _, _, got = source.parse_with_boxes(tf.constant(record))
        ex = tf.io.parse_single_example(record, {f"image/object/bbox/{k}": tf.io.VarLenFeature(tf.float32)
                                                 for k in resnet_data.BOX_KEYS})
        want = tf.stack([tf.sparse.to_dense(ex[f"image/object/bbox/{k}"]) for k in resnet_data.BOX_KEYS], -1)[None]
        assert got.shape == (1, len(boxes), 4)
        np.testing.assert_array_equal(got.numpy(), want.numpy())
