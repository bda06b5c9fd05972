"""The CLI with the ResNet workload's training loss given an op that has no XLA kernel (a string
conversion), to see how a step that does not compile is reported."""
from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import harness  # noqa: E402,F401 - before TensorFlow: it then starts without Keras (harness/__init__.py)
import tensorflow as tf  # noqa: E402

from benchmarks.resnet.workload import ResNetWorkload  # noqa: E402
from harness import cli  # noqa: E402

_loss = ResNetWorkload.loss


def broken_loss(self, batch, seed):
    terms = dict(_loss(self, batch, seed))
    digits = tf.strings.length(tf.strings.as_string(batch["label"]))
    first = next(iter(terms))
    terms[first].count = terms[first].count + 0 * tf.cast(tf.reduce_sum(digits), terms[first].count.dtype)
    return terms


ResNetWorkload.loss = broken_loss

if __name__ == "__main__":
    sys.argv[0] = "mlperf-harness"
    cli.entry_point()
