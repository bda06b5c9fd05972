"""ResNet inputs: ImageNet TFRecords, TFDS imagenet2012, or a learnable synthetic image set.

Train pipelines are sharded per host, shuffled, repeated and decoded in parallel. Eval sources return
raw records in a fixed order; the harness pads, shards and parses them so each eval example counts once.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import tensorflow as tf

from harness.datafiles import list_files, sharded_records
from harness.errors import HarnessError
from harness.runtime.base import InputContext

from benchmarks.resnet.config import DataConfig

MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STDDEV_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)
CROP_PADDING = 32


def normalize(image: tf.Tensor) -> tf.Tensor:
    return (tf.cast(image, tf.float32) - MEAN_RGB) / STDDEV_RGB


# --------------------------------------------------------------------------------- preprocessing

def random_resized_crop_jpeg(encoded: tf.Tensor, size: int, seed: tf.Tensor) -> tf.Tensor:
    """MLPerf training crop: area 8%-100%, aspect 3/4-4/3, decoding only the crop window."""
    shape = tf.io.extract_jpeg_shape(encoded)
    begin, crop, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape, tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=seed, min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    y, x, _ = tf.unstack(begin)
    h, w, _ = tf.unstack(crop)
    image = tf.image.decode_and_crop_jpeg(encoded, tf.stack([y, x, h, w]), channels=3)
    image = tf.image.resize(image, [size, size], method="bilinear")
    return tf.image.stateless_random_flip_left_right(image, seed + 1)


def center_crop(image: tf.Tensor, size: int) -> tf.Tensor:
    """MLPerf eval crop: central size/(size+32) of the shorter side, resized to size x size."""
    shape = tf.shape(image)
    h, w = shape[0], shape[1]
    crop = tf.cast(size / (size + CROP_PADDING) * tf.cast(tf.minimum(h, w), tf.float32), tf.int32)
    y, x = (h - crop + 1) // 2, (w - crop + 1) // 2
    image = image[y:y + crop, x:x + crop]
    return tf.image.resize(image, [size, size], method="bilinear")


def random_resized_crop_decoded(image: tf.Tensor, size: int, seed: tf.Tensor) -> tf.Tensor:
    begin, crop, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image), tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=seed, min_object_covered=0.1,
        aspect_ratio_range=(3 / 4, 4 / 3), area_range=(0.08, 1.0), max_attempts=10,
        use_image_if_no_bounding_boxes=True)
    image = tf.slice(image, begin, crop)
    image = tf.image.resize(image, [size, size], method="bilinear")
    return tf.image.stateless_random_flip_left_right(image, seed + 1)


# ------------------------------------------------------------------------------------ TFRecords

FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}


class TFRecordSource:
    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg

    def files(self, pattern: str) -> list[str]:
        return list_files(self.cfg.data_dir, pattern, "ImageNet shards")

    def validate(self) -> None:
        self.files(self.cfg.train_pattern)
        self.files(self.cfg.eval_pattern)

    def parse(self, record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        ex = tf.io.parse_single_example(record, FEATURES)
        label = tf.cast(ex["image/class/label"], tf.int32) - self.cfg.label_offset
        # A wrong label_offset would otherwise give all-zero one-hot targets and train on silently.
        check = tf.debugging.Assert(
            tf.logical_and(label >= 0, label < self.cfg.num_classes),
            ["corrupt or mislabeled record: image/class/label minus data.label_offset is outside "
             "[0, data.num_classes):", label])
        with tf.control_dependencies([check]):
            return tf.identity(ex["image/encoded"]), tf.identity(label)

    def train(self, ctx: InputContext) -> tf.data.Dataset:
        ds = sharded_records(self.files(self.cfg.train_pattern), ctx, self.cfg.shuffle_buffer,
                             cycle_length=16, deterministic=False)
        size = self.cfg.image_size
        base = tf.constant([ctx.seed, ctx.host_id], tf.int64)

        def preprocess(index: tf.Tensor, record: tf.Tensor) -> dict[str, tf.Tensor]:
            encoded, label = self.parse(record)
            seed = tf.stack([base[0] * 1000003 + base[1], index])
            return {"image": normalize(random_resized_crop_jpeg(encoded, size, seed)), "label": label}

        return ds.enumerate().map(preprocess, num_parallel_calls=tf.data.AUTOTUNE, deterministic=False)

    def eval_records(self) -> tf.data.Dataset:
        return tf.data.TFRecordDataset(self.files(self.cfg.eval_pattern))

    def eval_parse(self, record: tf.Tensor) -> dict[str, tf.Tensor]:
        encoded, label = self.parse(record)
        image = tf.image.decode_jpeg(encoded, channels=3)
        return {"image": normalize(center_crop(image, self.cfg.image_size)), "label": label}


# ----------------------------------------------------------------------------------------- TFDS

class TFDSSource:
    """imagenet2012 (or any image classification dataset) from a local TFDS data dir; no downloads."""

    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg

    def builder(self) -> Any:
        import tensorflow_datasets as tfds

        try:
            return tfds.builder(self.cfg.tfds_name, data_dir=self.cfg.data_dir or None)
        except Exception as e:  # noqa: BLE001 - tfds raises many types for a missing dataset
            raise HarnessError(f"TFDS dataset {self.cfg.tfds_name} not found in {self.cfg.data_dir!r}: "
                               f"{str(e).splitlines()[0]}") from None

    def validate(self) -> None:
        if self.cfg.data_dir and not os.path.isdir(self.cfg.data_dir):
            raise HarnessError(f"data.data_dir {self.cfg.data_dir} does not exist")

    def _load(self, split: str, shuffle: bool, ctx: InputContext | None) -> tf.data.Dataset:
        import tensorflow_datasets as tfds

        read_config = tfds.ReadConfig(shuffle_seed=ctx.seed if ctx else None,
                                      input_context=(tf.distribute.InputContext(ctx.num_hosts, ctx.host_id)
                                                     if ctx and ctx.num_hosts > 1 else None))
        try:
            return self.builder().as_dataset(split=split, shuffle_files=shuffle, read_config=read_config,
                                             decoders=None)
        except Exception as e:  # noqa: BLE001
            raise HarnessError(f"cannot read TFDS {self.cfg.tfds_name}[{split}] from {self.cfg.data_dir!r}: "
                               f"{str(e).splitlines()[0]}") from None

    def train(self, ctx: InputContext) -> tf.data.Dataset:
        ds = self._load("train", True, ctx).repeat().shuffle(self.cfg.shuffle_buffer, seed=ctx.seed)
        size = self.cfg.image_size

        def preprocess(index: tf.Tensor, ex: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
            seed = tf.stack([tf.constant(ctx.seed * 1000003 + ctx.host_id, tf.int64), index])
            image = random_resized_crop_decoded(ex["image"], size, seed)
            return {"image": normalize(image), "label": tf.cast(ex["label"], tf.int32)}

        return ds.enumerate().map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)

    def eval_records(self) -> tf.data.Dataset:
        return self._load("validation", False, None)

    def eval_parse(self, ex: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return {"image": normalize(center_crop(ex["image"], self.cfg.image_size)),
                "label": tf.cast(ex["label"], tf.int32)}


# ------------------------------------------------------------------------------------ synthetic

class SyntheticSource:
    """Learnable images: a smooth random prototype per class plus pixel noise.

    Deterministic from `synthetic_seed` (the data) and the run seed (the order). A fraction
    `synthetic_label_noise` of images shows another class's prototype, which keeps accuracy below 1.0
    (the checker rejects 1.0) while a small ResNet still passes 0.759 within a few epochs. Train and
    eval images come from disjoint index streams.
    """

    EVAL_STREAM = 1 << 40

    def __init__(self, cfg: DataConfig) -> None:
        self.cfg = cfg
        rng = np.random.default_rng(cfg.synthetic_seed)
        low = rng.normal(size=(cfg.num_classes, 4, 4, 3)).astype(np.float32)
        self.prototypes = tf.image.resize(low, [cfg.image_size, cfg.image_size], method="bicubic")

    def validate(self) -> None:
        pass

    def example(self, index: tf.Tensor) -> dict[str, tf.Tensor]:
        c = self.cfg
        seed = tf.stack([tf.constant(c.synthetic_seed, tf.int64), index])
        label = tf.random.stateless_uniform([], seed, 0, c.num_classes, dtype=tf.int32)
        u = tf.random.stateless_uniform([], seed + 1)
        other = tf.random.stateless_uniform([], seed + 2, 0, c.num_classes, dtype=tf.int32)
        shown = tf.where(u < c.synthetic_label_noise, other, label)
        noise = tf.random.stateless_normal([c.image_size, c.image_size, 3], seed + 3, stddev=c.synthetic_noise)
        return {"image": tf.gather(self.prototypes, shown) + noise, "label": label}

    CACHE_BYTES = 1 << 30

    def train(self, ctx: InputContext) -> tf.data.Dataset:
        c = self.cfg
        ds = tf.data.Dataset.range(c.train_samples).shard(ctx.num_hosts, ctx.host_id)
        per_host = -(-c.train_samples // ctx.num_hosts)
        if per_host * c.image_size ** 2 * 3 * 4 <= self.CACHE_BYTES:
            # Small sets are generated once (during the first epoch) and replayed from memory, so later
            # epochs leave the CPU to the model, as a real input pipeline on its own hosts would.
            ds = ds.map(self.example, num_parallel_calls=tf.data.AUTOTUNE).cache()
            return ds.shuffle(min(per_host, c.shuffle_buffer), seed=ctx.seed,
                              reshuffle_each_iteration=True).repeat()
        ds = ds.shuffle(min(per_host, c.shuffle_buffer), seed=ctx.seed, reshuffle_each_iteration=True).repeat()
        return ds.map(self.example, num_parallel_calls=tf.data.AUTOTUNE)

    def eval_records(self) -> tf.data.Dataset:
        return tf.data.Dataset.range(self.EVAL_STREAM, self.EVAL_STREAM + self.cfg.eval_samples)

    def eval_parse(self, index: tf.Tensor) -> dict[str, tf.Tensor]:
        return self.example(index)


def make_source(cfg: DataConfig) -> Any:
    return {"synthetic": SyntheticSource, "tfrecord": TFRecordSource, "tfds": TFDSSource}[cfg.source](cfg)
