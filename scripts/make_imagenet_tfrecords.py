"""Writes small ImageNet-layout TFRecords of learnable synthetic JPEGs (offline demos, campaigns, tests).

    python scripts/make_imagenet_tfrecords.py OUT_DIR [--train 4096] [--eval 1000] [--size 40]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.resnet.tfrecord_writer import write_imagenet_tfrecords  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--train", type=int, default=4096)
    p.add_argument("--eval", type=int, default=1000)
    p.add_argument("--size", type=int, default=40)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    train, val = write_imagenet_tfrecords(a.out_dir, a.train, a.eval, a.size, a.classes, seed=a.seed)
    print(f"wrote {len(train)} train and {len(val)} validation shards to {a.out_dir}")


if __name__ == "__main__":
    main()
