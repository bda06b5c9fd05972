"""The CLI with the ResNet workload's eval step given an op that has no XLA kernel (a string
conversion), to see how a step that does not compile is reported."""
from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import tensorflow as tf  # noqa: E402

from benchmarks.resnet.workload import ResNetWorkload  # noqa: E402
from harness import cli  # noqa: E402

_eval_step = ResNetWorkload.eval_step


def broken_eval_step(self, batch, mask):
    out = dict(_eval_step(self, batch, mask))
    out["digits"] = tf.strings.length(tf.strings.as_string(out["correct"]))
    return out


ResNetWorkload.eval_step = broken_eval_step

if __name__ == "__main__":
    sys.argv[0] = "mlperf-harness"
    cli.entry_point()
