"""The learnable synthetic detection task for smoke runs: coloured shapes on noisy gray backgrounds.

Each class is one shape in one colour family (red rectangle, green ellipse, blue triangle, yellow diamond), with
hue, saturation and brightness jitter; objects are 0.19-0.63 of the image on each side, fully inside it, with
pairwise IoU < 0.2 and at most 40% of either box's area inside the other (IoU alone lets a later
object hide an earlier small one). Category ids are non-contiguous COCO-style ids (1, 5, 9, 13) so that the
harness's id map is exercised. Image b is drawn from its own generator seeded by (seed, split, b): the data is a
pure function of the arguments, and the first m images of a set of n are the set of m.
"""
from __future__ import annotations

import colorsys
import json
import zlib

import numpy as np

from harness.errors import HarnessError

CLASSES = (  # (name, category id, shape, base hue)
    ("red_rectangle", 1, "rectangle", 0.0),
    ("green_ellipse", 5, "ellipse", 1 / 3),
    ("blue_triangle", 9, "triangle", 2 / 3),
    ("yellow_diamond", 13, "diamond", 1 / 6),
)


def category_ids(num_classes: int = 3) -> list[int]:
    """The raw category ids of the first num_classes classes."""
    return [c[1] for c in CLASSES[:num_classes]]


def _inside(shape: str, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Whether the point (p, q), in box-relative [0, 1] coordinates, lies in the shape filling that box."""
    box = (p >= 0) & (p <= 1) & (q >= 0) & (q <= 1)
    if shape == "rectangle":
        return box
    if shape == "ellipse":
        return (p - 0.5) ** 2 + (q - 0.5) ** 2 <= 0.25
    if shape == "triangle":  # apex at the top centre, base along the bottom edge
        return box & (np.abs(p - 0.5) * 2 <= q)
    return np.abs(p - 0.5) + np.abs(q - 0.5) <= 0.5  # diamond


def _overlap_ok(a: np.ndarray, b: np.ndarray, max_iou: float, max_cover: float) -> bool:
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    area_a, area_b = (a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1])
    return inter < max_iou * (area_a + area_b - inter) and inter <= max_cover * min(area_a, area_b)


def _one_image(rng: np.random.Generator, size: int, n_obj: int, num_classes: int, min_size: float, max_size: float,
               max_pair_iou: float, max_cover: float) -> tuple[np.ndarray, list[np.ndarray], list[int]]:
    canvas = np.full((size, size, 3), rng.uniform(60, 190), np.float32)
    boxes, labels = [], []
    for _ in range(n_obj):
        for _try in range(50):
            w, h = rng.uniform(min_size, max_size, 2) * size
            x0, y0 = rng.uniform(0, size - w), rng.uniform(0, size - h)
            box = np.array([x0, y0, x0 + w, y0 + h])
            if all(_overlap_ok(box, b, max_pair_iou, max_cover) for b in boxes):
                break
        else:
            break  # no room left: fewer objects
        name, cat, shape, hue = CLASSES[rng.integers(num_classes)]
        rgb = colorsys.hsv_to_rgb((hue + rng.uniform(-0.03, 0.03)) % 1.0, rng.uniform(0.75, 1.0),
                                  rng.uniform(180, 255))
        c0, c1 = int(np.floor(box[0])), int(np.ceil(box[2]))
        r0, r1 = int(np.floor(box[1])), int(np.ceil(box[3]))
        p = ((np.arange(c0, c1) + 0.5 - box[0]) / w)[None, :]
        q = ((np.arange(r0, r1) + 0.5 - box[1]) / h)[:, None]
        canvas[r0:r1, c0:c1][_inside(shape, p, q)] = rgb
        boxes.append(box)
        labels.append(cat)
    canvas += rng.standard_normal(canvas.shape, dtype=np.float32) * 8.0
    return canvas, boxes, labels


def generate(n: int, split: str = "train", seed: int = 0, image_size: int = 64, max_boxes: int = 3,
             num_classes: int = 3, min_boxes: int = 1, empty_fraction: float = 0.02, min_size: float = 0.19,
             max_size: float = 0.63, max_pair_iou: float = 0.2, max_cover: float = 0.4,
             dtype: str = "uint8") -> dict[str, np.ndarray]:
    """n images of the task, deterministic in (split, seed, image index).

    Each image is empty with probability empty_fraction, else it tries to place U{min_boxes..max_boxes} objects.
    Returns images [n, S, S, 3] (uint8 0..255, or float32 in [0, 1] with dtype="float32"), boxes [n, max_boxes, 4]
    float32 ltrb normalized to [0, 1] (zero rows for padding), labels [n, max_boxes] int32 raw category ids (0 for
    padding), num_boxes [n] int32, image_ids [n] int64 (1..n) and category_ids [num_classes] int32.
    """
    if n < 0 or seed < 0 or image_size < 8 or not 1 <= num_classes <= len(CLASSES) or not 0 <= min_boxes <= max_boxes:
        raise HarnessError(f"synthetic shapes: need n >= 0, seed >= 0, image_size >= 8, "
                           f"1 <= num_classes <= {len(CLASSES)} and 0 <= min_boxes <= max_boxes; got "
                           f"n={n}, seed={seed}, "
                           f"image_size={image_size}, num_classes={num_classes}, boxes {min_boxes}..{max_boxes}")
    if not 0 < min_size <= max_size <= 1 or not 0 <= empty_fraction <= 1 or dtype not in ("uint8", "float32"):
        raise HarnessError("synthetic shapes: need 0 < min_size <= max_size <= 1, 0 <= empty_fraction <= 1 and "
                           f"dtype uint8 or float32; got {min_size}, {max_size}, {empty_fraction}, {dtype}")
    split_key = zlib.crc32(split.encode())
    images = np.empty((n, image_size, image_size, 3), np.uint8 if dtype == "uint8" else np.float32)
    boxes = np.zeros((n, max_boxes, 4), np.float32)
    labels = np.zeros((n, max_boxes), np.int32)
    num = np.zeros(n, np.int32)
    for i in range(n):
        rng = np.random.default_rng([seed, split_key, i])
        n_obj = 0 if rng.random() < empty_fraction else int(rng.integers(min_boxes, max_boxes + 1))
        canvas, bxs, lbs = _one_image(rng, image_size, n_obj, num_classes, min_size, max_size, max_pair_iou,
                                       max_cover)
        canvas = np.clip(np.rint(canvas), 0, 255)
        images[i] = canvas if dtype == "uint8" else canvas / 255.0
        num[i] = len(bxs)
        if bxs:
            boxes[i, :len(bxs)] = np.clip(np.asarray(bxs) / image_size, 0.0, 1.0)
            labels[i, :len(lbs)] = lbs
    return {"images": images, "boxes": boxes, "labels": labels, "num_boxes": num,
            "image_ids": np.arange(1, n + 1, dtype=np.int64),
            "category_ids": np.asarray(category_ids(num_classes), np.int32)}


def coco_ground_truth(data: dict[str, np.ndarray], split: str = "val") -> dict:
    """The `instances_*.json`-style dict of generated data: absolute pixel xywh boxes, area w*h, iscrowd 0."""
    n, height, width = data["images"].shape[:3]
    images, annotations = [], []
    for i in range(n):
        image_id = int(data["image_ids"][i])
        images.append({"id": image_id, "width": int(width), "height": int(height),
                       "file_name": f"{split}_{image_id:06d}.png"})
        for b in range(int(data["num_boxes"][i])):
            l, t, r, btm = (float(v) for v in data["boxes"][i, b].astype(np.float64) * [width, height, width, height])
            annotations.append({"id": len(annotations) + 1, "image_id": image_id,
                                "category_id": int(data["labels"][i, b]), "bbox": [l, t, r - l, btm - t],
                                "area": (r - l) * (btm - t), "iscrowd": 0})
    names = {c[1]: c[0] for c in CLASSES}
    categories = [{"id": int(c), "name": names[int(c)], "supercategory": "shape"} for c in data["category_ids"]]
    return {"info": {"description": f"synthetic shapes, split {split}"}, "images": images,
            "annotations": annotations, "categories": categories}


def write_coco_json(path: str, ground_truth: dict) -> None:
    """Write a `coco_ground_truth` dict as JSON (what `coco_metric.load_ground_truth` reads)."""
    with open(path, "w") as f:
        json.dump(ground_truth, f)
