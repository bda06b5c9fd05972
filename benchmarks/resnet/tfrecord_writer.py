"""Writes small ImageNet-layout TFRecord shards of learnable JPEG images (for tests and offline demos).

Same features and file names as the standard ImageNet conversion (`image/encoded` JPEG,
`image/class/label` 1..N, `train-00000-of-000NN`, `validation-00000-of-000NN`), with images drawn from
the synthetic source so that a small ResNet can learn them.
"""
from __future__ import annotations

import os

import tensorflow as tf

from benchmarks.resnet.config import DataConfig
from benchmarks.resnet.data import SyntheticSource


def _encoded(source: SyntheticSource, index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    ex = source.example(index)
    pixels = tf.cast(tf.clip_by_value(ex["image"] * 40.0 + 128.0, 0, 255), tf.uint8)
    return tf.io.encode_jpeg(pixels, quality=95), ex["label"]


def _example(encoded: bytes, label: int) -> bytes:
    feature = {
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label + 1])),
        "image/format": tf.train.Feature(bytes_list=tf.train.BytesList(value=[b"JPEG"])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_imagenet_tfrecords(out_dir: str, num_train: int, num_eval: int, image_size: int = 40,
                             num_classes: int = 10, train_shards: int = 4, eval_shards: int = 2,
                             seed: int = 0, noise: float = 0.6) -> tuple[list[str], list[str]]:
    """Returns the train and validation file lists it wrote."""
    os.makedirs(out_dir, exist_ok=True)
    source = SyntheticSource(DataConfig(image_size=image_size, num_classes=num_classes, synthetic_seed=seed,
                                        synthetic_noise=noise, synthetic_label_noise=0.1))
    written: dict[str, list[str]] = {}
    for split, count, shards, offset in (("train", num_train, train_shards, 0),
                                         ("validation", num_eval, eval_shards, SyntheticSource.EVAL_STREAM)):
        paths = [os.path.join(out_dir, f"{split}-{i:05d}-of-{shards:05d}") for i in range(shards)]
        writers = [tf.io.TFRecordWriter(p) for p in paths]
        # Drawn and encoded in a tf.data graph: one eager op at a time cost ~10 ms an image.
        images = tf.data.Dataset.range(offset, offset + count).map(lambda i: _encoded(source, i))
        for i, (encoded, label) in enumerate(images.as_numpy_iterator()):
            writers[i % shards].write(_example(encoded, int(label)))
        for w in writers:
            w.close()
        written[split] = paths
    return written["train"], written["validation"]
