"""Writes the synthetic shapes task as COCO TFRecords plus instances json (for tests and offline real-path runs).

The records follow tensorflow/tpu's create_coco_tf_record schema (PNG instead of JPEG so pixels round-trip
exactly), one tf.Example per image, images without boxes included, round-robin over
`<prefix>-%05d-of-%05d.tfrecord` shards; `with_label=False` writes the TF Object Detection API variant instead (no
image/object/class/label, so readers must map class/text through the json's category names, and no object
features at all for images without boxes). Next to them, `instances_<split>.json` is the COCO ground truth.

    python -m benchmarks.ssd.tfrecord_writer --out DIR [--train-images 4096 --val-images 512 --image-size 64]
"""
from __future__ import annotations

import argparse
import hashlib
import os
from typing import Sequence

import numpy as np
import tensorflow as tf

from benchmarks.ssd import synthetic_shapes


def _bytes(values: Sequence[bytes]) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=list(values)))


def _ints(values: Sequence[int]) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))


def _floats(values: Sequence[float]) -> tf.train.Feature:
    return tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in values]))


def coco_example(image: np.ndarray, image_id: int, boxes: np.ndarray, category_ids: Sequence[int],
                 names: dict[int, str], with_label: bool = True, filename: str = "",
                 image_format: str = "png") -> bytes:
    """One serialized tf.Example of an image (uint8 [H, W, 3]) and its boxes (ltrb normalized [N, 4], written as
    given, so tests can write bad ones) with raw category ids; names maps a category id to its class text.
    PNG keeps pixels exact (tests); JPEG (quality 90) is what COCO holds (input benchmarks)."""
    if image_format == "jpeg":
        encoded = tf.io.encode_jpeg(image, quality=90).numpy()
    else:
        encoded = tf.io.encode_png(image).numpy()
    height, width = image.shape[:2]
    boxes = np.asarray(boxes, np.float32).reshape(-1, 4)
    feature = {
        "image/encoded": _bytes([encoded]),
        "image/format": _bytes([image_format.encode()]),
        "image/filename": _bytes([(filename or f"{image_id:012d}.{image_format}").encode()]),
        "image/source_id": _bytes([str(image_id).encode()]),
        "image/key/sha256": _bytes([hashlib.sha256(encoded).hexdigest().encode()]),
        "image/height": _ints([height]),
        "image/width": _ints([width]),
    }
    if with_label or len(boxes):
        feature.update({
            "image/object/bbox/xmin": _floats(boxes[:, 0]),
            "image/object/bbox/ymin": _floats(boxes[:, 1]),
            "image/object/bbox/xmax": _floats(boxes[:, 2]),
            "image/object/bbox/ymax": _floats(boxes[:, 3]),
            "image/object/class/text": _bytes([names.get(int(c), str(c)).encode() for c in category_ids]),
            "image/object/is_crowd": _ints([0] * len(boxes)),
            "image/object/area": _floats((boxes[:, 2] - boxes[:, 0]) * width * (boxes[:, 3] - boxes[:, 1]) * height),
        })
        if with_label:
            feature["image/object/class/label"] = _ints(category_ids)
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_split(out_dir: str, prefix: str, data: dict[str, np.ndarray], num_shards: int,
                with_label: bool = True) -> list[str]:
    """Write `synthetic_shapes.generate` output as shards; image i goes to shard i % num_shards."""
    names = {cid: name for name, cid, _, _ in synthetic_shapes.CLASSES}
    paths = [os.path.join(out_dir, f"{prefix}-{s:05d}-of-{num_shards:05d}.tfrecord") for s in range(num_shards)]
    writers = [tf.io.TFRecordWriter(p) for p in paths]
    try:
        for i in range(len(data["images"])):
            k = int(data["num_boxes"][i])
            writers[i % num_shards].write(coco_example(data["images"][i], int(data["image_ids"][i]),
                                                       data["boxes"][i, :k], data["labels"][i, :k], names,
                                                       with_label, f"{prefix}_{int(data['image_ids'][i]):06d}.png"))
    finally:
        for w in writers:
            w.close()
    return paths


def write_synthetic(out_dir: str, train_images: int, val_images: int, image_size: int = 64, seed: int = 0,
                    num_shards: int = 4, num_classes: int = 3, max_objects: int = 3, with_label: bool = True,
                    empty_fraction: float = 0.02) -> dict[str, list[str] | str]:
    """Write train-*/val-* shards and instances_train.json/instances_val.json of the synthetic task to out_dir.

    The images are those `SyntheticSource` builds with the same seed, classes, size and max objects
    (generate(n, split="train"/"val", seed)); train_images counts generated images, empty ones included (the
    reader drops those from training). Returns {"train": paths, "val": paths, "train_json": p, "val_json": p}.
    """
    os.makedirs(out_dir, exist_ok=True)
    out: dict[str, list[str] | str] = {}
    for split, n in (("train", train_images), ("val", val_images)):
        data = synthetic_shapes.generate(n, split=split, seed=seed, image_size=image_size, max_boxes=max_objects,
                                         num_classes=num_classes, empty_fraction=empty_fraction)
        out[split] = write_split(out_dir, split, data, min(num_shards, max(n, 1)), with_label)
        out[f"{split}_json"] = os.path.join(out_dir, f"instances_{split}.json")
        synthetic_shapes.write_coco_json(out[f"{split}_json"], synthetic_shapes.coco_ground_truth(data, split))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--train-images", type=int, default=4096)
    p.add_argument("--val-images", type=int, default=512)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0, help="data.synthetic_seed")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--classes", type=int, default=3)
    p.add_argument("--max-objects", type=int, default=3)
    p.add_argument("--no-label", action="store_true", help="TF Object Detection API variant (class text only)")
    a = p.parse_args(argv)
    out = write_synthetic(a.out, a.train_images, a.val_images, a.image_size, a.seed, a.shards, a.classes,
                          a.max_objects, not a.no_label)
    print(f"wrote {len(out['train'])} train and {len(out['val'])} val shards and {out['val_json']}; use "
          f"data.source=tfrecord data.data_dir={a.out} data.annotation_file={out['val_json']} "
          f"data.eval_samples={a.val_images}")


if __name__ == "__main__":
    main()
