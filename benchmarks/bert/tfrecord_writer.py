"""Writes sequences in the MLPerf BERT TFRecord format (tests, and converting synthetic data to files)."""
from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np
import tensorflow as tf


def to_example(features: Mapping[str, np.ndarray]) -> tf.train.Example:
    def ints(v: np.ndarray) -> tf.train.Feature:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=np.asarray(v, np.int64).ravel().tolist()))

    feats = {k: ints(v) for k, v in features.items() if k != "masked_lm_weights"}
    feats["masked_lm_weights"] = tf.train.Feature(float_list=tf.train.FloatList(
        value=np.asarray(features["masked_lm_weights"], np.float32).ravel().tolist()))
    return tf.train.Example(features=tf.train.Features(feature=feats))


def write(path: str, examples: Iterable[Mapping[str, np.ndarray]]) -> int:
    n = 0
    with tf.io.TFRecordWriter(path) as w:
        for ex in examples:
            w.write(to_example(ex).SerializeToString())
            n += 1
    return n


def rows(arrays: Mapping[str, np.ndarray], start: int = 0, stop: int | None = None):
    """Per-example dicts from the column arrays SyntheticSource.generate returns."""
    n = len(next(iter(arrays.values())))
    for i in range(start, n if stop is None else stop):
        yield {k: v[i] for k, v in arrays.items()}
